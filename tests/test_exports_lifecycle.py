"""Exports never outlive their owner, and no session reaches another's tables.

Every export belongs to a session: Release, CloseSession and session expiry (with no traffic at
all) free it and every derived table only it holds, DoPut exports included, and the memory comes
back. Operations sent without a result ticket keep nothing: a one-shot call is refused as
Deephaven refuses it, a Batch step lives only while later steps of its batch use it and is
answered with its `batch_offset`. Session tables are hidden: no scope ticket (`s/...`), app ticket
or PATH descriptor reaches them, and no listing shows them."""
from __future__ import annotations

import gc
import json
import resource
import time
import tracemalloc

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest

from tickwire.server.engine import Engine, TableSpec
from tickwire.protocol.proto import application_pb2, config_pb2, flight_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import METHODS
from tickwire.protocol.tickets import export_ticket
from tickwire.server.app import TickwireServer

from tests import waiting

ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int64())])
TABLE = "/io.deephaven.proto.backplane.grpc.TableService/"
SESSION = "/io.deephaven.proto.backplane.grpc.SessionService/"
FLIGHT = "/arrow.flight.protocol.FlightService/"


def _quotes(n: int = 500) -> pa.Table:
    rng = np.random.default_rng(12)
    return pa.table({"Sym": [f"S{i:03d}" for i in range(n)], "Price": np.round(rng.uniform(90, 110, n), 2),
                     "Size": rng.integers(1, 1000, n)}, schema=SCHEMA)


def _start(**kw):
    graph = Engine(interval_ms=3_600_000)  # cycles only when a test runs one
    t = graph.create(TableSpec("quotes", "keyed", SCHEMA, keys=["Sym"]))
    t.add(_quotes())
    graph.run_cycle()
    server = TickwireServer(graph, port=0, start_engine=False, **kw).start()
    return graph, server


@pytest.fixture
def served():
    graph, server = _start()
    yield graph, server
    server.stop()


class Client:
    """One Deephaven session over raw gRPC (the bearer token of its first call)."""

    def __init__(self, server):
        self.server = server
        self.channel = grpc.insecure_channel(server.target)
        m = METHODS["/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants"]
        _r, call = self.channel.unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                            response_deserializer=m.response.FromString).with_call(
            config_pb2.ConfigurationConstantsRequest(), metadata=ANON)
        self.bearer = dict(call.initial_metadata())["authorization"]
        self.md = (("authorization", self.bearer),)
        self._flight = None

    def unary(self, path, request):
        m = METHODS[path]
        fn = self.channel.unary_unary(path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)
        return fn(request, metadata=self.md)

    def stream(self, path, request) -> list:
        m = METHODS[path]
        fn = self.channel.unary_stream(path, request_serializer=m.request.SerializeToString,
                                       response_deserializer=m.response.FromString)
        return list(fn(request, metadata=self.md))

    def where(self, source: bytes, filters: list[str], result: int | None):
        req = table_pb2.UnstructuredFilterTableRequest(filters=filters)
        req.source_id.ticket.ticket = source
        if result is not None:
            req.result_id.ticket = export_ticket(result)
        return self.unary(TABLE + "UnstructuredFilter", req)

    def release(self, export_id: int) -> None:
        req = session_pb2.ReleaseRequest()
        req.id.ticket = export_ticket(export_id)
        self.unary(SESSION + "Release", req)

    def close_session(self) -> None:
        self.unary(SESSION + "CloseSession", session_pb2.HandshakeRequest())

    @property
    def flight(self) -> fl.FlightClient:
        if self._flight is None:
            self._flight = fl.FlightClient(f"grpc://{self.server.target}")
        return self._flight

    @property
    def options(self) -> fl.FlightCallOptions:
        return fl.FlightCallOptions(headers=[(b"authorization", self.bearer.encode())])

    def put_export(self, export_id: int, data: pa.Table) -> None:
        writer, _reader = self.flight.do_put(fl.FlightDescriptor.for_path("export", str(export_id)), data.schema,
                                             self.options)
        writer.write_table(data)
        writer.close()

    def doget(self, ticket: bytes) -> pa.Table:
        return self.flight.do_get(fl.Ticket(ticket), self.options).read_all()

    def close(self) -> None:
        if self._flight is not None:
            self._flight.close()
        self.channel.close()


