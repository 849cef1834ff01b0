"""What Deephaven's grid does from its menus -- totals rows (the Aggregations sidebar), Select
Distinct Values, the CSV download's frozen snapshot, Go to row, column statistics, the text quick
filters, rollup rows -- through Deephaven's own JavaScript API in headless Chromium, against a real
Deephaven 42.7 and against tickwire, which must answer the same.

The same rows are in both servers: a static table (`grid_menu`, from one Arrow table: a pydeephaven
upload bound to a global name in Deephaven, a static table in tickwire) and a ticking one
(`grid_menu_ticking`: Seq = 0, 1, 2, ... and Qty = Seq % 7, appended as time goes by) whose
totals can be checked against the formulas they must equal at every update. Each test runs the
same JavaScript (tests/browser/grid_menu.py) in a page of each server and compares what the pages
got, values and column types included; a rejected promise comes back as {error: message}, so a
refusal shows up in the comparison with its message. One Deephaven server serves the run
(tests/conftest.py)."""
from __future__ import annotations

import contextlib
import importlib.util
import math
import threading
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

from .browser.grid_menu import GridMenu
from .browser.jsapi import JsApiPage
from .interop.dh_server import deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

NAME = "grid_menu"
TICKING = "grid_menu_ticking"
KINDS = ("deephaven", "tickwire")

ROWS = [  # Grp, Sym, Qty, Px, Big: repeated groups and symbols in several cases, nulls in every column
    ("tech", "AAPL", 10, 1.5, 5),
    ("tech", "msft", None, 2.25, 6),
    ("tech", "Goog", -3, None, 7),
    ("food", None, 7, -3.0, None),
    ("tech", "aapl", 5, 4.0, 9),
    ("tech", "IBM", 100, 0.5, 10),
    ("tech", "MSFT", 2, 10.0, 11),
    ("tech", "goog", 8, 2.0, 12),
    ("food", "Apple pie", 1, 7.25, 13),
    (None, "x", 0, 1.0, 14),
    ("food", "Pear", 4, 0.75, 15),
    ("food", "Apple pie", 3, 1.25, 16),
    ("tech", "AAPL", 6, 3.5, 17),
    ("energy", "XOM", None, None, 18),
    ("tech", "MSFT", 9, 9.5, -1),
    ("food", "apple PIE", 2, 0.25, 19),
]
DATA = pa.table({
    "Grp": pa.array([r[0] for r in ROWS], pa.string()),
    "Sym": pa.array([r[1] for r in ROWS], pa.string()),
    "Qty": pa.array([r[2] for r in ROWS], pa.int32()),
    "Px": pa.array([r[3] for r in ROWS], pa.float64()),
    "Big": pa.array([r[4] for r in ROWS], pa.int64()),
})
TICKING_SCHEMA = pa.schema([("Seq", pa.int64()), ("Qty", pa.int32())])
DH_TICKING = f"""
from deephaven import time_table
{TICKING} = time_table("PT0.05S").update(["Seq = ii", "Qty = (int) (ii % 7)"]).drop_columns(["Timestamp"])
"""


def _why_not() -> str | None:
    why = deephaven_server_available()
    if why:
        return why
    if importlib.util.find_spec("pydeephaven") is None:
        return "pydeephaven is not installed"
    try:
        if importlib.util.find_spec("tickwire.server.web") is None:
            return "tickwire's web side is not there"
    except ImportError:
        return "tickwire's web side is not there"
    return None


_WHY_NOT = _why_not()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)


# -- the servers -----------------------------------------------------------------------------------

class Appender:
    """Appends Seq = 0, 1, 2, ... (and Qty = Seq % 7) to a tickwire table, a few rows every 50 ms,
    as Deephaven's time table of the same columns grows."""

    def __init__(self, engine, table):
        self.engine, self.table, self.seq = engine, table, 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, name="grid-menu-appender", daemon=True)

    def _rows(self, n: int) -> pa.Table:
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        return pa.table({"Seq": seq, "Qty": (seq % 7).astype(np.int32)}, schema=TICKING_SCHEMA)

    def start(self) -> "Appender":
        self.engine.write(self.table, self._rows(5))
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop_event.wait(0.05):
            self.engine.write(self.table, self._rows(3), wait=False)

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(5)


