"""Deephaven clients asking tickwire for derived tables (TableService Sort, Filter,
UnstructuredFilter, View, Select, Update, Head, Tail and their Batch form).

pydeephaven's `open_table(...).sort(...).where(...)` must give what the same operation gives on
the source; the exports are live tables that pydeephaven-ticking can subscribe to (a sorted
ticking table delivers shifts); unsupported operations are UNIMPLEMENTED with their name; bad
filters are INVALID_ARGUMENT with the reason; releasing exports removes the derived tables.

pydeephaven and pydeephaven-ticking talk to a server on a socket; the TableService's own answers
are checked in process (tests.harness.Services)."""
from __future__ import annotations

import re

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.harness import Services, until
from tickwire.protocol.proto import table_pb2
from tickwire.protocol.proto.methods import TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.perf_tables import NAMES as PERF_TABLES

SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int32()), ("Venue", pa.string())])


def user_tables(engine) -> set[str]:
    """The engine's tables (a session's hidden ones too) less the server's own performance tables."""
    return {t.name for t in engine.tables(hidden=True)} - set(PERF_TABLES)


def _rows(rng, syms) -> pa.Table:
    n = len(syms)
    return pa.table({"Sym": syms, "Price": np.round(rng.uniform(90, 110, n), 2),
                     "Size": rng.integers(1, 1000, n).astype(np.int32),
                     "Venue": np.array(["X", "Y", "Z"], dtype=object)[rng.integers(0, 3, n)]}, schema=SCHEMA)


def _quotes(engine, rng):
    keyed = engine.create(TableSpec("quotes", "keyed", SCHEMA, keys=["Sym"]))
    engine.write(keyed, _rows(rng, [f"S{i:02d}" for i in range(60)]), wait=False)
    engine.run_cycle()
    return keyed


@pytest.fixture
def served():
    """A server on a socket for Deephaven's Python clients; its engine cycles when the test runs one."""
    rng = np.random.default_rng(4)
    engine = Engine(interval_ms=20)
    keyed = _quotes(engine, rng)
    server = TickwireServer(engine, port=0, start_engine=False).start()
    yield engine, keyed, server, rng
    server.stop()


@pytest.fixture
def svc():
    """The services in process over an engine stepped by the test."""
    with Services() as s:
        _quotes(s.engine, np.random.default_rng(4))
        yield s


