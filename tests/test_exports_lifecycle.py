"""Exports never outlive their owner, and no session reaches another's tables.

Every export belongs to a session: Release, CloseSession and session expiry (with no traffic at
all) free it and every derived table only it holds, DoPut exports included, and nothing keeps the
freed tables. Operations sent without a result ticket keep nothing: a one-shot call is refused as
Deephaven refuses it, a Batch step lives only while later steps of its batch use it and is
answered with its `batch_offset`. Session tables are hidden: no scope ticket (`s/...`), app ticket
or PATH descriptor reaches them, and no listing shows them.

The services run in process (tests.harness.Services) over an engine on a ManualClock: leases run
out when the test moves the clock. The comparisons with Deephaven (slow, interop) use sockets. What
the released exports' memory costs is measured by bench/bench_memory.py."""
from __future__ import annotations

import gc
import json
import re
import threading
import weakref

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.harness import Services, chain_batch, until
from tickwire.protocol.opening import exchange_opening, subscription_request
from tickwire.protocol.proto import application_pb2, config_pb2, flight_pb2, session_pb2, table_pb2, ticket_pb2
from tickwire.protocol.proto.methods import (
    APPLICATION_SERVICE,
    CONFIG_SERVICE,
    FLIGHT_SERVICE,
    METHODS,
    SESSION_SERVICE,
    TABLE_SERVICE,
)
from tickwire.protocol.tickets import export_ticket
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int64())])
TABLE = f"/{TABLE_SERVICE}/"
SESSION = f"/{SESSION_SERVICE}/"


def _quotes(n: int = 500) -> pa.Table:
    rng = np.random.default_rng(12)
    return pa.table({"Sym": [f"S{i:03d}" for i in range(n)], "Price": np.round(rng.uniform(90, 110, n), 2),
                     "Size": rng.integers(1, 1000, n)}, schema=SCHEMA)


def _services(**kw) -> Services:
    """The services over an engine holding `quotes`; cycles run only when a test runs one."""
    s = Services(**kw)
    quotes = s.engine.create(TableSpec("quotes", "keyed", SCHEMA, keys=["Sym"]))
    s.write(quotes, _quotes())
    s.cycle()
    return s


@pytest.fixture
def served():
    with _services() as s:
        yield s


class Client:
    """One Deephaven session of the in-process services (the bearer token of its first call)."""

    def __init__(self, s: Services):
        self.s = s
        _r, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants",
                                          config_pb2.ConfigurationConstantsRequest())
        self.bearer = dict(headers)["authorization"]
        self.token = self.bearer.split()[-1]

    def unary(self, service: str, method: str, request):
        return self.s.call(service, method, request, token=self.token)

    def stream(self, service: str, method: str, request) -> list:
        return list(self.s.stream(service, method, request, token=self.token))

    def where(self, source: bytes, filters: list[str], result: int | None):
        req = table_pb2.UnstructuredFilterTableRequest(filters=filters)
        req.source_id.ticket.ticket = source
        if result is not None:
            req.result_id.ticket = export_ticket(result)
        return self.unary(TABLE_SERVICE, "UnstructuredFilter", req)

    def release(self, export_id: int) -> None:
        req = session_pb2.ReleaseRequest()
        req.id.ticket = export_ticket(export_id)
        self.unary(SESSION_SERVICE, "Release", req)

    def close_session(self) -> None:
        self.unary(SESSION_SERVICE, "CloseSession", session_pb2.HandshakeRequest())

    def put_export(self, export_id: int, data: pa.Table) -> None:
        self.s.put(["export", str(export_id)], data, token=self.token)

    def put(self, path: list[str], data: pa.Table) -> None:
        self.s.put(path, data, token=self.token)

    def doget(self, ticket: bytes) -> pa.Table:
        return self.s.doget(ticket, token=self.token)


def _code(fn, *args) -> grpc.StatusCode:
    """The status of the call `fn(*args)`, which must fail."""
    return Services.status(lambda: fn(*args))[0]


def _table_count(engine) -> int:
    """Every table of the engine, hidden ones (a session's) included."""
    return len(engine.tables(hidden=True))


