"""Exports named before they are made, and Release, answered as Deephaven 42.7 answers them.

Deephaven's JS API sends a Batch and, microseconds later, an ApplyPreviewColumns whose source is
the Batch's result, without waiting for the Batch's answer. A call naming an export its session
has not made yet waits for it: it gets the table once made, the maker's own status when the maker
fails, Deephaven's DEPENDENCY_CANCELLED status when the id is released or the session ends, and
NOT_FOUND when no call makes it within `ServerConfig.export_wait_s` of the engine's clock. Release
of a pending, failed or already released id is OK; of an id never named, UNAVAILABLE "Export not
yet defined".

The services run in process (tests.harness.Services); the waiting calls are started first, and a
test goes on once the server counts them as waiting (`Session.waiting`), never after a pause. The
comparisons with a real Deephaven server (slow, interop) use sockets."""
from __future__ import annotations

import concurrent.futures

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.harness import Services, chain_batch, until
from tests.test_server_rpc import sub_request
from tickwire.protocol import barrage
from tickwire.protocol.proto import config_pb2, flight_pb2, session_pb2, table_pb2, ticket_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE, FLIGHT_SERVICE, METHODS, SESSION_SERVICE, TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket
from tickwire.server.engine import TableSpec

SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int64())])
CANCELLED_WAIT = "Export in state DEPENDENCY_CANCELLED (related parent export id: {})"


def _quotes(n: int = 200) -> pa.Table:
    rng = np.random.default_rng(5)
    return pa.table({"Sym": [f"S{i:03d}" for i in range(n)], "Price": np.round(rng.uniform(90, 110, n), 2),
                     "Size": rng.integers(1, 1000, n)}, schema=SCHEMA)


@pytest.fixture
def served():
    with Services() as s:
        quotes = s.engine.create(TableSpec("quotes", "keyed", SCHEMA, keys=["Sym"]))
        s.write(quotes, _quotes())
        s.cycle()
        yield s


def _preview(source_id: int, result_id: int) -> table_pb2.ApplyPreviewColumnsRequest:
    req = table_pb2.ApplyPreviewColumnsRequest()
    req.source_id.ticket.ticket = export_ticket(source_id)
    req.result_id.ticket = export_ticket(result_id)
    return req


def _sort(source: bytes, result_id: int, column: str) -> table_pb2.SortTableRequest:
    req = table_pb2.SortTableRequest()
    req.source_id.ticket.ticket = source
    req.result_id.ticket = export_ticket(result_id)
    d = req.sorts.add()
    d.column_name, d.direction = column, table_pb2.SortDescriptor.ASCENDING
    return req


def _where(source: bytes, filters: list[str], result_id: int) -> table_pb2.UnstructuredFilterTableRequest:
    req = table_pb2.UnstructuredFilterTableRequest(filters=filters)
    req.source_id.ticket.ticket = source
    req.result_id.ticket = export_ticket(result_id)
    return req


def _chain_batch(source: bytes, result_id: int) -> table_pb2.BatchTableRequest:
    return chain_batch(source, result_id, sort_by="Sym", tail=50)