def _code(fn) -> grpc.StatusCode | fl.FlightError:
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code()
    except fl.FlightError as exc:
        return type(exc)
    raise AssertionError("the call succeeded")


def _wait(pred, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.02)


def _hidden_names(graph) -> list[str]:
    return [n for n, t in graph.tables.items() if t.hidden]


# -- release frees ----------------------------------------------------------------------------------------


def test_released_doput_exports_leave_the_graph_and_give_their_memory_back(served):
    graph, server = served
    ops = server.ctx.scope.ops
    c = Client(server)
    try:
        rng = np.random.default_rng(1)
        n_rows, n_exports = 10_000, 200
        data = pa.table({"Sym": pa.array(np.char.add("K", np.arange(n_rows).astype(str)).astype(object)),
                         "Price": rng.uniform(0, 1, n_rows), "Size": rng.integers(0, 9, n_rows)}, schema=SCHEMA)
        # the tables' columns are numpy arrays, which tracemalloc counts (as it counts Python objects)
        gc.collect()
        tracemalloc.start()
        try:
            tables0, bytes0 = len(graph.tables), tracemalloc.get_traced_memory()[0]
            for i in range(1, n_exports + 1):
                c.put_export(i, data)
            graph.run_cycle()  # the uploads' rows enter their tables
            assert len(graph.tables) == tables0 + n_exports and ops.owned == n_exports
            assert c.doget(export_ticket(n_exports)).num_rows == n_rows
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - bytes0
            rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
            assert grown > n_exports * data.nbytes * 0.9, grown  # the uploads are held
            names = _hidden_names(graph)
            token = c.bearer.split()[-1]
            assert len(names) == n_exports and not any(token in n for n in names)  # names tell nothing of the session
            for i in range(1, n_exports + 1):
                c.release(i)
            assert len(graph.tables) == tables0 and ops.owned == 0 and _hidden_names(graph) == []

            def left_over() -> int:
                gc.collect()
                return tracemalloc.get_traced_memory()[0] - bytes0

            # tracemalloc counts every thread's memory: a server thread still ending the last call
            # (the DoGet stream of the last export) may hold a table for a moment after the client
            # has its answer; what is really kept stays past the deadline and fails below
            waiting.wait_until(lambda: left_over() < data.nbytes, 10, interval=0.1)
            left = left_over()
        finally:
            tracemalloc.stop()
        print(f"\n{n_exports} DoPut exports x {n_rows} rows: +{grown / 1e6:.1f} MB held; after Release: "
              f"{left / 1e6:+.2f} MB (peak RSS {rss_peak:.0f} MB)")
        assert left < data.nbytes, left  # less than one upload is left over
        code = _code(lambda: c.stream(FLIGHT + "DoGet", flight_pb2.Ticket(ticket=export_ticket(1))))
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        c.close()


def test_release_frees_a_chain_of_derived_exports_only_when_the_last_holder_goes(served):
    graph, server = served
    c = Client(server)
    try:
        base = len(graph.tables)
        c.where(b"s/quotes", ["Price > 95"], 1)
        c.where(export_ticket(1), ["Size > 100"], 2)  # derived from export 1
        fetch = table_pb2.FetchTableRequest()
        fetch.source_id.ticket.ticket = export_ticket(2)
        fetch.result_id.ticket = export_ticket(3)  # a second export of the same table
        c.unary(TABLE + "FetchTable", fetch)
        assert len(graph.tables) == base + 2
        c.release(1)  # export 2's table still needs it as its parent
        assert len(graph.tables) == base + 2
        c.release(2)  # export 3 still holds the table
        assert len(graph.tables) == base + 2
        src = graph.snapshot("quotes")[1]
        want = src.filter(pc.and_(pc.greater(src["Price"], 95), pc.greater(src["Size"], 100)))
        assert c.doget(export_ticket(3)).num_rows == want.num_rows
        c.release(3)
        assert len(graph.tables) == base and server.ctx.scope.ops.owned == 0
    finally:
        c.close()


# -- nothing kept without a result ticket --------------------------------------------------------------


