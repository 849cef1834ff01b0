"""Deephaven's own browser clients -- its JavaScript API (`/jsapi/dh-core.js`) and its stock grid
page (`/iframe/widget/`) -- in headless Chromium, against a real Deephaven server and against
tickwire, held to the same checks (issue 14).

Chromium is driven over the DevTools protocol (tests/browser/cdp.py); the JS API runs in a page of
the server's origin (tests/browser/jsapi.py). Everything a page sees is what Deephaven's unmodified
browser code gets from the server: nothing here is served by the test.

How the grid page's cells are checked: the grid draws on a <canvas>, so before the page loads we
wrap `CanvasRenderingContext2D.prototype.fillText` (Page.addScriptToEvaluateOnNewDocument) to record
every string the page draws, with its time. The page has cells when it has drawn the table's column
names and values that are in a DoGet of the same table; it keeps updating when it draws new strings
later and its screenshots change.

Released on close (tickwire): counted from the server object: live sessions and their exports
(SessionManager.live), Barrage subscriptions (PublisherRegistry.subscriptions) and session-owned
tables (TableOps.owned).
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from .browser.cdp import JsError, Page
from .browser.jsapi import JsApiPage, normalize_arrow, normalize_js
from .interop.dh_server import DH_PSK, deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

ROOT = Path(__file__).resolve().parent.parent
README_SHOT = ROOT / "docs" / "img" / "grid.png"
PSK = DH_PSK
KINDS = ["deephaven", "tickwire"]


def _tickwire_web_missing() -> Optional[str]:
    try:
        ok = importlib.util.find_spec("tickwire.server.web") is not None
    except ImportError:
        ok = False
    return None if ok else "tickwire's web side (tickwire.server.web) is not there yet"


def _skip_unless(kind: str) -> None:
    why = deephaven_server_available() if kind == "deephaven" else _tickwire_web_missing()
    if why:
        pytest.skip(f"{kind}: {why}")


# -- the servers ---------------------------------------------------------------------------------

class PausableTicker:
    """tickwire's demo tables, fed from a thread that can be paused (to compare at rest)."""

    def __init__(self, engine, interval: float = 0.2, rows: int = 5):
        from tickwire.server.adapters.demo import DemoTicker

        self.demo = DemoTicker(engine, rows_per_tick=rows, seed=5)
        self.interval = interval
        self._tick_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="browser-test-ticker", daemon=True)

    def start(self) -> "PausableTicker":
        self.demo.tick()
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            with self._tick_lock:
                self.demo.tick()

    @contextlib.contextmanager
    def paused(self):
        with self._tick_lock:
            self.demo.engine.flush()
            yield

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass
class Served:
    kind: str
    port: int
    psk: Optional[str]
    server: Any  # DhServer | TickwireServer
    ticker: Optional[PausableTicker] = None
    web_port: Optional[int] = None  # where browsers connect, when not `port`

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.web_port or self.port}"

    @property
    def options(self) -> fl.FlightCallOptions:
        auth = b"Anonymous" if self.psk is None else \
            f"io.deephaven.authentication.psk.PskAuthenticationHandler {self.psk}".encode()
        return fl.FlightCallOptions(headers=[(b"authorization", auth)], timeout=30)

    def doget(self, name: str) -> pa.Table:
        client = fl.FlightClient(f"grpc://127.0.0.1:{self.port}")
        try:
            return client.do_get(fl.Ticket(b"s/" + name.encode()), self.options).read_all()
        finally:
            client.close()

    def paused(self):
        """Holds the table still while the block runs (tickwire); a no-op for Deephaven."""
        return self.ticker.paused() if self.ticker is not None else contextlib.nullcontext()

    def alive(self) -> bool:
        return self.server.alive() if self.kind == "deephaven" else True

    def log(self) -> str:
        return ("\nserver log tail:\n" + self.server.log()[-3000:]) if self.kind == "deephaven" else ""


@contextlib.contextmanager
def serve(request, kind: str, psk: Optional[str] = None):
    _skip_unless(kind)
    if kind == "deephaven":  # the run's shared server (tests/conftest.py)
        dh = request.getfixturevalue("deephaven_psk_server" if psk else "deephaven_server")
        yield Served(kind, dh.port, psk, dh)
        return
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=100)
    ticker = PausableTicker(engine)
    server = TickwireServer(engine, port=0, psk=psk).start()
    ticker.start()
    try:
        yield Served(kind, server.port, psk, server, ticker, getattr(server, "web_port", None))
    finally:
        ticker.stop()
        server.stop()
        engine.stop()