def _status(fn) -> tuple[grpc.StatusCode, str]:
    """(code, details) of a call: `fn()` runs it, or returns a future whose result is its answer."""
    try:
        out = fn()
        if isinstance(out, concurrent.futures.Future):
            out.result(timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


class Client:
    """One session of the in-process services (the bearer token of its first call)."""

    def __init__(self, s: Services):
        self.s = s
        _r, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants",
                                          config_pb2.ConfigurationConstantsRequest())
        self.token = dict(headers)["authorization"].split()[-1]
        self.session = s.session_of(self.token)

    def unary(self, service: str, method: str, request):
        return self.s.call(service, method, request, token=self.token)

    def later(self, service: str, method: str, request) -> concurrent.futures.Future:
        """The call, started on a thread of its own: its answer (or its error) is the future's."""
        return self.s.background(lambda: self.unary(service, method, request))

    def stream(self, service: str, method: str, request) -> list:
        return list(self.s.stream(service, method, request, token=self.token))

    def release(self, export_id: int) -> None:
        req = session_pb2.ReleaseRequest()
        req.id.ticket = export_ticket(export_id)
        self.unary(SESSION_SERVICE, "Release", req)

    def doget(self, ticket: bytes) -> pa.Table:
        return self.s.doget(ticket, token=self.token)

    def make(self, how: str, export_id: int) -> None:
        """Makes export `export_id` with one of the calls that make exports."""
        if how == "unstructured_filter":
            self.unary(TABLE_SERVICE, "UnstructuredFilter", _where(b"s/quotes", ["Price > 100"], export_id))
        elif how == "batch":
            self.stream(TABLE_SERVICE, "Batch", _chain_batch(b"s/quotes", export_id))
        elif how == "export_from_ticket":
            req = session_pb2.ExportRequest()
            req.source_id.ticket = b"s/quotes"
            req.result_id.ticket = export_ticket(export_id)
            self.unary(SESSION_SERVICE, "ExportFromTicket", req)
        else:
            self.s.put(["export", str(export_id)], _quotes(30), token=self.token)


@pytest.mark.parametrize("how", ["unstructured_filter", "batch", "export_from_ticket", "doput"])
def test_calls_naming_an_export_before_it_is_made_wait_for_it(served, how):
    s = served
    c = Client(s)
    waiters = {
        "ApplyPreviewColumns": c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(5, 6)),
        "Sort": c.later(TABLE_SERVICE, "Sort", _sort(export_ticket(5), 7, "Sym")),
        "GetExportedTableCreationResponse": c.later(TABLE_SERVICE, "GetExportedTableCreationResponse",
                                                    ticket_pb2.Ticket(ticket=export_ticket(5))),
        "DoGet": s.background(lambda: c.doget(export_ticket(5))),
    }
    sub, snap = s.exchange(token=c.token), s.exchange(token=c.token)
    sub.send(sub_request(ticket=export_ticket(5)))
    snap.send(barrage.wrap(barrage.SnapshotRequest(ticket=export_ticket(5),
                                                   options=barrage.SnapshotOptions(use_deephaven_nulls=True))))
    try:
        assert until(lambda: c.session.waiting(5) == 6), c.session.waiting(5)
        assert not any(f.done() for f in waiters.values()) and not sub.updates and not snap.updates
        c.make(how, 5)
        s.cycle()  # (a DoPut's rows enter its table on the next cycle)
        made = c.doget(export_ticket(5))
        preview, srt, creation = (waiters[k].result(60) for k in ("ApplyPreviewColumns", "Sort",
                                                                  "GetExportedTableCreationResponse"))
        assert preview.success and preview.result_id.ticket.ticket == export_ticket(6)
        assert srt.success and srt.result_id.ticket.ticket == export_ticket(7)
        assert creation.success and creation.result_id.ticket.ticket == export_ticket(5)
        got = waiters["DoGet"].result(60)
        assert got.schema.names == made.schema.names
        if how != "doput":  # (the waiting DoGet may read an upload's table before its rows arrive)
            assert got.equals(made) and preview.size == srt.size == creation.size == made.num_rows > 0
        assert c.doget(export_ticket(6)).equals(made)
        assert c.doget(export_ticket(7)).equals(made.sort_by("Sym"))
        for ex in (sub, snap):
            ex.wait(1)
            assert ex.error is None
        assert c.session.pending_count == 0
    finally:
        sub.half_close()
        snap.half_close()