def test_operations_without_a_result_ticket_leave_no_table(served):
    graph, server = served
    c = Client(server)
    try:
        base = len(graph.tables)
        for _ in range(100):  # Deephaven refuses a one-shot operation without a result ticket
            assert _code(lambda: c.where(b"s/quotes", ["Price > 100"], None)) == grpc.StatusCode.FAILED_PRECONDITION
        fetch = table_pb2.FetchTableRequest()
        fetch.source_id.ticket.ticket = b"s/quotes"
        assert _code(lambda: c.unary(TABLE + "FetchTable", fetch)) == grpc.StatusCode.FAILED_PRECONDITION
        assert len(graph.tables) == base
        for _ in range(100):  # batches of unexported steps only: nothing outlives the call
            batch = table_pb2.BatchTableRequest()
            op = batch.ops.add().unstructured_filter
            op.source_id.ticket.ticket = b"s/quotes"
            op.filters.append("Price > 100")
            srt = batch.ops.add().sort
            srt.source_id.batch_offset = 0
            d = srt.sorts.add()
            d.column_name, d.direction = "Price", table_pb2.SortDescriptor.ASCENDING
            resps = c.stream(TABLE + "Batch", batch)
            assert [r.success for r in resps] == [True, True]
        _wait(lambda: len(graph.tables) == base)
        assert server.ctx.scope.ops.owned == 0
    finally:
        c.close()


def _chain_batch(result_id: int) -> table_pb2.BatchTableRequest:
    """where -> sort -> tail, only the last step exported (what pydeephaven's Query sends)."""
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add().unstructured_filter
    op.source_id.ticket.ticket = b"s/quotes"
    op.filters.append("Price > 100")
    srt = batch.ops.add().sort
    srt.source_id.batch_offset = 0
    d = srt.sorts.add()
    d.column_name, d.direction = "Price", table_pb2.SortDescriptor.DESCENDING
    tail = batch.ops.add().tail
    tail.source_id.batch_offset = 1
    tail.num_rows = 5
    tail.result_id.ticket = export_ticket(result_id)
    return batch


def test_batch_answers_unexported_steps_with_their_batch_offset(served):
    graph, server = served
    c = Client(server)
    try:
        base = len(graph.tables)
        resps = c.stream(TABLE + "Batch", _chain_batch(7))
        assert [r.result_id.WhichOneof("ref") for r in resps] == ["batch_offset", "batch_offset", "ticket"]
        assert [r.result_id.batch_offset for r in resps[:2]] == [0, 1]
        assert resps[2].result_id.ticket.ticket == export_ticket(7)
        src = graph.snapshot("quotes")[1]
        above = src.filter(pc.greater(src["Price"], 100))
        assert all(r.success for r in resps)
        assert [r.size for r in resps] == [above.num_rows, above.num_rows, 5]
        want = above.sort_by([("Price", "descending")]).slice(above.num_rows - 5)
        got = c.doget(export_ticket(7))
        assert got.column("Sym").to_pylist() == want.column("Sym").to_pylist()
        # the unexported steps stay only as the export's parents
        assert len(graph.tables) == base + 3
        c.release(7)
        assert len(graph.tables) == base and server.ctx.scope.ops.owned == 0
    finally:
        c.close()


# -- sessions that end free their tables ---------------------------------------------------------------------


def test_close_session_frees_every_table_it_held(served):
    graph, server = served
    c = Client(server)
    try:
        base = len(graph.tables)
        c.stream(TABLE + "Batch", _chain_batch(1))
        c.where(export_ticket(1), ["Size > 10"], 2)
        c.put_export(3, _quotes(50))
        assert len(graph.tables) == base + 5
        c.close_session()
        assert len(graph.tables) == base and server.ctx.scope.ops.owned == 0
        assert server.sessions.count == 0
    finally:
        c.close()