@pytest.fixture(scope="module", params=KINDS)
def served(request):
    with serve(request, request.param) as s:
        yield s


@pytest.fixture(scope="module", params=KINDS)
def served_psk(request):
    with serve(request, request.param, psk=PSK) as s:
        yield s


# -- helpers -------------------------------------------------------------------------------------

def rows_set(rows) -> set[tuple]:
    return set(normalize_js(rows))


def converge_with_doget(js: JsApiPage, served: Served, name: str, *, timeout: float = 45.0) -> dict:
    """Waits until the rows the page holds equal a DoGet of `name`, compared as sets of rows.

    The table ticks, so the comparison retries: each round reads a DoGet, then the page's rows,
    then a DoGet again; the page matches when its rows equal one of the recent DoGets (the page
    may be one update behind the server). Returns the page's snapshot."""
    history: list[tuple[float, set]] = []
    end = time.monotonic() + timeout
    last = None
    while True:
        before = time.monotonic()
        history.append((before, set(normalize_arrow(served.doget(name), js.rows()["columns"]))))
        snap = js.rows()
        history.append((time.monotonic(), set(normalize_arrow(served.doget(name), snap["columns"]))))
        history = [(t, s) for t, s in history if t > before - 3.0]  # the last 3 seconds
        got = rows_set(snap["rows"])
        if any(got == s for _t, s in history):
            return snap
        last = (got, history[-1][1])
        if time.monotonic() > end:
            got, want = last
            raise AssertionError(
                f"the page's {len(got)} rows never equalled a DoGet ({len(want)} rows) within {timeout:.0f} s;\n"
                f"only in the page: {sorted(got - want)[:5]}\nonly in DoGet: {sorted(want - got)[:5]}"
                f"{js.page.diagnostics()}{served.log()}")
        time.sleep(0.2)


def open_viewport(page: Page, served: Served, name: str, first: int, last: int, *,
                  psk: Optional[str] = None) -> JsApiPage:
    js = JsApiPage(page, served.origin)
    js.login(psk=psk)
    js.open(name)
    js.viewport(first, last)
    return js


GRID_HOOK = r"""
(() => {
  const g = window.__twGrid = {texts: [], calls: 0};
  const orig = CanvasRenderingContext2D.prototype.fillText;
  CanvasRenderingContext2D.prototype.fillText = function (text, x, y, ...rest) {
    g.calls += 1;
    g.texts.push([performance.now(), String(text)]);
    if (g.texts.length > 20000) g.texts.splice(0, g.texts.length - 20000);
    return orig.call(this, text, x, y, ...rest);
  };
})();
"""


def grid_texts(page: Page, seconds: float = 2.0) -> set[str]:
    """The strings the page drew on canvases in the last `seconds`."""
    return set(page.evaluate(f"(() => {{ const now = performance.now(); return window.__twGrid.texts"
                             f".filter(([t, s]) => now - t < {seconds * 1000}).map(([t, s]) => s); }})()") or [])


def wait_grid_cells(page: Page, served: Served, name: str, *, timeout: float = 60.0) -> set[str]:
    """Waits until the grid canvas shows the table's column names and values that a DoGet of the
    table holds; returns the strings drawn. Every string drawn since the page loaded counts: a grid
    of a table at rest draws once and then stops, so a window of the last seconds may hold none."""
    page.wait_for("document.querySelector('canvas.grid-canvas') !== null && window.__twGrid.calls > 0",
                  timeout=timeout, what="the grid canvas to be drawn")
    table = served.doget(name)
    headers = set(table.column_names)
    end = time.monotonic() + timeout
    while True:
        values = {str(v) for n in table.column_names if pa.types.is_string(table.schema.field(n).type)
                  for v in table.column(n).to_pylist() if v is not None}
        drawn = grid_texts(page, seconds=1e9)
        cells = drawn & values
        if headers <= drawn and len(cells) >= min(5, len(values)):
            return drawn
        if time.monotonic() > end:
            raise AssertionError(f"the grid of {name} has no cells: drew {sorted(drawn)[:40]}, headers {headers}, "
                                 f"string values like {sorted(values)[:10]}{page.diagnostics()}{served.log()}")
        time.sleep(0.5)
        table = served.doget(name)