def _hidden(engine) -> list:
    return [t for t in engine.tables(hidden=True) if t.hidden]


def _hidden_names(engine) -> list[str]:
    return [t.name for t in _hidden(engine)]


def _quotes_now(engine) -> pa.Table:
    return engine.snapshot(engine.resolve("quotes"))[1]


# -- release frees ----------------------------------------------------------------------------------------


def test_released_doput_exports_leave_the_engine_and_nothing_keeps_them(served):
    s = served
    engine, ops = s.engine, s.ctx.ops
    c = Client(s)
    rng = np.random.default_rng(1)
    n_rows, n_exports = 2_000, 40
    data = pa.table({"Sym": pa.array(np.char.add("K", np.arange(n_rows).astype(str)).astype(object)),
                     "Price": rng.uniform(0, 1, n_rows), "Size": rng.integers(0, 9, n_rows)}, schema=SCHEMA)
    tables0 = _table_count(engine)
    for i in range(1, n_exports + 1):
        c.put_export(i, data)
    s.cycle()  # the uploads' rows enter their tables
    assert _table_count(engine) == tables0 + n_exports and ops.owned == n_exports
    held = _hidden(engine)
    assert [t.size for t in held] == [n_rows] * n_exports  # the uploads are held, whole
    assert c.doget(export_ticket(n_exports)).num_rows == n_rows
    names = [t.name for t in held]
    assert len(names) == n_exports and not any(c.token in n for n in names)  # names tell nothing of the session
    refs = [weakref.ref(t) for t in held]
    del held
    for i in range(1, n_exports + 1):
        c.release(i)
    assert _table_count(engine) == tables0 and ops.owned == 0 and _hidden_names(engine) == []

    def collected() -> bool:
        gc.collect()
        return all(r() is None for r in refs)

    # the memory is given back: nothing (the engine, the session, a publisher, a cache) keeps a released
    # table; the handler of the last DoGet, on the services' loop, may drop its reference a moment after
    # the stream ended for the client
    assert until(collected), [r() for r in refs if r() is not None][:3]
    assert _code(lambda: c.doget(export_ticket(1))) == grpc.StatusCode.NOT_FOUND


def test_release_frees_a_chain_of_derived_exports_only_when_the_last_holder_goes(served):
    s = served
    engine = s.engine
    c = Client(s)
    base = _table_count(engine)
    c.where(b"s/quotes", ["Price > 95"], 1)
    c.where(export_ticket(1), ["Size > 100"], 2)  # derived from export 1
    fetch = table_pb2.FetchTableRequest()
    fetch.source_id.ticket.ticket = export_ticket(2)
    fetch.result_id.ticket = export_ticket(3)  # a second export of the same table
    c.unary(TABLE_SERVICE, "FetchTable", fetch)
    assert _table_count(engine) == base + 2
    c.release(1)  # export 2's table still needs it as its parent
    assert _table_count(engine) == base + 2
    c.release(2)  # export 3 still holds the table
    assert _table_count(engine) == base + 2
    src = _quotes_now(engine)
    want = src.filter(pc.and_(pc.greater(src["Price"], 95), pc.greater(src["Size"], 100)))
    assert c.doget(export_ticket(3)).num_rows == want.num_rows
    c.release(3)
    assert _table_count(engine) == base and s.ctx.ops.owned == 0


# -- nothing kept without a result ticket --------------------------------------------------------------


def test_operations_without_a_result_ticket_leave_no_table(served):
    s = served
    engine = s.engine
    c = Client(s)
    base = _table_count(engine)
    for _ in range(100):  # Deephaven refuses a one-shot operation without a result ticket
        assert _code(lambda: c.where(b"s/quotes", ["Price > 100"], None)) == grpc.StatusCode.FAILED_PRECONDITION
    fetch = table_pb2.FetchTableRequest()
    fetch.source_id.ticket.ticket = b"s/quotes"
    assert _code(lambda: c.unary(TABLE_SERVICE, "FetchTable", fetch)) == grpc.StatusCode.FAILED_PRECONDITION
    assert _table_count(engine) == base
    for _ in range(100):  # batches of unexported steps only: nothing outlives the call
        resps = c.stream(TABLE_SERVICE, "Batch", chain_batch(b"s/quotes", None, tail=None))
        assert [r.success for r in resps] == [True, True]
    # the last batch's handler lets its steps go on the services' loop once its stream has ended
    assert until(lambda: _table_count(engine) == base), _table_count(engine) - base
    assert s.ctx.ops.owned == 0