def test_expired_sessions_free_their_tables_with_no_traffic():
    # 3 s, not less: client 0 idles while clients 1 and 2 log in, run a batch and upload, which
    # took more than 0.4 s on a loaded CI machine and let its session expire before the count below
    duration = 3.0
    graph, server = _start(session_duration_ms=int(duration * 1000))
    try:
        base = len(graph.tables)
        clients = [Client(server) for _ in range(3)]
        for i, c in enumerate(clients):
            c.stream(TABLE + "Batch", _chain_batch(1))
            t_last = time.monotonic()  # before the last call: it renews its session no earlier than this
            c.put_export(2, _quotes(20 + i))
        assert len(graph.tables) == base + 3 * 4
        t0 = time.monotonic()  # after every call: each session's lease ends by t0 + duration
        _wait(lambda: len(graph.tables) == base, timeout=duration + 15)  # no call at all meanwhile
        freed = time.monotonic()
        assert server.sessions.count == 0 and server.ctx.scope.ops.owned == 0
        assert freed - t_last >= duration, freed - t_last  # the last session lived its full duration
        # expiry plus the reaper's interval (0.75 s), with room for a loaded machine
        assert freed - t0 < duration + 5.0, freed - t0
        # an expired token is refused, and nothing can be exported into the ended session
        assert _code(lambda: clients[0].where(b"s/quotes", ["Price > 1"], 5)) == grpc.StatusCode.UNAUTHENTICATED
        assert len(graph.tables) == base
        for c in clients:
            c.close()
    finally:
        server.stop()


# -- no cross-session reads by name -------------------------------------------------------------------------


def test_a_session_table_is_reachable_by_no_name(served):
    graph, server = served
    owner, other = Client(server), Client(server)
    try:
        owner.where(b"s/quotes", ["Price > 100"], 1)
        owner.put_export(2, _quotes(30))
        graph.run_cycle()
        names = _hidden_names(graph)
        assert len(names) == 2
        for who in (other, owner):  # not even the owner: only its export tickets reach them
            for name in names:
                for ticket in (b"s/" + name.encode(), b"a/scope/f/" + name.encode()):
                    code = _code(lambda: who.stream(FLIGHT + "DoGet", flight_pb2.Ticket(ticket=ticket)))
                    assert code == grpc.StatusCode.NOT_FOUND, (ticket, code)
                    fetch = table_pb2.FetchTableRequest()
                    fetch.source_id.ticket.ticket = ticket
                    fetch.result_id.ticket = export_ticket(99)
                    assert _code(lambda: who.unary(TABLE + "FetchTable", fetch)) == grpc.StatusCode.NOT_FOUND
                for path in (["scope", name], ["app", "scope", "field", name]):
                    desc = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.PATH, path=path)
                    for method in ("GetFlightInfo", "GetSchema"):
                        code = _code(lambda: who.unary(FLIGHT + method, desc))
                        assert code == grpc.StatusCode.NOT_FOUND, (method, path, code)
        # nor can anyone append into one through its name
        before = {n: graph.tables[n].size for n in names}
        for name in names:
            writer, _ = other.flight.do_put(fl.FlightDescriptor.for_path("scope", name), SCHEMA, other.options)
            with pytest.raises(pa.ArrowInvalid, match="reserved"):  # INVALID_ARGUMENT
                writer.write_table(_quotes(3))
                writer.close()
        graph.run_cycle()
        assert {n: graph.tables[n].size for n in names} == before
        # the owner's export tickets still work; the other session's do not
        assert owner.doget(export_ticket(2)).num_rows == 30
        code = _code(lambda: other.stream(FLIGHT + "DoGet", flight_pb2.Ticket(ticket=export_ticket(2))))
        assert code == grpc.StatusCode.NOT_FOUND
    finally:
        owner.close()
        other.close()


def test_listings_show_no_session_table(served):
    graph, server = served
    c = Client(server)
    try:
        c.stream(TABLE + "Batch", _chain_batch(1))
        c.put_export(2, _quotes(10))
        assert len(_hidden_names(graph)) == 4
        flights = [tuple(p.decode() if isinstance(p, bytes) else p for p in fi.descriptor.path)
                   for fi in c.flight.list_flights(options=c.options)]
        assert flights == [("scope", "quotes")]
        (result,) = list(c.flight.do_action(fl.Action("list-tables", b""), c.options))
        assert [t["name"] for t in json.loads(result.body.to_pybytes())] == ["quotes"]
        m = METHODS["/io.deephaven.proto.backplane.grpc.ApplicationService/ListFields"]
        call = c.channel.unary_stream(m.path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)(
            application_pb2.ListFieldsRequest(), metadata=c.md)
        first = next(iter(call))
        call.cancel()
        assert [f.field_name for f in first.created] == ["quotes"]
    finally:
        c.close()


# -- the same requests against a real Deephaven (slow, interop) ------------------------------------------------

