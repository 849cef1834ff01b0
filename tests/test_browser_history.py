"""Deephaven's JS API and grid page in a browser on a history-plus-live table: a viewport in the
middle of the Parquet history shows the rows a DoGet holds there, a viewport at the end follows the
rows written afterwards, and the grid page draws the table."""
from __future__ import annotations

import time

import pyarrow as pa
import pytest

from .browser.jsapi import JsApiPage, normalize_arrow, normalize_js
from .test_browser import GRID_HOOK, Served, _skip_unless, wait_grid_cells
from .test_history import day, write_dataset


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    _skip_unless("tickwire")
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    root = str(tmp_path_factory.mktemp("history") / "trades")
    write_dataset(root)
    engine = Engine(interval_ms=50)
    table = engine.history("trades", root)
    server = TickwireServer(engine, port=0).start()
    try:
        yield Served("tickwire", server.port, None, server, None, getattr(server, "web_port", None)), engine, table
    finally:
        server.stop()
        engine.stop()


def test_jsapi_viewports_of_history_and_of_the_live_tail(served, page):
    srv, engine, table = served
    js = JsApiPage(page, srv.origin)
    js.login()
    info = js.open("trades")
    assert int(info["size"]) == table.size
    js.viewport(1490, 1519)  # in the middle of the history, across no location boundary
    whole = srv.doget("trades")
    want = normalize_arrow(whole.slice(1490, 30))
    snap = js.wait_rows(lambda s: normalize_js(s["rows"]) == want, what="rows 1490..1519 as DoGet has them")
    assert snap["offset"] == 1490 and snap["columns"] == whole.column_names
    js.viewport(table.size - 5, table.size + 20)  # the end: the live tail comes in here
    for i in range(3):
        engine.write(table, day(3).slice(10 * i, 10).append_column("Date", pa.array(["2026-11-21"] * 10)))
        time.sleep(0.1)
    js.wait_rows(lambda s: s["size"] == 3030 and len(s["rows"]) == 26, what="the 30 written rows at the end")
    tail = srv.doget("trades").slice(2995, 35)
    js.wait_rows(lambda s: normalize_js(s["rows"]) == normalize_arrow(tail.slice(0, 26)),
                 what="the viewport at the end as DoGet has it")
    assert not page.exceptions(), page.diagnostics()


def test_grid_page_draws_a_history_table(served, page):
    srv, _engine, _table = served
    page.set_viewport(720, 440)
    page.add_init_script(GRID_HOOK)
    page.navigate(f"{srv.origin}/iframe/widget/?name=trades")
    drawn = wait_grid_cells(page, srv, "trades")
    assert {"Date", "Sym", "Px", "Qty"} <= drawn and "2026-11-18" in drawn
    assert not page.exceptions(), page.diagnostics()