def test_calls_waiting_for_an_export_whose_maker_fails_get_the_makers_status(served):
    s = served
    c = Client(s)
    waiters = [c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(5, 6)),
               c.later(TABLE_SERVICE, "GetExportedTableCreationResponse", ticket_pb2.Ticket(ticket=export_ticket(5))),
               s.background(lambda: c.stream(FLIGHT_SERVICE, "DoGet", flight_pb2.Ticket(ticket=export_ticket(5))))]
    assert until(lambda: c.session.waiting(5) == 3), c.session.waiting(5)
    maker = _status(lambda: c.unary(TABLE_SERVICE, "Sort", _sort(b"s/quotes", 5, "Nope")))
    assert maker[0] == grpc.StatusCode.INVALID_ARGUMENT and "Nope" in maker[1], maker
    # each waiter hears the maker's own status, as Deephaven forwards a failed export's status
    assert [_status(lambda w=w: w) for w in waiters] == [maker] * 3
    # named again later: the same answer, at once (Deephaven keeps failed exports)
    assert _status(lambda: c.unary(TABLE_SERVICE, "ApplyPreviewColumns", _preview(5, 8))) == maker
    assert c.session.pending_count == 0 and not c.session.exports
    # a Batch step that fails fails every result the batch had not made yet, with its status
    later = c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(12, 13))
    assert until(lambda: c.session.waiting(12) == 1)
    batch = table_pb2.BatchTableRequest()
    where = batch.ops.add().unstructured_filter
    where.source_id.ticket.ticket = b"s/quotes"
    where.filters.append("Price > 100")
    where.result_id.ticket = export_ticket(10)
    srt = batch.ops.add().sort
    srt.CopyFrom(_sort(b"", 11, "Nope"))
    srt.source_id.batch_offset = 0
    tail = batch.ops.add().tail
    tail.source_id.batch_offset = 1
    tail.num_rows = 3
    tail.result_id.ticket = export_ticket(12)
    failed = _status(lambda: c.stream(TABLE_SERVICE, "Batch", batch))
    assert failed[0] == grpc.StatusCode.INVALID_ARGUMENT and "Nope" in failed[1], failed
    assert _status(lambda: later) == failed
    assert sorted(c.session.exports) == [10]  # what the batch made before the failing step stays
    # a failed id can be made again, and Release of a failed id is OK (as Deephaven answers)
    c.release(11)
    c.unary(TABLE_SERVICE, "UnstructuredFilter", _where(b"s/quotes", ["Price > 100"], 5))
    assert c.doget(export_ticket(5)).num_rows > 0


def test_a_name_no_call_makes_is_not_found_once_the_configured_wait_has_passed(served):
    s = served
    c = Client(s)
    wait_s = s.ctx.config.export_wait_s
    calls = [c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(9, 10)),
             c.later(TABLE_SERVICE, "GetExportedTableCreationResponse", ticket_pb2.Ticket(ticket=export_ticket(9))),
             s.background(lambda: c.stream(FLIGHT_SERVICE, "DoGet", flight_pb2.Ticket(ticket=export_ticket(9)))),
             c.later(TABLE_SERVICE, "Sort", _sort(export_ticket(9), 11, "Sym"))]
    assert until(lambda: c.session.waiting(9) == 4)
    s.advance(wait_s - 1)  # not yet: they still wait
    assert until(lambda: c.session.waiting(9) == 4) and not any(f.done() for f in calls)
    s.advance(1)
    for call in calls:
        code, msg = _status(lambda call=call: call)
        assert code == grpc.StatusCode.NOT_FOUND and "export 9 does not exist in this session" in msg, (code, msg)
    assert c.session.pending_count == 0 and sorted(c.session.exports) == []
    # the calls that gave up left nothing behind: the ids can still be made and named
    c.unary(TABLE_SERVICE, "UnstructuredFilter", _where(b"s/quotes", ["Price > 100"], 9))
    assert c.unary(TABLE_SERVICE, "ApplyPreviewColumns", _preview(9, 10)).success
    assert c.unary(TABLE_SERVICE, "Sort", _sort(export_ticket(9), 11, "Sym")).success