def _chain_batch(result_id: int) -> table_pb2.BatchTableRequest:
    return chain_batch(b"s/quotes", result_id, descending=True)


def test_batch_answers_unexported_steps_with_their_batch_offset(served):
    s = served
    engine = s.engine
    c = Client(s)
    base = _table_count(engine)
    resps = c.stream(TABLE_SERVICE, "Batch", _chain_batch(7))
    assert [r.result_id.WhichOneof("ref") for r in resps] == ["batch_offset", "batch_offset", "ticket"]
    assert [r.result_id.batch_offset for r in resps[:2]] == [0, 1]
    assert resps[2].result_id.ticket.ticket == export_ticket(7)
    src = _quotes_now(engine)
    above = src.filter(pc.greater(src["Price"], 100))
    assert all(r.success for r in resps)
    assert [r.size for r in resps] == [above.num_rows, above.num_rows, 5]
    want = above.sort_by([("Price", "descending")]).slice(above.num_rows - 5)
    got = c.doget(export_ticket(7))
    assert got.column("Sym").to_pylist() == want.column("Sym").to_pylist()
    # the unexported steps stay only as the export's parents
    assert until(lambda: _table_count(engine) == base + 3), _table_count(engine) - base
    c.release(7)
    assert _table_count(engine) == base and s.ctx.ops.owned == 0


# -- sessions that end free their tables ---------------------------------------------------------------------


def test_close_session_frees_every_table_it_held(served):
    s = served
    engine = s.engine
    c = Client(s)
    base = _table_count(engine)
    c.stream(TABLE_SERVICE, "Batch", _chain_batch(1))
    c.where(export_ticket(1), ["Size > 10"], 2)
    c.put_export(3, _quotes(50))
    assert until(lambda: _table_count(engine) == base + 5), _table_count(engine) - base
    c.close_session()
    assert _table_count(engine) == base and s.ctx.ops.owned == 0
    assert s.sessions.count == 0


def test_expired_sessions_free_their_tables_with_no_traffic():
    duration = 3.0  # each session's lease, from its last call
    with _services(session_duration_ms=int(duration * 1000)) as s:
        engine, clock = s.engine, s.clock
        reap_interval = s.sessions.reap_interval

        def reaper_waiting() -> bool:
            """The reaper thread waits on the clock (the only thing that does here): a move of the
            clock from now on wakes it."""
            return until(lambda: clock.pending == 1)

        base = _table_count(engine)
        clients, last_call = [], []
        for i in range(3):  # sessions last used one second apart: their leases end one second apart
            c = Client(s)
            c.stream(TABLE_SERVICE, "Batch", _chain_batch(1))
            s.advance(1.0)
            c.put_export(2, _quotes(20 + i))
            clients.append(c)
            last_call.append(clock.monotonic())
        assert until(lambda: _table_count(engine) == base + 3 * 4)
        assert s.sessions.count == 3
        # at the end of the first lease, not a moment before, nothing is freed
        assert reaper_waiting()
        clock.set(last_call[0] + duration)
        assert s.sessions.reap() == 0 and _table_count(engine) == base + 3 * 4
        # once the reaper has looked again (no call at all meanwhile), the first session's tables are gone
        assert reaper_waiting()
        clock.set(last_call[0] + duration + reap_interval)
        assert until(lambda: _table_count(engine) == base + 2 * 4), _table_count(engine) - base
        assert s.sessions.count == 2 and s.session_of(clients[1].token) is not None
        # then the others', each at the end of its own lease
        for c, t in zip(clients[1:], last_call[1:]):
            assert reaper_waiting()
            clock.set(t + duration + reap_interval)
            assert until(lambda c=c: s.session_of(c.token) is None)
        assert until(lambda: _table_count(engine) == base), _table_count(engine) - base
        assert s.sessions.count == 0 and s.ctx.ops.owned == 0
        # an expired token is refused, and nothing can be exported into the ended session
        assert _code(lambda: clients[0].where(b"s/quotes", ["Price > 1"], 5)) == grpc.StatusCode.UNAUTHENTICATED
        assert _table_count(engine) == base