def server_counts(server) -> dict[str, int]:
    """What a tickwire server holds for clients: sessions, their exports, Barrage subscriptions and
    session-owned tables (the exports counted over the same sessions as the first figure)."""
    sessions = server.sessions.live()
    exports = 0
    for s in sessions:
        with s.lock:
            exports += len(s.exports)
    return {"sessions": len(sessions), "exports": exports, "subscriptions": len(server.registry.subscriptions),
            "owned_tables": server.ctx.ops.owned}


def wait_until(cond: Callable[[], Any], timeout: float, what: str, detail: Callable[[], str] = lambda: ""):
    end = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{detail()}")
        time.sleep(0.1)


# -- a. the JS API's viewport equals a DoGet --------------------------------------------------------

def test_jsapi_viewport_equals_doget(served, page):
    viewport_follows_doget(served, page)


def viewport_follows_doget(served: Served, page: Page) -> None:
    """The JS API's viewport over all of ticking_keyed converges to DoGet, keeps updating, and (on
    a server the test can pause) holds exactly DoGet at rest; the page raised nothing."""
    js = JsApiPage(page, served.origin)
    js.login()
    info = js.open("ticking_keyed")
    size = int(info["size"])
    assert size > 0, info
    js.viewport(0, size + 50)  # every row, with room to spare
    js.wait_rows(lambda s: len(s["rows"]) == s["size"] and s["size"] > 0, what="the whole table in the viewport")
    snap = converge_with_doget(js, served, "ticking_keyed")
    assert snap["offset"] == 0 and len(snap["rows"]) == snap["size"]
    assert snap["columns"] == served.doget("ticking_keyed").column_names
    updates = snap["updates"]
    js.wait_rows(lambda s: s["updates"] > updates + 1, what="more updates of a ticking table")
    if served.ticker is not None:  # at rest, the page must hold exactly the DoGet
        with served.paused():
            want = set(normalize_arrow(served.doget("ticking_keyed"), snap["columns"]))
            js.wait_rows(lambda s: rows_set(s["rows"]) == want, timeout=15, what="the page at rest to equal DoGet")
    assert not page.exceptions(), page.diagnostics()


def test_a_table_uploaded_from_the_page_reads_back(served, page):
    """connection.newTable uploads the page's columns (over the websocket) and opens the
    result, as an app that sends a user's rows does. The JS API sends it through
    BrowserFlightService's OpenDoPut/NextDoPut even over the websocket (a DoPut cut into one call
    per message)."""
    js = JsApiPage(page, served.origin)
    js.login()
    names, types = ["Sym", "Qty", "Px"], ["java.lang.String", "int", "double"]
    columns = [["AAPL", "MSFT", None, "IBM"], [10, -3, 7, None], [101.5, None, 3.25, 0.0]]
    info = js.upload(names, types, columns)
    assert info["size"] == 4 and [c.split(":")[0] for c in info["columns"]] == names, info
    js.viewport(0, 9)
    snap = js.wait_rows(lambda s: s["size"] == 4 and len(s["rows"]) == 4, what="the uploaded rows")
    assert snap["columns"] == names
    assert snap["rows"] == [list(r) for r in zip(*columns)], snap["rows"]
    assert not page.exceptions(), page.diagnostics()


# -- a2. sorting, as the grid sorts, 50 times in a row ----------------------------------------------

def test_fifty_sorts_in_a_row_each_show_sorted_rows(served, page):
    """Each sort of a grid column makes the JS API send a Batch and, some microseconds later, an
    ApplyPreviewColumns on the Batch's result without waiting for its answer: the server must
    wait for that export (as Deephaven does), not answer NOT_FOUND -- which left the grid
    without rows for about half of the sorts."""
    js = JsApiPage(page, served.origin)
    js.login()
    info = js.open("ticking_keyed")
    column = next(c.split(":")[0] for c in info["columns"] if c.endswith(":double"))
    js.viewport(0, 49)
    js.wait_rows(lambda s: len(s["rows"]) > 0, what="the first rows")
    results = []
    for i in range(50):
        ascending = i % 2 == 0
        results.append((ascending, js.sort_viewport(column, ascending, 0, 49, timeout_ms=30000)))
    failed = [(i, r) for i, (_asc, r) in enumerate(results) if r["state"] != "sorted"]
    assert not failed, f"{len(failed)} of 50 sorts failed, the first: {failed[:3]}{page.diagnostics()}{served.log()}"
    for ascending, r in results:
        values = [float("-inf") if v is None else float(v) for v in r["values"]]
        assert values == sorted(values, reverse=not ascending), (ascending, values)
        assert len(values) == min(50, int(r["size"])), (len(values), r["size"])
    assert not page.exceptions(), page.diagnostics()