@contextlib.contextmanager
def tickwire_server() -> Iterator[str]:
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=50)
    engine.create(TableSpec(NAME, "static", data=DATA))
    ticking = engine.create(TableSpec(TICKING, "append", TICKING_SCHEMA))
    server = TickwireServer(engine, port=0).start()
    appender = Appender(engine, ticking).start()
    try:
        yield f"http://127.0.0.1:{getattr(server, 'web_port', None) or server.port}"
    finally:
        appender.stop()
        server.stop()
        engine.stop()


@contextlib.contextmanager
def deephaven_tables(dh) -> Iterator[str]:
    from pydeephaven import Session

    session = Session(host="127.0.0.1", port=dh.port)
    try:
        session.bind_table(NAME, session.import_table(DATA))
        with dh.tables(DH_TICKING):
            yield f"http://127.0.0.1:{dh.port}"
    finally:
        dh.forget([NAME])
        with contextlib.suppress(Exception):  # closing whatever the server did meanwhile
            session.close()


@pytest.fixture(scope="module")
def origins(deephaven_server) -> Iterator[dict[str, str]]:
    with deephaven_tables(deephaven_server) as dh_origin, tickwire_server() as tw_origin:
        yield {"deephaven": dh_origin, "tickwire": tw_origin}


@pytest.fixture()
def menus(origins, browser) -> Iterator[dict[str, GridMenu]]:
    """A logged-in page of each server with the grid's menu calls installed."""
    pages = []
    try:
        out = {}
        for kind in KINDS:
            page = browser.new_page()
            pages.append(page)
            js = JsApiPage(page, origins[kind])
            js.login()
            out[kind] = GridMenu(js)
        yield out
    finally:
        for page in pages:
            page.close()


# -- comparing ---------------------------------------------------------------------------------------

def same_value(a: Any, b: Any) -> bool:
    """Equal, floats within a relative 1e-12 (an average may be summed in another order)."""
    if isinstance(a, float) or isinstance(b, float):
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
        if not numbers:
            return False
        return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    return a == b


def compare(menus: dict[str, GridMenu], call) -> Any:
    """Runs `call(menu)` in both pages; Deephaven's answer (which must not be an error) must be
    tickwire's. Returns it."""
    dh, tw = call(menus["deephaven"]), call(menus["tickwire"])
    assert not (isinstance(dh, dict) and "error" in dh), f"Deephaven answered with an error: {dh}"
    assert same_value(dh, tw), f"tickwire answered differently from Deephaven:\n  deephaven: {dh}\n  tickwire:  {tw}"
    no_page_errors(menus)
    return dh


def no_page_errors(menus: dict[str, GridMenu]) -> None:
    """Neither page threw outside the promises it was given (the JS API's own failures)."""
    for kind, menu in menus.items():
        assert not menu.js.page.exceptions(), f"{kind}: {menu.js.page.diagnostics()}"


# -- totals rows (the Aggregations sidebar) -----------------------------------------------------------

TOTALS_CONFIGS = {
    "every operation": {"defaultOperation": "Skip", "operationMap": {
        "Qty": ["Sum", "Avg", "Min", "Max", "Count"], "Px": ["Sum", "Avg", "Min", "Max", "Count"],
        "Big": ["Sum", "Avg", "Min", "Max"]}},
    "one each": {"defaultOperation": "Skip", "operationMap": {"Qty": ["Sum"], "Px": ["Avg"], "Big": ["Max"]}},
    "default Sum": {},
    "default Max, Count on text": {"defaultOperation": "Max", "operationMap": {"Sym": ["Count"], "Px": ["Min"]}},
    "group by Grp": {"defaultOperation": "Skip", "operationMap": {"Qty": ["Sum", "Count"], "Px": ["Avg", "Max"]},
                     "groupBy": ["Grp"]},
    "group by Grp and Sym": {"defaultOperation": "Sum", "groupBy": ["Grp", "Sym"]},
}