def _subscribe(s: Services, clients: list) -> list:
    subs = []
    for c in clients:
        ex = s.exchange(token=c.token)
        ex.send(subscription_request(b"s/quotes"))
        ex.wait(1)  # the snapshot
        subs.append(ex)
    return subs


def _after_the_end(s: Services, stopped, going) -> None:
    """`stopped` (a subscription whose session ended) gets nothing more, its call open until the
    client half-closes (then OK); `going` (another session's) goes on."""
    assert until(lambda: len(s.ctx.registry.subscriptions) == 1)
    s.write(s.engine.resolve("quotes"), _quotes(2).set_column(1, "Price", pa.array([1.0, 2.0])))
    s.cycle()
    going.wait(2)
    assert going.updates[1].metadata.is_snapshot is False
    assert len(stopped.updates) == 1 and not stopped.done.is_set()
    for ex in (stopped, going):
        ex.half_close()
        assert ex.ended() is None  # OK


def test_a_subscription_stops_when_its_session_is_closed(served):
    """As Deephaven stops a closed session's Barrage subscriptions: nothing more is sent, the server
    lets the subscriber go, and the call stays open until the client half-closes (Deephaven never
    half-closes a Barrage stream before its client does); other sessions' subscriptions go on."""
    s = served
    a, b = Client(s), Client(s)
    subs = _subscribe(s, [a, b])
    assert len(s.ctx.registry.subscriptions) == 2
    s.call(SESSION_SERVICE, "CloseSession", session_pb2.HandshakeRequest(), token=a.token)
    _after_the_end(s, *subs)


def test_a_subscription_stops_when_its_session_expires():
    """A session whose lease runs out (no call at all, the subscription open) stops its
    subscriptions in the same way; a client that keeps its session alive (every call renews the
    lease) keeps them."""
    duration = 3.0
    with _services(session_duration_ms=int(duration * 1000)) as s:
        clock = s.clock
        a, b = Client(s), Client(s)
        subs = _subscribe(s, [a, b])
        for i in range(4):  # b keeps its session alive, a makes no call
            assert until(lambda: clock.pending == 1)  # the reaper waits on the clock
            s.advance(1.0)
            b.where(b"s/quotes", ["Price > 1"], 5 + i)
        assert until(lambda: s.session_of(a.token) is None) and s.session_of(b.token) is not None
        _after_the_end(s, *subs)


# -- no cross-session reads by name -------------------------------------------------------------------------


def test_a_session_table_is_reachable_by_no_name(served):
    s = served
    engine = s.engine
    owner, other = Client(s), Client(s)
    owner.where(b"s/quotes", ["Price > 100"], 1)
    owner.put_export(2, _quotes(30))
    s.cycle()
    names = _hidden_names(engine)
    assert len(names) == 2
    for who in (other, owner):  # not even the owner: only its export tickets reach them
        for name in names:
            for ticket in (b"s/" + name.encode(), b"a/scope/f/" + name.encode()):
                code = _code(who.doget, ticket)
                assert code == grpc.StatusCode.NOT_FOUND, (ticket, code)
                fetch = table_pb2.FetchTableRequest()
                fetch.source_id.ticket.ticket = ticket
                fetch.result_id.ticket = export_ticket(99)
                assert _code(who.unary, TABLE_SERVICE, "FetchTable", fetch) == grpc.StatusCode.NOT_FOUND
            for path in (["scope", name], ["app", "scope", "field", name]):
                desc = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.PATH, path=path)
                for method in ("GetFlightInfo", "GetSchema"):
                    code = _code(who.unary, FLIGHT_SERVICE, method, desc)
                    assert code == grpc.StatusCode.NOT_FOUND, (method, path, code)
    # nor can anyone append into one through its name
    before = {n: engine.resolve(n, hidden=True).size for n in names}
    for name in names:
        code, details = Services.status(lambda name=name: other.put(["scope", name], _quotes(3)))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "reserved" in details, (code, details)
    s.cycle()
    assert {n: engine.resolve(n, hidden=True).size for n in names} == before
    # the owner's export tickets still work; the other session's do not: its export 2 is an id it never
    # named, which (as in Deephaven, for a client that names the result of a call not made yet) is waited
    # for, and NOT_FOUND once export_wait_s of the engine's clock pass with no call of its own making it
    assert owner.doget(export_ticket(2)).num_rows == 30
    timers = s.clock.pending
    pending = s.background(lambda: _code(other.doget, export_ticket(2)))
    waiting = s.session_of(other.token)
    assert until(lambda: waiting.waiting(2) == 1 and s.clock.pending > timers)  # it waits on the clock
    assert not pending.done()
    assert s.advance_until(pending.done, s.config.export_wait_s)
    assert pending.result() == grpc.StatusCode.NOT_FOUND