# -- a3. an operation the server refuses rejects the page's promise -----------------------------------

def test_an_operation_tickwire_does_not_serve_rejects_the_promise_with_its_message(served, page):
    """dh-core.js splits a trailer line on every ':' (and cannot parse '%'): a status message with
    one threw inside the JS API ('Odd number of key-value pairs') and the call's promise never
    settled. The server's messages to browsers are made readable for it, so the promise rejects
    with the message."""
    if served.kind != "tickwire":
        pytest.skip("Deephaven serves trees")
    js = JsApiPage(page, served.origin)
    js.login()
    info = js.open("ticking_keyed")
    column = next(c.split(":")[0] for c in info["columns"] if c.endswith(":java.lang.String"))
    cases = {  # what the page asks -> what the rejection's message must mention
        f"window.__tw.table.treeTable({{idColumn: {column!r}, parentColumn: {column!r}}})": "Tree",
    }
    for ask, mention in cases.items():
        out = js.settle(ask, timeout_ms=60000)  # a generous bound: an answer takes milliseconds
        assert out["state"] == "rejected" and mention in out["message"], (ask, out, page.diagnostics())
        text = out["message"].removeprefix("Error: ")  # (how the JS API words a failed call)
        assert ":" not in text and "%" not in text, out
    assert not any("Odd number of key-value pairs" in e for e in page.exceptions()), page.diagnostics()


# -- b. the stock grid page renders and keeps updating ---------------------------------------------

def test_grid_page_renders_and_updates(served, page, tmp_path):
    second = grid_renders_and_updates(served, page, tmp_path, served.kind)
    # the README's picture: tickwire's grid, written when missing or asked for (not on every run, so
    # that running the tests leaves the work tree clean)
    if served.kind == "tickwire" and (not README_SHOT.exists() or os.environ.get("TICKWIRE_UPDATE_SCREENSHOT")):
        README_SHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(second, README_SHOT)
    assert not page.exceptions(), page.diagnostics()


def grid_renders_and_updates(served: Served, page: Page, tmp_path: Path, label: str) -> Path:
    """Deephaven's grid page on ticking_sorted draws the table's cells, then draws again with new
    values (its screenshots change); returns the second screenshot (tmp_path/grid-LABEL-2.png)."""
    page.set_viewport(720, 440)  # about 20 rows: the README's picture without a sea of empty grid
    page.add_init_script(GRID_HOOK)
    page.navigate(f"{served.origin}/iframe/widget/?name=ticking_sorted")
    wait_grid_cells(page, served, "ticking_sorted")
    time.sleep(1.0)  # fonts and the first updates settle
    # the count is read before the picture: a frame drawn just before the first screenshot may be
    # presented only after it, so a changed picture alone does not prove the page drew again
    calls = page.evaluate("window.__twGrid.calls")
    first = page.screenshot(tmp_path / f"grid-{label}-1.png")
    drawn_before = grid_texts(page, 1.5)

    def changed():
        png = page.screenshot()
        redrawn = page.evaluate("window.__twGrid.calls") > calls
        return png if redrawn and hashlib.sha256(png).digest() != hashlib.sha256(first).digest() else None

    second = wait_until(changed, 20, "the grid to draw again and its screenshot to change (a ticking table)",
                        page.diagnostics)
    shot = tmp_path / f"grid-{label}-2.png"
    shot.write_bytes(second)
    wait_until(lambda: grid_texts(page, 1.5) - drawn_before, 20, "new values drawn on the grid", page.diagnostics)
    return shot


# -- c. closing the page releases everything --------------------------------------------------------