def _plain(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays(t.columns, names=t.column_names)


def _source(engine) -> pa.Table:
    return _plain(engine.snapshot(engine.resolve("quotes"))[1])


def test_pydeephaven_sort_where_head_view_equal_the_same_operations_on_the_source(served):
    from pydeephaven import Session

    engine, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    try:
        src = _source(engine)
        got = _plain(s.open_table("quotes").sort(["Price"]).where(["Price > 100", "Venue != `Z`"]).to_arrow())
        want = src.filter(pc.and_(pc.greater(src["Price"], 100), pc.not_equal(src["Venue"], "Z"))) \
            .sort_by([("Price", "ascending")])
        assert got.equals(want)
        got = _plain(s.open_table("quotes").sort_descending(["Size"]).head(5).view(["Sym", "Qty = Size"]).to_arrow())
        top = src.sort_by([("Size", "descending")]).slice(0, 5)
        assert got.equals(pa.table({"Sym": top["Sym"], "Qty": top["Size"]}))
        got = _plain(s.open_table("quotes").tail(3).to_arrow())
        assert got.equals(src.slice(src.num_rows - 3))
        got = _plain(s.open_table("quotes").update(["Notional = Price * Size"]).where(["Sym in `S01`, `S02`"])
                     .to_arrow())
        part = src.filter(pc.is_in(src["Sym"], pa.array(["S01", "S02"])))
        assert got.column("Notional").to_pylist() == pc.multiply(part["Price"], part["Size"]).to_pylist()
        # exports are not global-scope variables
        assert set(s.tables) == {"quotes"}
    finally:
        s.close()
    # the server ends the session when pydeephaven's CloseSession arrives, which may be after close() returned
    assert until(lambda: user_tables(engine) == {"quotes"}), "closing the session removes its derived tables"


def test_a_sorted_export_is_live_and_pydeephaven_ticking_follows_it(served):
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    from tests.test_interop_clients import _current

    engine, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    states, errors = [], []
    try:
        sorted_t = s.open_table("quotes").where(["Venue != `X`"]).sort_descending(["Price"])
        handle = listen(sorted_t, lambda u: states.append(_current(u)), errors.append)
        handle.start()
        try:
            assert until(lambda: states or errors)
            derived = [t for t in engine.tables(hidden=True) if t.name.startswith("__") and ".sort" in t.name]
            assert len(derived) == 1
            changed = 0
            for step in range(15):  # price changes move rows within the sorted table
                n = len(states)
                syms = [f"S{i:02d}" for i in rng.choice(60, 8, replace=False)]
                engine.write(keyed, _rows(rng, syms), wait=False)
                ups = engine.run_cycle()
                up = ups.get(derived[0].name)
                changed += up is not None
                src = _source(engine)
                want = src.filter(pc.not_equal(src["Venue"], "X")).sort_by([("Price", "descending")])
                if up is not None:
                    assert until(lambda n=n: len(states) > n or errors), f"step {step}"
                assert not errors, errors
                assert states[-1].equals(want.cast(states[-1].schema)), f"step {step}"
            assert changed >= 10
        finally:
            handle.stop()
    finally:
        s.close()


def test_unsupported_operations_are_unimplemented_with_their_name(svc):
    s = svc
    req = table_pb2.RunChartDownsampleRequest()
    req.source_id.ticket.ticket = b"s/quotes"
    code, details = s.status(lambda: s.call(TABLE_SERVICE, "RunChartDownsample", req))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "RunChartDownsample" in details
    batch = table_pb2.BatchTableRequest()
    batch.ops.add().sort.source_id.ticket.ticket = b"s/quotes"
    batch.ops.add().run_chart_downsample.source_id.batch_offset = 0
    code, details = s.status(lambda: list(s.stream(TABLE_SERVICE, "Batch", batch)))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "run_chart_downsample" in details
    assert user_tables(s.engine) == {"quotes"}  # nothing was made


@pytest.mark.parametrize("filters, message", [
    (["Nope > 1"], "unknown column 'Nope'"),
    (["Price >"], "cannot parse"),
    (["pow(Price, 2) > 1"], "unsupported expression"),
])
def test_bad_filters_are_invalid_argument_with_the_reason(svc, filters, message):
    s = svc
    req = table_pb2.UnstructuredFilterTableRequest(filters=filters)
    req.source_id.ticket.ticket = b"s/quotes"
    req.result_id.ticket = b"e" + (7).to_bytes(4, "little")
    code, details = s.status(lambda: s.call(TABLE_SERVICE, "UnstructuredFilter", req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and message in details
    assert user_tables(s.engine) == {"quotes"}


def test_structured_filter_and_batch_with_offsets(svc):
    s = svc
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add().filter
    op.source_id.ticket.ticket = b"s/quotes"
    cond = op.filters.add().compare
    cond.operation = table_pb2.CompareCondition.GREATER_THAN
    cond.lhs.reference.column_name = "Size"
    cond.rhs.literal.long_value = 500
    srt = batch.ops.add().sort
    srt.source_id.batch_offset = 0
    d = srt.sorts.add()
    d.column_name, d.direction = "Sym", table_pb2.SortDescriptor.DESCENDING
    srt.result_id.ticket = b"e" + (3).to_bytes(4, "little")
    call = s.stream(TABLE_SERVICE, "Batch", batch)
    resps = list(call)
    token = dict(call.initial_metadata())["authorization"].split()[-1]
    src = _source(s.engine)
    want = src.filter(pc.greater(src["Size"], 500))
    assert [r.success for r in resps] == [True, True] and resps[1].size == want.num_rows
    # the export is a table like any other: DoGet it with the same session
    got = s.doget(b"e" + (3).to_bytes(4, "little"), token=token)
    assert _plain(got).equals(want.sort_by([("Sym", "descending")]))


def test_a_batch_step_the_engine_cannot_make_fails_inside_the_stream_with_its_dependents(svc):
    """As Deephaven answers it: the failed step success=false with "<ref> cause: <status>: ...",
    each step made from it success=false with the same "<ref>", independent steps made; then the
    call ends with the failed step's status, and a ticket of a dependent says DEPENDENCY_FAILED."""
    s = svc
    s.engine.create(TableSpec("dups", "static", data=pa.table({"K": [1, 1, 2], "V": [1.0, 2.0, 3.0]})))
    token = s.new_session()
    batch = table_pb2.BatchTableRequest()
    nj = batch.ops.add().natural_join  # K 1 twice: a duplicate right key
    nj.left_id.ticket.ticket = nj.right_id.ticket.ticket = b"s/dups"
    nj.columns_to_match.append("K")
    nj.columns_to_add.append("V2=V")
    batch.ops.add().head.source_id.batch_offset = 0
    batch.ops[1].head.num_rows = 1
    ok = batch.ops.add().head
    ok.source_id.ticket.ticket = b"s/quotes"
    ok.num_rows = 3
    ok.result_id.ticket = export_ticket(30)
    dep = batch.ops.add().tail
    dep.source_id.batch_offset = 1
    dep.num_rows = 1
    dep.result_id.ticket = export_ticket(31)
    got = []
    code, details = s.status(lambda: got.extend(s.stream(TABLE_SERVICE, "Batch", batch, token=token)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "duplicate right key" in details
    assert [r.success for r in got] == [False, False, True, False]
    assert [r.result_id.WhichOneof("ref") for r in got] == ["batch_offset", "batch_offset", "ticket", "ticket"]
    assert [r.result_id.batch_offset for r in got[:2]] == [0, 1]
    assert [r.result_id.ticket.ticket for r in got[2:]] == [export_ticket(30), export_ticket(31)]
    m = re.fullmatch(r"([0-9a-f-]{36}) cause: INVALID_ARGUMENT: (.*)", got[0].error_info)
    assert m is not None and "duplicate right key" in m.group(2), got[0].error_info
    assert got[1].error_info == got[3].error_info == m.group(1)
    assert got[2].size == 3 and s.doget(export_ticket(30), token=token).num_rows == 3
    code, details = s.status(lambda: s.doget(export_ticket(31), token=token))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "DEPENDENCY_FAILED" in details
    # a one-shot of the same operation ends with the status alone
    one = table_pb2.NaturalJoinTablesRequest()
    one.CopyFrom(nj)
    one.result_id.ticket = export_ticket(32)
    code, details = s.status(lambda: s.call(TABLE_SERVICE, "NaturalJoinTables", one, token=token))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "duplicate right key" in details


def test_row_variables_are_refused_on_a_ticking_table_that_is_not_append_only(svc):
    """Deephaven's i, ii and k (row position and key) are served on static and append-only tables,
    whose rows never move (tests/test_expr_conformance.py compares them with Deephaven); a keyed
    table is refused by name, as Deephaven refuses it."""
    s = svc
    req = table_pb2.SelectOrUpdateRequest(column_specs=["X = i"])
    req.source_id.ticket.ticket = b"s/quotes"
    req.result_id.ticket = b"e\x07\x00\x00\x00"
    code, details = s.status(lambda: s.call(TABLE_SERVICE, "Update", req))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "row variables i, ii and k" in details
    assert user_tables(s.engine) == {"quotes"}
    s.engine.create(TableSpec("log", "append", SCHEMA))
    s.engine.write(s.engine.resolve("log"), _rows(np.random.default_rng(1), ["A", "B", "C"]), wait=False)
    s.engine.run_cycle()
    req.source_id.ticket.ticket = b"s/log"
    req.column_specs[:] = ["P = i", "K = k"]
    assert s.call(TABLE_SERVICE, "Update", req).success
    derived = next(t for t in s.engine.tables(hidden=True) if ".update" in t.name)
    s.engine.write(s.engine.resolve("log"), _rows(np.random.default_rng(2), ["D", "E"]), wait=False)
    s.engine.run_cycle()
    got = derived.to_arrow()
    assert got["P"].to_pylist() == [0, 1, 2, 3, 4] and got["K"].to_pylist() == [0, 1, 2, 3, 4]
    assert got["Sym"].to_pylist() == ["A", "B", "C", "D", "E"]
