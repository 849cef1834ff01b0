"""Deephaven clients asking tickwire for derived tables (TableService Sort, Filter,
UnstructuredFilter, View, Select, Update, Head, Tail and their Batch form).

pydeephaven's `open_table(...).sort(...).where(...)` must give what the same operation gives on
the source; the exports are live tables that pydeephaven-ticking can subscribe to (a sorted
ticking table delivers shifts); unsupported operations are UNIMPLEMENTED with their name; bad
filters are INVALID_ARGUMENT with the reason; releasing exports removes the derived tables."""
from __future__ import annotations

import time

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tickwire.server.engine import Engine, TableSpec
from tickwire.protocol.proto import table_pb2
from tickwire.server.app import TickwireServer
from tickwire.server.engine.perf_tables import NAMES as PERF_TABLES

SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int32()), ("Venue", pa.string())])


def user_tables(graph) -> set[str]:
    """The graph's tables less the server's own performance tables."""
    return set(graph.tables) - set(PERF_TABLES)


def _rows(rng, syms) -> pa.Table:
    n = len(syms)
    return pa.table({"Sym": syms, "Price": np.round(rng.uniform(90, 110, n), 2),
                     "Size": rng.integers(1, 1000, n).astype(np.int32),
                     "Venue": np.array(["X", "Y", "Z"], dtype=object)[rng.integers(0, 3, n)]}, schema=SCHEMA)


@pytest.fixture
def served():
    rng = np.random.default_rng(4)
    graph = Engine(interval_ms=20)
    keyed = graph.create(TableSpec("quotes", "keyed", SCHEMA, keys=["Sym"]))
    keyed.add(_rows(rng, [f"S{i:02d}" for i in range(60)]))
    graph.run_cycle()
    server = TickwireServer(graph, port=0, start_engine=False).start()
    yield graph, keyed, server, rng
    server.stop()


def _plain(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays(t.columns, names=t.column_names)


def _source(graph) -> pa.Table:
    return _plain(graph.snapshot("quotes")[1])


def test_pydeephaven_sort_where_head_view_equal_the_same_operations_on_the_source(served):
    from pydeephaven import Session

    graph, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    try:
        src = _source(graph)
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
    deadline = time.monotonic() + 5
    while user_tables(graph) != {"quotes"} and time.monotonic() < deadline:
        time.sleep(0.02)
    assert user_tables(graph) == {"quotes"}, "closing the session removes its derived tables"


def test_a_sorted_export_is_live_and_pydeephaven_ticking_follows_it(served):
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    from tests.test_interop_clients import _current

    graph, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    states, errors = [], []
    try:
        sorted_t = s.open_table("quotes").where(["Venue != `X`"]).sort_descending(["Price"])
        handle = listen(sorted_t, lambda u: states.append(_current(u)), errors.append)
        handle.start()
        try:
            _wait(lambda: states or errors)
            derived = [t for n, t in graph.tables.items() if n.startswith("__") and ".sort" in n]
            assert len(derived) == 1
            changed = 0
            for step in range(15):  # price changes move rows within the sorted table
                n = len(states)
                syms = [f"S{i:02d}" for i in rng.choice(60, 8, replace=False)]
                keyed.add(_rows(rng, syms))
                ups = graph.run_cycle()
                up = ups.get(derived[0].name)
                changed += up is not None
                src = _source(graph)
                want = src.filter(pc.not_equal(src["Venue"], "X")).sort_by([("Price", "descending")])
                if up is not None:
                    _wait(lambda: len(states) > n or errors)
                assert not errors, errors
                assert states[-1].equals(want.cast(states[-1].schema)), f"step {step}"
            assert changed >= 10
        finally:
            handle.stop()
    finally:
        s.close()


def _wait(pred, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.01)
    raise AssertionError("timed out")


def _call(server, method: str, request, response=table_pb2.ExportedTableCreationResponse):
    ch = grpc.insecure_channel(server.target)
    fn = ch.unary_unary(f"/io.deephaven.proto.backplane.grpc.TableService/{method}",
                        request_serializer=type(request).SerializeToString,
                        response_deserializer=response.FromString)
    try:
        return fn(request, metadata=(("authorization", "Anonymous"),))
    finally:
        ch.close()


def test_unsupported_operations_are_unimplemented_with_their_name(served):
    graph, keyed, server, rng = served
    req = table_pb2.UpdateByRequest()
    req.source_id.ticket.ticket = b"s/quotes"
    with pytest.raises(grpc.RpcError) as e:
        _call(server, "UpdateBy", req)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "UpdateBy" in e.value.details()
    batch = table_pb2.BatchTableRequest()
    batch.ops.add().sort.source_id.ticket.ticket = b"s/quotes"
    batch.ops.add().select_distinct.source_id.batch_offset = 0
    ch = grpc.insecure_channel(server.target)
    fn = ch.unary_stream("/io.deephaven.proto.backplane.grpc.TableService/Batch",
                         request_serializer=table_pb2.BatchTableRequest.SerializeToString,
                         response_deserializer=table_pb2.ExportedTableCreationResponse.FromString)
    with pytest.raises(grpc.RpcError) as e:
        list(fn(batch, metadata=(("authorization", "Anonymous"),)))
    ch.close()
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "select_distinct" in e.value.details()
    assert user_tables(graph) == {"quotes"}  # nothing was made


@pytest.mark.parametrize("filters, message", [
    (["Nope > 1"], "unknown column 'Nope'"),
    (["Price >"], "cannot parse"),
    (["Sym.startsWith(`A`)"], "unsupported expression"),
])
def test_bad_filters_are_invalid_argument_with_the_reason(served, filters, message):
    graph, keyed, server, rng = served
    req = table_pb2.UnstructuredFilterTableRequest(filters=filters)
    req.source_id.ticket.ticket = b"s/quotes"
    req.result_id.ticket = b"e" + (7).to_bytes(4, "little")
    with pytest.raises(grpc.RpcError) as e:
        _call(server, "UnstructuredFilter", req)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details()
    assert user_tables(graph) == {"quotes"}


def test_structured_filter_and_batch_with_offsets(served):
    graph, keyed, server, rng = served
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
    ch = grpc.insecure_channel(server.target)
    fn = ch.unary_stream("/io.deephaven.proto.backplane.grpc.TableService/Batch",
                         request_serializer=table_pb2.BatchTableRequest.SerializeToString,
                         response_deserializer=table_pb2.ExportedTableCreationResponse.FromString)
    call = fn(batch, metadata=(("authorization", "Anonymous"),))
    resps = list(call)
    token = dict(call.initial_metadata())["authorization"]
    src = _source(graph)
    want = src.filter(pc.greater(src["Size"], 500))
    assert [r.success for r in resps] == [True, True] and resps[1].size == want.num_rows
    # the export is a table like any other: DoGet it with the same session
    import pyarrow.flight as fl
    c = fl.FlightClient(f"grpc://{server.target}")
    got = c.do_get(fl.Ticket(b"e" + (3).to_bytes(4, "little")),
                   fl.FlightCallOptions(headers=[(b"authorization", token.encode())])).read_all()
    assert _plain(got).equals(want.sort_by([("Sym", "descending")]))
    c.close()
    ch.close()