@pytest.mark.parametrize("what", ["jsapi", "grid"])
def test_closing_the_page_releases_everything(served, browser, what):
    if served.kind != "tickwire":
        pytest.skip("server-side export and subscription counts are only read from tickwire")
    server = served.server
    grace = float(getattr(getattr(server, "web", None), "session_grace_s", 10.0))
    held_keys = ("exports", "subscriptions", "owned_tables")  # sessions: every anonymous DoGet makes one
    # earlier tests' pages are closed, but their sessions may still be in their grace: start from nothing
    wait_until(lambda: not any(server_counts(server)[k] for k in held_keys), grace + 15,
               "the pages of earlier tests to be released", lambda: f": {server_counts(server)}")
    base = server_counts(server)
    page = browser.new_page()
    try:
        if what == "jsapi":
            js = open_viewport(page, served, "ticking_keyed", 0, 9)
            js.wait_rows(lambda s: len(s["rows"]) > 0)
        else:
            page.add_init_script(GRID_HOOK)
            page.navigate(f"{served.origin}/iframe/widget/?name=ticking_sorted")
            wait_grid_cells(page, served, "ticking_sorted")
        held = server_counts(server)
        assert held["exports"] > base["exports"] and held["subscriptions"] > base["subscriptions"], (base, held)
        heard = server.web.stats["sockets_closed"]
        gone = time.monotonic()
        page.navigate("about:blank")  # the page goes: its websocket closes
        detail = lambda: (f": before {base}, open {held}, now {server_counts(server)}; web side "  # noqa: E731
                          f"{server.web.stats}, {server.web.open_sockets} socket(s) open")
        # first the server hears the socket's close (when is up to Chromium; a server that never
        # hears it fails here, not below), then subscriptions end with the socket; exports go with
        # the page's sessions, which the web side keeps for a short grace (a page that reconnects
        # with its token keeps them), then ends
        wait_until(lambda: server.web.stats["sockets_closed"] > heard, 30,
                   "the server to hear the page's websocket close", detail)
        wait_until(lambda: server_counts(server)["subscriptions"] == base["subscriptions"], 30,
                   "the page's subscriptions to end with its websocket", detail)
        ended = time.monotonic() - gone
        # the socket closed after `gone`, so subscriptions that waited for its sessions' lease would
        # end no earlier than `gone + grace`
        assert ended < grace, f"subscriptions ended {ended:.1f} s after the page went, not before the " \
                              f"{grace:.0f} s session grace: they ended with the sessions, not the socket"
        wait_until(lambda: all(server_counts(server)[k] == base[k] for k in held_keys), grace + 15,
                   f"the server to release the page's exports ({grace:.0f} s grace for its sessions)", detail)
    finally:
        page.close()


# -- d. a viewport on a 10,000,000-row table --------------------------------------------------------

BIG_ROWS = 10_000_000
BIG = pa.schema([("Id", pa.int64()), ("Val", pa.float64()), ("Ver", pa.int64())])


def _doexchange_sids(frames) -> list[int]:
    return [f.stream_id for f in frames if f.direction == "sent" and b"FlightService/DoExchange" in f.head]