LC_SCRIPT = r'''
from deephaven import empty_table

lc_quotes = empty_table(500).update([
    "Sym = `S` + i",
    "Price = 90.0 + ((i * 37) % 200) / 10.0",
    "Size = (long) ((i * 13) % 1000)",
])
'''
CHAIN = {"name": "chain", "table": "lc_quotes", "where": ["Price > 100"], "sort": ["Price", "Size"], "tail": 7}


def _lc_rows() -> pa.Table:
    i = np.arange(500)
    return pa.table({"Sym": [f"S{k}" for k in i], "Price": 90.0 + ((i * 37) % 200) / 10.0,
                     "Size": ((i * 13) % 1000).astype(np.int64)}, schema=SCHEMA)


def _chain_expected() -> pa.Table:
    src = _lc_rows()
    above = src.filter(pc.greater(src["Price"], 100))
    s = above.sort_by([("Price", "ascending"), ("Size", "ascending")])
    return s.slice(s.num_rows - CHAIN["tail"])


def _plain(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays(t.columns, names=t.column_names)


@pytest.fixture(scope="module")
def dh():
    from .interop.dh_server import deephaven_server_available, start_dh_server

    why = deephaven_server_available()
    if why:
        pytest.skip(why)
    with start_dh_server(tables_script=LC_SCRIPT) as server:
        yield server


@pytest.fixture(scope="module")
def tw():
    graph = Engine(interval_ms=50)
    graph.create(TableSpec("lc_quotes", "static", data=_lc_rows()))
    server = TickwireServer(graph, port=0).start()
    yield server
    server.stop()
    graph.stop()


def _batch_shape(target) -> tuple[list, grpc.StatusCode]:
    c = Client(target)
    try:
        batch = table_pb2.BatchTableRequest()
        op = batch.ops.add().unstructured_filter
        op.source_id.ticket.ticket = b"s/lc_quotes"
        op.filters.append("Price > 100")
        srt = batch.ops.add().sort
        srt.source_id.batch_offset = 0
        d = srt.sorts.add()
        d.column_name, d.direction = "Price", table_pb2.SortDescriptor.ASCENDING
        tail = batch.ops.add().tail
        tail.source_id.batch_offset = 1
        tail.num_rows = 7
        tail.result_id.ticket = export_ticket(1)
        shape = [(r.result_id.WhichOneof("ref"), r.result_id.batch_offset, r.result_id.ticket.ticket, r.success,
                  r.size, r.is_static) for r in c.stream(TABLE + "Batch", batch)]
        code = _code(lambda: c.where(b"s/lc_quotes", ["Price > 100"], None))
        c.release(1)
        return shape, code
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.interop
def test_batch_replies_and_one_shots_without_result_ticket_match_deephaven(tw, dh):
    got, dh_got = _batch_shape(tw), _batch_shape(dh)
    assert got == dh_got
    shape, code = got
    n = _lc_rows().filter(pc.greater(_lc_rows()["Price"], 100)).num_rows
    assert shape == [("batch_offset", 0, b"", True, n, True), ("batch_offset", 1, b"", True, n, True),
                     ("ticket", 0, export_ticket(1), True, 7, True)]
    assert code == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_query_with_unexported_steps_works_like_deephaven(tw, dh):
    from pydeephaven import Session

    want = _chain_expected()
    out = {}
    for name, target in (("tickwire", tw), ("deephaven", dh)):
        host, _, port = target.target.rpartition(":")
        s = Session(host=host, port=int(port))
        try:
            t = s.open_table("lc_quotes")
            q = s.query(t).where(CHAIN["where"]).sort(CHAIN["sort"]).tail(CHAIN["tail"])
            out[name] = _plain(q.exec().to_arrow())
        finally:
            s.close()
    assert out["tickwire"].equals(want), out["tickwire"]
    assert out["deephaven"].equals(want), out["deephaven"]
    _wait(lambda: tw.ctx.scope.ops.owned == 0)  # the closed session left nothing behind


@pytest.mark.slow
@pytest.mark.interop
def test_java_client_multi_step_table_spec_works_like_deephaven(tw, dh):
    from .interop.java_barrage import run_java_client

    want = _chain_expected()
    for target in (tw, dh):
        results = run_java_client(target.target, [], modes=(), seconds=0, timeout=240, specs=[CHAIN])
        res = results[("chain", "spec")]
        assert res.error is None, res.error
        assert _plain(res.table).equals(want), (target.target, res.table)