@pytest.mark.parametrize("config", TOTALS_CONFIGS.values(), ids=TOTALS_CONFIGS.keys())
def test_totals_table(menus, config):
    out = compare(menus, lambda m: m.totals(NAME, config))
    totals = out["totals"]
    if not config.get("groupBy"):
        assert totals["size"] == 1 and len(totals["rows"]) == 1, totals
    if config == TOTALS_CONFIGS["every operation"]:  # the values themselves, besides agreeing
        row = dict(zip([c.split(":")[0] for c in totals["columns"]], totals["rows"][0]))
        qty = [r[2] for r in ROWS if r[2] is not None]
        px = [r[3] for r in ROWS if r[3] is not None]
        assert int(row["Qty__Sum"]) == sum(qty) and row["Qty__Min"] == min(qty) and row["Qty__Max"] == max(qty)
        assert math.isclose(row["Qty__Avg"], sum(qty) / len(qty)) and math.isclose(row["Px__Sum"], sum(px))
        assert int(row["Qty__Count"]) == len(ROWS)  # Count counts rows, nulls included


def test_totals_and_grand_totals_of_a_filtered_table(menus):
    """The grid shows the totals of the filtered rows and, when a filter is on, the grand totals
    of all of them."""
    config = {"defaultOperation": "Skip", "operationMap": {"Qty": ["Sum", "Count"], "Px": ["Max"]}}
    tech = "(t, F) => [t.findColumn('Grp').filter().eq(F.ofString('tech'))]"
    out = compare(menus, lambda m: m.totals(NAME, config, tech))
    assert out["totals"]["rows"] != out["grand"]["rows"], out