def test_release_or_the_sessions_end_ends_the_wait_as_deephaven_does(served):
    s = served
    c = Client(s)
    # Release of an id nobody has made yet: OK, and its waiters are told it was cancelled
    waiters = [c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(20, 21)),
               s.background(lambda: c.stream(FLIGHT_SERVICE, "DoGet", flight_pb2.Ticket(ticket=export_ticket(20))))]
    assert until(lambda: c.session.waiting(20) == 2)
    c.release(20)
    cancelled = (grpc.StatusCode.FAILED_PRECONDITION, CANCELLED_WAIT.format(20))
    assert [_status(lambda w=w: w) for w in waiters] == [cancelled] * 2
    assert _status(lambda: c.unary(TABLE_SERVICE, "ApplyPreviewColumns", _preview(20, 22))) == cancelled
    # Release of a result whose maker is still running (waiting for its own source): the maker
    # answers CANCELLED and keeps nothing; the result's waiters are told it was cancelled
    maker = c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(30, 31))
    waiter = c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(31, 32))
    assert until(lambda: c.session.waiting(30) == 1 and c.session.waiting(31) == 1)
    c.release(31)
    assert _status(lambda: waiter) == (grpc.StatusCode.FAILED_PRECONDITION, CANCELLED_WAIT.format(31))
    c.unary(TABLE_SERVICE, "UnstructuredFilter", _where(b"s/quotes", ["Price > 100"], 30))
    assert _status(lambda: maker) == (grpc.StatusCode.CANCELLED, "Export is cancelled")
    assert sorted(c.session.exports) == [30]
    # the session's end: every wait ends the same way
    waiters = [c.later(TABLE_SERVICE, "ApplyPreviewColumns", _preview(40, 41)),
               c.later(TABLE_SERVICE, "GetExportedTableCreationResponse", ticket_pb2.Ticket(ticket=export_ticket(40))),
               s.background(lambda: c.stream(FLIGHT_SERVICE, "DoGet", flight_pb2.Ticket(ticket=export_ticket(40))))]
    assert until(lambda: c.session.waiting(40) == 3)
    c.unary(SESSION_SERVICE, "CloseSession", session_pb2.HandshakeRequest())
    cancelled = (grpc.StatusCode.FAILED_PRECONDITION, CANCELLED_WAIT.format(40))
    assert [_status(lambda w=w: w) for w in waiters] == [cancelled] * 3
    assert s.ctx.ops.owned == 0


def test_release_answers_as_deephaven_does(served):
    c = Client(served)
    c.unary(TABLE_SERVICE, "UnstructuredFilter", _where(b"s/quotes", ["Price > 100"], 1))
    c.release(1)
    c.release(1)  # already released: OK
    assert _status(lambda: c.doget(export_ticket(1)))[0] == grpc.StatusCode.NOT_FOUND
    code, details = _status(lambda: c.release(77))  # never named by this session
    assert (code, details) == (grpc.StatusCode.UNAVAILABLE, "Export not yet defined")


# -- the same calls against a real Deephaven server ------------------------------------------------------------

class RawClient:
    """One Deephaven session over a real gRPC channel (the bearer token of its first call)."""

    def __init__(self, target: str):
        self.channel = grpc.insecure_channel(target)
        m = METHODS[f"/{CONFIG_SERVICE}/GetConfigurationConstants"]
        fn = self.channel.unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)
        _r, call = fn.with_call(m.request(), metadata=(("authorization", "Anonymous"),), timeout=60)
        self.md = (("authorization", dict(call.initial_metadata())["authorization"]),)

    def unary(self, service: str, method: str, request, timeout: float = 60):
        m = METHODS[f"/{service}/{method}"]
        fn = self.channel.unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)
        return fn(request, metadata=self.md, timeout=timeout)

    def future(self, service: str, method: str, request):
        m = METHODS[f"/{service}/{method}"]
        fn = self.channel.unary_unary(m.path, request_serializer=m.request.SerializeToString,
                                      response_deserializer=m.response.FromString)
        return fn.future(request, metadata=self.md, timeout=60)

    def release(self, export_id: int) -> None:
        req = session_pb2.ReleaseRequest()
        req.id.ticket = export_ticket(export_id)
        self.unary(SESSION_SERVICE, "Release", req)

    def close(self) -> None:
        self.channel.close()