def test_big_table_viewport_moves_only_changes(served, page):
    if served.kind != "tickwire":
        pytest.skip("the 10,000,000-row table is built in tickwire's engine")
    from tickwire.server.engine import TableSpec

    engine = served.server.engine
    table, _ = engine.get_or_create(TableSpec("big_keyed", "keyed", BIG, keys=("Id",)))
    if len(table.rowset) < BIG_ROWS:
        ids = np.arange(BIG_ROWS, dtype=np.int64)
        engine.write(table, pa.table({"Id": ids, "Val": ids * 0.5, "Ver": np.zeros(BIG_ROWS, np.int64)}, schema=BIG),
                     timeout=300)
    assert len(table.rowset) == BIG_ROWS
    stop = threading.Event()
    snapshot_read = threading.Event()  # ticks start once the snapshot's bytes are counted
    rng = np.random.default_rng(1)

    def tick():  # a few rows a cycle: one in each viewport the test uses, two anywhere
        ver = 0
        snapshot_read.wait(120)
        while not stop.wait(0.2):
            ver += 1
            ids = np.array([rng.integers(1000, 1061), rng.integers(2000, 2061), *rng.integers(0, BIG_ROWS, 2)],
                           dtype=np.int64)
            ids = np.unique(ids)
            engine.write(table, pa.table({"Id": ids, "Val": ids * 0.5 + ver, "Ver": np.full(len(ids), ver, np.int64)},
                                         schema=BIG), wait=False)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        js = open_viewport(page, served, "big_keyed", 1000, 1060)
        snap = js.wait_rows(lambda s: s["offset"] == 1000 and len(s["rows"]) == 61, timeout=60,
                            what="rows 1000..1060")
        assert snap["size"] == BIG_ROWS
        idx = snap["columns"].index("Id")
        assert [int(r[idx]) for r in snap["rows"]] == list(range(1000, 1061))
        sids = _doexchange_sids(page.ws_frames())
        assert len(sids) == 1, f"one DoExchange expected, saw streams {sids}"
        sid = sids[0]
        # nothing has ticked yet, so every frame the stream received so far is its opening (headers,
        # schema, snapshot): a page that takes long to report its rows adds no update bytes here
        snapshot_bytes = sum(f.length for f in page.ws_frames() if f.direction == "recv" and f.stream_id == sid)
        assert snapshot_bytes < 64 * 1024, f"{snapshot_bytes} B for a 61-row viewport of a 10M-row table"
        snapshot_read.set()

        # updates: only changed rows travel
        t0, u0 = time.monotonic(), js.rows()["updates"]
        wait_until(lambda: js.rows()["updates"] >= u0 + 3, 30, "three updates of the ticking viewport",
                   page.diagnostics)
        u1 = js.rows()["updates"]
        recv = [f for f in page.ws_frames(t0) if f.direction == "recv" and f.stream_id == sid]
        updates = u1 - u0
        span = time.monotonic() - t0
        total = sum(f.length for f in recv)
        per_update = total / updates
        biggest = max((f.length for f in recv), default=0)
        assert per_update < 64 * 1024 and biggest < 64 * 1024, (per_update, biggest, len(recv))

        # scrolling: a new request on the same DoExchange, rows 2000..2060
        t1 = time.monotonic()
        js.viewport(2000, 2060)
        snap = js.wait_rows(lambda s: s["offset"] == 2000 and len(s["rows"]) == 61
                            and [int(r[idx]) for r in s["rows"]] == list(range(2000, 2061)),
                            timeout=30, what="rows 2000..2060 after scrolling")
        frames = page.ws_frames(t1)
        assert not _doexchange_sids(frames), "scrolling opened a new DoExchange"
        sent = [f for f in frames if f.direction == "sent" and f.stream_id == sid and not f.closes]
        assert sent, "scrolling sent no request on the DoExchange stream"
        moved = [f for f in frames if f.direction == "recv" and f.stream_id == sid]
        assert moved and max(f.length for f in moved) < 64 * 1024
        print(f"\n10M-row viewport: snapshot {snapshot_bytes} B, {updates} updates in {span:.1f} s, "
              f"{per_update:.0f} B/update on the socket, "
              f"largest message {biggest} B; scrolling: {len(sent)} request message(s) on stream {sid}")
        js.call("window.__tw.closeTable()")
    finally:
        stop.set()
        snapshot_read.set()
        ticker.join(5)


# -- e. pre-shared key --------------------------------------------------------------------------------

def test_psk_refuses_anonymous_and_takes_the_key(served_psk, browser):
    page = browser.new_page()
    try:
        js = JsApiPage(page, served_psk.origin)
        with pytest.raises(JsError):
            js.login(timeout_ms=20000)
        assert js.rows()["state"] == "login-failed"
    finally:
        page.close()

    page = browser.new_page()
    try:
        js = open_viewport(page, served_psk, "ticking_keyed", 0, 99, psk=PSK)
        js.wait_rows(lambda s: len(s["rows"]) == s["size"] and s["size"] > 0)
        converge_with_doget(js, served_psk, "ticking_keyed")
    finally:
        page.close()

    page = browser.new_page()  # the grid page takes the key from its URL (its PSK login plugin)
    try:
        page.add_init_script(GRID_HOOK)
        page.navigate(f"{served_psk.origin}/iframe/widget/?name=ticking_sorted&psk={PSK}")
        wait_grid_cells(page, served_psk, "ticking_sorted")
    finally:
        page.close()