def test_totals_of_a_ticking_table_follow_it(menus):
    """Every update of a totals table of a ticking table is the totals of one state of it: with
    Seq = 0..n-1 and Qty = Seq % 7, Count = n, Sum(Seq) = n(n-1)/2, Min 0, Max n-1 and Sum(Qty) the
    sum of the first n values of Seq % 7, in both servers."""
    config = {"defaultOperation": "Skip", "operationMap": {"Seq": ["Sum", "Min", "Max", "Count"], "Qty": ["Sum"]}}
    answers = {kind: menu.ticking_totals(TICKING, config, 4) for kind, menu in menus.items()}
    assert "error" not in answers["deephaven"], answers["deephaven"]
    assert answers["tickwire"].get("columns") == answers["deephaven"]["columns"], answers
    for kind, out in answers.items():
        names = [c.split(":")[0] for c in out["columns"]]
        counts = []
        for rows in out["updates"]:
            assert len(rows) == 1, (kind, rows)
            row = dict(zip(names, rows[0]))
            n = int(row["Seq__Count"])
            counts.append(n)
            assert n > 0, (kind, row)
            qty = 21 * (n // 7) + sum(range(n % 7))  # 0 + 1 + ... + 6 = 21 for every full 7
            assert (int(row["Seq__Sum"]), int(row["Seq__Min"]), int(row["Seq__Max"]), int(row["Qty"])) == \
                (n * (n - 1) // 2, 0, n - 1, qty), (kind, row)
        assert counts == sorted(counts) and len(set(counts)) == len(counts), (kind, counts)
    no_page_errors(menus)


# -- Select Distinct Values ------------------------------------------------------------------------

@pytest.mark.parametrize("columns", [["Sym"], ["Grp"], ["Qty"], ["Grp", "Sym"]], ids=lambda c: "+".join(c))
def test_select_distinct(menus, columns):
    out = compare(menus, lambda m: m.distinct(NAME, columns))
    want = list(dict.fromkeys(tuple(r[i] for i in [list(DATA.column_names).index(c) for c in columns]) for r in ROWS))
    assert [tuple(r) for r in out["rows"]] == want, out


# -- the CSV download: a frozen snapshot ------------------------------------------------------------

def test_freeze_as_the_csv_download_does(menus):
    """The download freezes the grid's table as sorted and filtered, then snapshots every row of
    the frozen table through a viewport subscription."""
    sort = "(t) => [t.findColumn('Px').sort().desc()]"
    filters = "(t, F) => [t.findColumn('Qty').filter().greaterThan(F.ofNumber(0))]"
    out = compare(menus, lambda m: m.freeze_as_csv(NAME, sort, filters))
    px = [r[3] for r in ROWS if r[2] is not None and r[2] > 0]
    assert out["size"] == len(px) and len(out["rows"]) == len(px), out
    got = [r[3] for r in out["rows"]]
    assert got == sorted(px, key=lambda v: (v is not None, v), reverse=True), got


def test_a_frozen_ticking_table_stays_as_frozen(menus):
    for kind, menu in menus.items():
        out = menu.frozen_while_ticking(TICKING)
        assert "error" not in out, (kind, out)
        first, again = out["first"], out["again"]
        assert first == again and out["sourceSize"] > first["size"], (kind, out)
        n = first["size"]
        assert first["rows"] == [[str(i), i % 7] for i in range(n)], (kind, first["rows"][:10])
    no_page_errors(menus)


# -- Go to row -------------------------------------------------------------------------------------

SEEKS = [  # start, column, value type, value, insensitive, contains, backwards
    [0, "Sym", "STRING", "aapl", False, False, False],
    [0, "Sym", "STRING", "aapl", True, False, False],
    [4, "Sym", "STRING", "aapl", True, False, False],
    [12, "Sym", "STRING", "aapl", True, False, False],  # wraps around to the top
    [5, "Sym", "STRING", "aapl", True, False, True],
    [0, "Sym", "STRING", "aapl", True, False, True],  # backwards from the top wraps to the bottom
    [0, "Sym", "STRING", "pie", False, True, False],
    [0, "Sym", "STRING", "PIE", False, True, False],
    [0, "Sym", "STRING", "PIE", True, True, False],
    [15, "Sym", "STRING", "Pi", True, True, True],
    [0, "Sym", "STRING", "zzz", True, True, False],
    [0, "Grp", "STRING", "FOOD", True, False, False],
    [0, "Qty", "NUMBER", 100, False, False, False],
    [0, "Qty", "NUMBER", 4, False, False, True],
    [0, "Px", "NUMBER", 2, False, False, False],
    [0, "Px", "NUMBER", 9.5, False, False, False],
    [0, "Big", "LONG", "12", False, False, False],
    [3, "Big", "LONG", "-1", False, False, True],
]


def test_seek_row(menus):
    out = compare(menus, lambda m: m.seek(NAME, SEEKS))
    assert out[0] == 4 and out[-1] == 14, out  # exact case: row 4 ('aapl'); backwards from 3 wraps to row 14


# -- column statistics ------------------------------------------------------------------------------

@pytest.mark.parametrize("column", ["Qty", "Px", "Big", "Sym", "Grp"])
def test_column_statistics(menus, column):
    out = compare(menus, lambda m: m.stats(NAME, column))
    non_null = [r[list(DATA.column_names).index(column)] for r in ROWS]
    non_null = [v for v in non_null if v is not None]
    assert int(out["stats"]["COUNT"]) == len(non_null) and int(out["stats"]["SIZE"]) == len(ROWS), out
    if column in ("Sym", "Grp"):
        assert out["unique"] == {v: non_null.count(v) for v in set(non_null)}, out


# -- the text quick filters ---------------------------------------------------------------------------

def _grid_matches(regex: str) -> str:
    """The grid's `~abc` / `abc*` / `*abc` quick filter: not null and matches(regex), case folded."""
    return ("(c, F) => c.filter().isNull().not().and(c.filter().invoke('matches', F.ofString("
            + repr(regex) + ")))")


QUICK_FILTERS = {
    "containsIgnoreCase": "(c, F) => c.filter().containsIgnoreCase(F.ofString('aPp'))",
    "contains": "(c, F) => c.filter().contains(F.ofString('pie'))",
    "grid ~ap (contains)": _grid_matches(r"(?s)(?i).*\Qap\E.*"),
    "grid g* (starts with)": _grid_matches(r"(?s)(?i)^\Qg\E.*"),
    "grid *pie (ends with)": _grid_matches(r"(?s)(?i).*\Qpie\E$"),
    "grid ~a.p (dot taken literally)": _grid_matches(r"(?s)(?i).*\Qa.p\E.*"),
    "grid !~ap (does not contain)": ("(c, F) => c.filter().isNull().or(c.filter().invoke('matches', "
                                     "F.ofString('(?s)(?i).*\\\\Qap\\\\E.*')).not())"),
    "grid =goog (equals, any case)": "(c, F) => c.filter().eqIgnoreCase(F.ofString('goog'))",
    "grid !=goog": "(c, F) => c.filter().notEqIgnoreCase(F.ofString('goog'))",
    "grid null": "(c, F) => c.filter().isNull()",
    "matches": "(c, F) => c.filter().matches(F.ofString('(?i)apple.*'))",
    "matchesIgnoreCase": "(c, F) => c.filter().matchesIgnoreCase(F.ofString('goo.'))",
    "in": "(c, F) => c.filter().in([F.ofString('msft'), F.ofString('IBM')])",
    "inIgnoreCase": "(c, F) => c.filter().inIgnoreCase([F.ofString('msft'), F.ofString('ibm'), F.ofString('nope')])",
    "notInIgnoreCase": "(c, F) => c.filter().notInIgnoreCase([F.ofString('msft'), F.ofString('AAPL')])",
}


@pytest.mark.parametrize("make", QUICK_FILTERS.values(), ids=QUICK_FILTERS.keys())
def test_text_quick_filter(menus, make):
    out = compare(menus, lambda m: m.filtered(NAME, "Sym", make))
    assert out["size"] == len(out["rows"]), out


def test_quick_filter_rows_are_the_ones_expected(menus):
    """Besides agreeing, the grid's `~ap` keeps exactly the symbols holding 'ap' in any case."""
    out = compare(menus, lambda m: m.filtered(NAME, "Sym", QUICK_FILTERS["grid ~ap (contains)"]))
    assert [r[1] for r in out["rows"]] == [r[1] for r in ROWS if r[1] is not None and "ap" in r[1].lower()]


# -- rollup rows ---------------------------------------------------------------------------------------

ROLLUP = {"groupingColumns": ["Grp", "Sym"], "aggregations": {"Sum": ["Qty", "Px"]}}


@pytest.mark.parametrize("constituents", [False, True], ids=["plain", "with constituents (the grid's default)"])
def test_rollup_with_a_sum_expanded_one_level(menus, constituents):
    """table.rollup with a Sum, then expand the 'food' group as a click on its row does (the grid's
    Rollup Rows asks with includeConstituents on unless its Constituents box is cleared). tickwire
    must serve HierarchicalTableService's Rollup (and the tree's viewport) for this to pass; until
    it does, the comparison fails showing tickwire's refusal."""
    config = dict(ROLLUP, includeConstituents=constituents)
    out = compare(menus, lambda m: m.rollup(NAME, config, "Grp", "food"))
    names = [c.split(":")[0] for c in out["columns"]]
    food = [r for r in ROWS if r[0] == "food"]
    root = out["rows"][0]
    assert root[0] == 1 and root[1] and root[2], root  # the root: depth 1, expanded
    grp = next(r for r in out["expandedRows"] if r[0] == 2 and r[3 + names.index("Grp")] == "food")
    assert int(grp[3 + names.index("Qty")]) == sum(r[2] for r in food if r[2] is not None), grp
    children = [r for r in out["expandedRows"] if r[0] == 3]
    assert sorted((r[3 + names.index("Sym")] or "") for r in children) == \
        sorted({(r[1] or "") for r in food}), children