def _answers(target: str, table: bytes) -> dict:
    """How a server answers: calls naming an export before it is made (a dependent of a maker that
    fails, and a later one; a dependent of a maker that succeeds; a dependent of an id released
    before anything made it), and Release of a released id and of one never named."""
    c = RawClient(target)
    try:
        dep = c.future(TABLE_SERVICE, "ApplyPreviewColumns", _preview(5, 6))
        maker = _status(lambda: c.unary(TABLE_SERVICE, "Sort", _sort(table, 5, "Nope")))
        later = _status(lambda: c.unary(TABLE_SERVICE, "ApplyPreviewColumns", _preview(5, 7)))
        failed = (maker[0] != grpc.StatusCode.OK, _status(lambda: dep.result(60)) == maker, later == maker)
        dep = c.future(TABLE_SERVICE, "ApplyPreviewColumns", _preview(8, 9))
        c.unary(TABLE_SERVICE, "UnstructuredFilter", _where(table, ["Price > 100"], 8))
        made = dep.result(60).success
        dep = c.future(TABLE_SERVICE, "ApplyPreviewColumns", _preview(20, 21))
        # Release of an id the server has not heard of yet is refused ('Export not yet defined'):
        # asked until the waiting call has named it
        assert until(lambda: _status(lambda: c.release(20))[0] == grpc.StatusCode.OK, 30)
        released = _status(lambda: dep.result(60))
        c.release(8)
        again = _status(lambda: c.release(8))
        never = _status(lambda: c.release(4242))
        return {"failed": failed, "made": made, "released": released, "release_again": again,
                "release_never_named": never}
    finally:
        c.close()


@pytest.mark.slow
@pytest.mark.interop
def test_pending_exports_and_release_are_answered_like_deephaven(deephaven_server):
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    dh = deephaven_server
    engine = Engine(interval_ms=50)
    quotes = engine.create(TableSpec("pe_quotes", "keyed", SCHEMA, keys=["Sym"]))
    engine.write(quotes, _quotes(), wait=False)
    server = TickwireServer(engine, port=0, web=False).start()
    try:
        script = ("from deephaven import new_table\n"
                  "from deephaven.column import string_col, double_col, long_col\n"
                  "pe_quotes = new_table([string_col('Sym', ['S000', 'S001', 'S002']), "
                  "double_col('Price', [99.0, 101.0, 105.0]), long_col('Size', [1, 2, 3])])\n")
        with dh.tables(script):
            got, dh_got = _answers(server.target, b"s/pe_quotes"), _answers(dh.target, b"s/pe_quotes")
    finally:
        server.stop()
        engine.stop()
    assert got == dh_got
    assert got == {"failed": (True, True, True), "made": True,
                   "released": (grpc.StatusCode.FAILED_PRECONDITION, CANCELLED_WAIT.format(20)),
                   "release_again": (grpc.StatusCode.OK, ""),
                   "release_never_named": (grpc.StatusCode.UNAVAILABLE, "Export not yet defined")}


def test_the_wait_counts_from_the_call_not_from_when_its_timer_first_runs():
    # the clock moves between the call starting to wait and its timer task's first step (as a
    # loaded machine may let happen): the wait still ends `timeout` after the call began
    import asyncio

    from tickwire.clock import ManualClock
    from tickwire.server.services.sessions import ResolveError, Session

    clock = ManualClock()
    session = Session(token="t", expires=float("inf"))

    async def main() -> str:
        call = asyncio.ensure_future(session.wait_for(9, 30.0, clock))
        await asyncio.sleep(0)  # the call is waiting; its timer task has not run yet
        assert session.waiting(9) == 1
        clock.advance(30.0)
        try:
            await asyncio.wait_for(call, 30)
        except ResolveError as exc:
            return exc.code
        return "answered"

    assert asyncio.run(main()) == "NOT_FOUND"