def test_listings_show_no_session_table(served):
    s = served
    c = Client(s)
    c.stream(TABLE_SERVICE, "Batch", _chain_batch(1))
    c.put_export(2, _quotes(10))
    assert until(lambda: len(_hidden_names(s.engine)) == 4), _hidden_names(s.engine)
    flights = [tuple(fi.flight_descriptor.path) for fi in c.stream(FLIGHT_SERVICE, "ListFlights",
                                                                   flight_pb2.Criteria())]
    assert flights == [("scope", "quotes")]
    (result,) = c.stream(FLIGHT_SERVICE, "DoAction", flight_pb2.Action(type="list-tables", body=b""))
    assert [t["name"] for t in json.loads(result.body)] == ["quotes"]
    call = s.stream(APPLICATION_SERVICE, "ListFields", application_pb2.ListFieldsRequest(), token=c.token)
    first = next(iter(call))
    call.cancel()
    assert [f.field_name for f in first.created] == ["quotes"]


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


class SocketClient:
    """One Deephaven session over raw gRPC to a real server (the bearer token of its first call)."""

    def __init__(self, server):
        self.channel = grpc.insecure_channel(server.target)
        m = METHODS[f"/{CONFIG_SERVICE}/GetConfigurationConstants"]
        _r, call = self.channel.unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                            response_deserializer=m.response.FromString).with_call(
            config_pb2.ConfigurationConstantsRequest(), metadata=ANON)
        self.md = (("authorization", dict(call.initial_metadata())["authorization"]),)

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

    def close(self) -> None:
        self.channel.close()


@pytest.fixture(scope="module")
def dh(deephaven_server):
    with deephaven_server.tables(LC_SCRIPT) as server:
        yield server


@pytest.fixture(scope="module")
def tw():
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("lc_quotes", "static", data=_lc_rows()))
    server = TickwireServer(engine, port=0).start()
    yield server
    server.stop()
    engine.stop()


def _batch_shape(target) -> tuple[list, grpc.StatusCode]:
    c = SocketClient(target)
    try:
        batch = chain_batch(b"s/lc_quotes", 1, tail=7)
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


def _failing_batch_shape(target) -> tuple[list, grpc.StatusCode, grpc.StatusCode]:
    """A Batch of a step that fails once made (a natural_join whose right key Price repeats), a
    step made from it, an independent step and a step made from the second: each answer as
    (result_id, success, error_info with its references written <ref> and only the status kept of
    its cause), in result_id order; the call's status; and the status of the dependent's ticket."""
    c = SocketClient(target)
    try:
        batch = table_pb2.BatchTableRequest()
        nj = batch.ops.add().natural_join
        nj.left_id.ticket.ticket = nj.right_id.ticket.ticket = b"s/lc_quotes"
        nj.columns_to_match.append("Price")
        nj.columns_to_add.append("S2=Sym")
        head = batch.ops.add().head
        head.source_id.batch_offset, head.num_rows = 0, 1
        ok = batch.ops.add().head
        ok.source_id.ticket.ticket, ok.num_rows, ok.result_id.ticket = b"s/lc_quotes", 3, export_ticket(40)
        dep = batch.ops.add().tail
        dep.source_id.batch_offset, dep.num_rows, dep.result_id.ticket = 1, 1, export_ticket(41)
        m = METHODS[TABLE + "Batch"]
        call = c.channel.unary_stream(TABLE + "Batch", request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)(batch, metadata=c.md)
        got = []
        try:
            for r in call:
                got.append(r)
            code = grpc.StatusCode.OK
        except grpc.RpcError as exc:
            code = exc.code()
        refs = {}

        def ref(match) -> str:
            return refs.setdefault(match.group(0), f"<ref{len(refs)}>")

        shape = sorted((r.result_id.WhichOneof("ref"), r.result_id.batch_offset, r.result_id.ticket.ticket,
                        r.success, re.sub(r"(cause: [A-Z_]+):.*", r"\1", re.sub(r"[0-9a-f-]{36}", ref, r.error_info)))
                       for r in got)
        dependent = _code(c.unary, TABLE + "GetExportedTableCreationResponse",
                          ticket_pb2.Ticket(ticket=export_ticket(41)))
        c.release(40)  # the one export made (the later tests count what sessions leave behind)
        return shape, code, dependent
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.interop
def test_a_batch_step_that_fails_once_made_is_answered_in_the_stream_like_deephaven(tw, dh):
    got, dh_got = _failing_batch_shape(tw), _failing_batch_shape(dh)
    assert got == dh_got
    shape, code, dependent = got
    assert shape == [("batch_offset", 0, b"", False, "<ref0> cause: INVALID_ARGUMENT"),
                     ("batch_offset", 1, b"", False, "<ref0>"),
                     ("ticket", 0, export_ticket(40), True, ""),
                     ("ticket", 0, export_ticket(41), False, "<ref0>")]
    assert code == grpc.StatusCode.INVALID_ARGUMENT and dependent == grpc.StatusCode.FAILED_PRECONDITION


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
    assert until(lambda: tw.ctx.ops.owned == 0)  # the closed session left nothing behind


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


#: the deadline of the call below: Deephaven's never ends by itself after the session's end
CALL_BOUND_S = 40


def _subscription_after_close_session(target) -> tuple[int, bool, str]:
    """A raw Barrage subscription of one session, then CloseSession of that session, then the
    client's half-close: (messages read before the close, whether the stream was still open after
    the close and a call of another session, how the stream ended once the client half-closed)."""
    c, other = SocketClient(target), SocketClient(target)
    hold = threading.Event()

    def requests():
        yield from exchange_opening(subscription_request(b"s/lc_quotes"))
        hold.wait(CALL_BOUND_S)

    try:
        call = c.channel.stream_stream(f"/{FLIGHT_SERVICE}/DoExchange")(requests(), metadata=c.md,
                                                                        timeout=CALL_BOUND_S)
        it = iter(call)
        first = [next(it), next(it)]  # the schema and the snapshot's first message
        c.unary(SESSION + "CloseSession", session_pb2.HandshakeRequest())
        other.where(b"s/lc_quotes", ["Price > 100"], 1)  # a round trip after the close
        still_open = not call.done()
        hold.set()  # the client half-closes
        try:
            for _ in it:
                pass
            ended = "OK"
        except grpc.RpcError as exc:
            ended = exc.code().name
        return len(first), still_open, ended
    finally:
        hold.set()
        c.close()
        other.close()


@pytest.mark.slow
@pytest.mark.interop
def test_close_session_stops_its_subscriptions_like_deephaven(tw, dh):
    """Deephaven stops a closed session's subscriptions without ending their calls, and never half-
    closes a Barrage stream before its client: both servers keep the call open after the close.
    One difference, kept on purpose: once the client half-closes, tickwire ends the call with OK,
    where Deephaven 42.7 leaves it open until the client's deadline (the marshaller, closed with
    the session, no longer hears the half-close)."""
    got, dh_got = _subscription_after_close_session(tw), _subscription_after_close_session(dh)
    assert got[:2] == dh_got[:2] == (2, True)
    assert got[2] == "OK" and dh_got[2] == "DEADLINE_EXCEEDED"
