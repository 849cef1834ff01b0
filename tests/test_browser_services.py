"""The gRPC methods Deephaven's browser JavaScript API calls besides the data path, against a real
server over grpc: GetAuthenticationConstants before any login, TerminationNotification held open
until the session ends or the server stops, ListFields and ExportedTableUpdates streams that end
with their session, ApplyPreviewColumns, and StorageService.ListItems, compared with what
Deephaven 42.7 answered in the browser captures (../shared/golden/browser_dh_*)."""
from __future__ import annotations

import asyncio
import queue
import threading
import time

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.golden import GOLDEN, read_cap
from tickwire.protocol.proto import config_pb2, session_pb2, storage_pb2, table_pb2, ticket_pb2
from tickwire.protocol.proto.methods import METHODS
from tickwire.protocol.tickets import export_ticket
from tickwire.server.app import TickwireServer
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.services.config_service import ANONYMOUS_HANDLER, PSK_HANDLER
from tickwire.server.services.sessions import PSK_SCHEME

DH = "/io.deephaven.proto.backplane.grpc."
AUTH_CONSTANTS = DH + "ConfigService/GetAuthenticationConstants"
CONFIG = DH + "ConfigService/GetConfigurationConstants"
TERMINATION = DH + "SessionService/TerminationNotification"
CLOSE = DH + "SessionService/CloseSession"
RELEASE = DH + "SessionService/Release"
LIST_FIELDS = DH + "ApplicationService/ListFields"
FETCH = DH + "TableService/FetchTable"
PREVIEW = DH + "TableService/ApplyPreviewColumns"
UPDATES = DH + "TableService/ExportedTableUpdates"
LIST_ITEMS = DH + "StorageService/ListItems"
ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])
WIDGET = GOLDEN / "browser_dh_widget"
needs_widget_capture = pytest.mark.skipif(not WIDGET.exists(), reason="no browser_dh_widget golden capture")


def rows(start: int, n: int) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 1.5, "s": [f"r{x}" for x in k.tolist()]}, schema=SCHEMA)


def make_server(**kw) -> tuple[Engine, TickwireServer]:
    """A server on an engine the test steps (`engine.run_cycle()`): no cycle runs on its own."""
    engine = Engine(interval_ms=3_600_000)
    keyed = engine.create(TableSpec("keyed", "keyed", SCHEMA, keys=("k",)))
    engine.write(keyed, rows(0, 200), wait=False)
    engine.create(TableSpec("static", "static", data=rows(0, 50)))
    engine.run_cycle()
    kw.setdefault("config", ServerConfig(list_fields_poll_s=0.05))
    return engine, TickwireServer(engine, port=0, start_engine=False, **kw).start()


@pytest.fixture()
def served():
    engine, srv = make_server()
    ch = grpc.insecure_channel(srv.target)
    yield engine, srv, ch
    ch.close()
    srv.stop()
    engine.stop()


def unary(channel, path, request, metadata=ANON, timeout=10.0):
    m = METHODS[path]
    return channel.unary_unary(path, request_serializer=m.request.SerializeToString,
                               response_deserializer=m.response.FromString)(request, metadata=metadata,
                                                                             timeout=timeout)


def raw_unary(channel, path, body: bytes, metadata=ANON, timeout=10.0):
    return channel.unary_unary(path).with_call(body, metadata=metadata, timeout=timeout)


def login(channel) -> tuple[tuple, str]:
    """(metadata carrying a new session's bearer token, the token)."""
    call_config = channel.unary_unary(CONFIG,
                                      request_serializer=config_pb2.ConfigurationConstantsRequest.SerializeToString,
                                      response_deserializer=config_pb2.ConfigurationConstantsResponse.FromString)
    _r, call = call_config.with_call(config_pb2.ConfigurationConstantsRequest(), metadata=ANON, timeout=10)
    bearer = dict(call.initial_metadata())["authorization"]
    return (("authorization", bearer),), bearer.split(" ", 1)[1]


def fetch(channel, md, name: str, eid: int) -> table_pb2.ExportedTableCreationResponse:
    req = table_pb2.FetchTableRequest()
    req.source_id.ticket.ticket = b"s/" + name.encode()
    req.result_id.ticket = export_ticket(eid)
    return unary(channel, FETCH, req, md)


class Stream:
    """A server stream read on a thread: messages in a queue, then its end (code, details)."""

    def __init__(self, channel, path, metadata):
        m = METHODS[path]
        self.call = channel.unary_stream(path, request_serializer=m.request.SerializeToString,
                                         response_deserializer=m.response.FromString)(m.request(), metadata=metadata)
        self.messages: queue.Queue = queue.Queue()
        self.end: tuple | None = None
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for msg in self.call:
                self.messages.put(msg)
            self.end = (grpc.StatusCode.OK, "")
        except grpc.RpcError as exc:
            self.end = (exc.code(), exc.details())
        finally:
            self.done.set()

    def next(self, timeout=5.0):
        return self.messages.get(timeout=timeout)

    def ended(self, timeout=5.0) -> tuple:
        assert self.done.wait(timeout), "the stream did not end"
        return self.end

    def cancel(self):
        self.call.cancel()


class Held:
    """A unary call held open by the server, waited for on a thread."""

    def __init__(self, channel, path, request, metadata):
        m = METHODS[path]
        method = channel.unary_unary(path, request_serializer=m.request.SerializeToString,
                                     response_deserializer=m.response.FromString)
        self.future = method.future(request, metadata=metadata)

    def result(self, timeout=5.0):
        return self.future.result(timeout=timeout)

    def status(self, timeout=5.0) -> tuple:
        exc = self.future.exception(timeout=timeout)
        assert exc is not None, "the call answered instead of failing"
        return exc.code(), exc.details()


# -- ConfigService.GetAuthenticationConstants --------------------------------------------------------------------

def test_authentication_constants_answer_without_credentials_and_name_the_anonymous_handler(served):
    _engine, srv, ch = served
    body, call = raw_unary(ch, AUTH_CONSTANTS, b"", metadata=())
    resp = config_pb2.AuthenticationConstantsResponse.FromString(body)
    assert dict(resp.config_values).keys() == {"AuthHandlers"}
    assert resp.config_values["AuthHandlers"].string_value == ANONYMOUS_HANDLER
    assert "authorization" not in dict(call.initial_metadata())  # no session was opened for it
    assert srv.sessions.count == 0
    # credentials that would be refused elsewhere do not matter either
    body2, _ = raw_unary(ch, AUTH_CONSTANTS, b"", metadata=(("authorization", "Bearer not-a-token"),))
    assert body2 == body


@needs_widget_capture
def test_authentication_constants_are_the_bytes_deephaven_sent(served):
    _engine, _srv, ch = served
    golden = [r.payload for r in read_cap(WIDGET / "0001_ConfigService_GetAuthenticationConstants.cap")
              if r.direction == "S"]
    body, _ = raw_unary(ch, AUTH_CONSTANTS, b"", metadata=())
    assert [body] == golden


def test_authentication_constants_name_the_psk_handler_when_the_server_has_a_key():
    engine, srv = make_server(psk="s3cret")
    try:
        with grpc.insecure_channel(srv.target) as ch:
            for md in ((), ANON, (("authorization", f"{PSK_SCHEME} wrong"),)):
                body, _ = raw_unary(ch, AUTH_CONSTANTS, b"", metadata=md)
                resp = config_pb2.AuthenticationConstantsResponse.FromString(body)
                assert resp.config_values["AuthHandlers"].string_value == PSK_HANDLER
                assert PSK_HANDLER == "io.deephaven.authentication.psk.PskAuthenticationHandler"
            # the rest still wants the key
            with pytest.raises(grpc.RpcError) as e:
                unary(ch, CONFIG, config_pb2.ConfigurationConstantsRequest(), ANON)
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert srv.sessions.count == 0
    finally:
        srv.stop()
        engine.stop()


# -- SessionService.TerminationNotification ----------------------------------------------------------------------

def test_termination_notification_is_held_then_ends_unauthenticated_on_close_session(served):
    _engine, srv, ch = served
    md, _token = login(ch)
    held = Held(ch, TERMINATION, session_pb2.TerminationNotificationRequest(), md)
    time.sleep(0.5)
    assert not held.future.done()  # held open while the session lives
    unary(ch, CLOSE, session_pb2.HandshakeRequest(), md)
    assert held.status() == (grpc.StatusCode.UNAUTHENTICATED, "Session has ended")


def test_termination_notification_ends_when_the_session_expires():
    duration = 1.0  # long enough that the call below still finds its session after a stall
    engine, srv = make_server(session_duration_ms=int(duration * 1000))
    try:
        with grpc.insecure_channel(srv.target) as ch:
            md, _token = login(ch)
            # taken before the call, which renews the session's lease when the server reads it: the
            # session expires no earlier than t0 + duration
            t0 = time.monotonic()
            held = Held(ch, TERMINATION, session_pb2.TerminationNotificationRequest(), md)
            assert held.status(timeout=15) == (grpc.StatusCode.UNAUTHENTICATED, "Session has ended")
            assert time.monotonic() - t0 >= duration - 0.05  # not at once: when the session expired
            assert srv.sessions.count == 0
    finally:
        srv.stop()
        engine.stop()


def test_termination_notification_answers_when_the_server_stops_its_sessions(served):
    """SessionManager.stop (what stopping the server calls) tells every held TerminationNotification,
    which answers (abnormal_termination false) instead of failing; the session itself lives on."""
    _engine, srv, ch = served
    md, _token = login(ch)
    held = Held(ch, TERMINATION, session_pb2.TerminationNotificationRequest(), md)
    time.sleep(0.3)
    assert not held.future.done()
    srv.sessions.stop()
    resp = held.result()
    assert isinstance(resp, session_pb2.TerminationNotificationResponse)
    assert resp.abnormal_termination is False and resp.reason
    assert srv.sessions.count == 1


def test_stopping_the_server_answers_held_termination_notifications_on_both_transports():
    """TickwireServer.stop tells its sessions first, so a held TerminationNotification answers
    (gRPC and websocket alike) before the transports close."""
    import asyncio

    from tickwire.clients.websocket import WebsocketChannel

    engine, srv = make_server()
    ch = grpc.insecure_channel(srv.target)
    md, _token = login(ch)
    held = Held(ch, TERMINATION, session_pb2.TerminationNotificationRequest(), md)

    async def browser():
        ws = await WebsocketChannel.connect(srv.web_url)
        call = await ws.open(TERMINATION, {"authorization": "Anonymous"})
        await call.send(b"", half_close=True)
        await asyncio.sleep(0.3)
        assert call.status is None  # held open
        await asyncio.get_running_loop().run_in_executor(None, srv.stop)
        got = [m async for m in call]
        await ws.close()
        return call.status, got

    try:
        status, got = asyncio.run(asyncio.wait_for(browser(), 30))
    finally:
        srv.stop()
        engine.stop()
        ch.close()
    assert status == 0 and len(got) == 1
    resp = session_pb2.TerminationNotificationResponse.FromString(got[0])
    assert resp.abnormal_termination is False and resp.reason
    grpc_resp = held.result()
    assert isinstance(grpc_resp, session_pb2.TerminationNotificationResponse) and grpc_resp.reason


def test_termination_notification_for_an_ended_session_is_unauthenticated(served):
    _engine, _srv, ch = served
    md, _token = login(ch)
    unary(ch, CLOSE, session_pb2.HandshakeRequest(), md)
    held = Held(ch, TERMINATION, session_pb2.TerminationNotificationRequest(), md)
    assert held.status()[0] == grpc.StatusCode.UNAUTHENTICATED


# -- ApplicationService.ListFields -------------------------------------------------------------------------------

def _names(update) -> list[str]:
    return [f.field_name for f in update.created]


def test_list_fields_lists_then_follows_then_ends_cancelled_on_close_session(served):
    engine, _srv, ch = served
    md, _token = login(ch)
    s = Stream(ch, LIST_FIELDS, md)
    first = s.next()
    assert _names(first) == ["keyed", "static"] and not first.removed
    assert first.created[0].typed_ticket.ticket.ticket == b"s/keyed"
    engine.create(TableSpec("later", "static", data=rows(0, 3)))
    upd = s.next()
    assert _names(upd) == ["later"] and not upd.removed
    engine.drop("later")
    upd = s.next()
    assert not upd.created and [f.field_name for f in upd.removed] == ["later"]
    unary(ch, CLOSE, session_pb2.HandshakeRequest(), md)
    assert s.ended() == (grpc.StatusCode.CANCELLED, "subscription cancelled")


def test_list_fields_streams_share_one_watcher_that_ends_with_them(served):
    engine, _srv, ch = served
    md, _token = login(ch)

    def watchers():
        return [t for t in threading.enumerate() if t.name == "tickwire-scope-watch"]

    streams = [Stream(ch, LIST_FIELDS, md) for _ in range(4)]
    for s in streams:
        assert _names(s.next()) == ["keyed", "static"]
    assert len(watchers()) == 1
    engine.create(TableSpec("more", "static", data=rows(0, 2)))
    for s in streams:
        assert _names(s.next()) == ["more"]
    for s in streams:
        s.cancel()
    deadline = time.monotonic() + 5
    while watchers() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert watchers() == []
    # a new stream starts it again and sees what exists now
    s = Stream(ch, LIST_FIELDS, md)
    assert _names(s.next()) == ["keyed", "static", "more"]
    s.cancel()


def test_list_fields_answers_while_another_thread_holds_a_cycle_boundary(served):
    engine, _srv, ch = served
    md, _token = login(ch)
    held, release = threading.Event(), threading.Event()

    def hold():
        with engine.reading():  # what a long cycle over a large table does: no cycle, no catalog change
            held.set()
            release.wait(60)

    t = threading.Thread(target=hold, daemon=True)
    t.start()
    assert held.wait(5)
    try:
        t0 = time.monotonic()
        s = Stream(ch, LIST_FIELDS, md)
        assert _names(s.next(timeout=10)) == ["keyed", "static"]
        first = time.monotonic() - t0
        # the event loop is free meanwhile: another call answers at once too
        t1 = time.monotonic()
        unary(ch, CONFIG, config_pb2.ConfigurationConstantsRequest(), md, timeout=10)
        other = time.monotonic() - t1
        time.sleep(0.3)  # the shared watcher polls several times under the held lock
        unary(ch, CONFIG, config_pb2.ConfigurationConstantsRequest(), md, timeout=10)
        # well before the holder lets go (60 s): answers that waited for the lock would not come
        assert first < 5.0 and other < 5.0, (first, other)
        assert t.is_alive()  # all of it happened while the lock was held: the holder has not let go
    finally:
        release.set()
        t.join(5)
    s.cancel()


# -- TableService.ExportedTableUpdates ---------------------------------------------------------------------------

def _update(msg) -> tuple[bytes, int, str]:
    return msg.export_id.ticket, msg.size, msg.update_failure_message


def test_exported_table_updates_report_sizes_then_changes_then_end_on_close_session(served):
    engine, _srv, ch = served
    md, _token = login(ch)
    fetch(ch, md, "keyed", 1)
    s = Stream(ch, UPDATES, md)
    assert _update(s.next()) == (export_ticket(1), 200, "")
    fetch(ch, md, "static", 2)
    assert _update(s.next()) == (export_ticket(2), 50, "")
    keyed = engine.resolve("keyed")
    engine.write(keyed, rows(200, 10), wait=False)  # keyed: 10 new keys
    engine.run_cycle()
    assert _update(s.next()) == (export_ticket(1), 210, "")
    engine.write(keyed, rows(0, 10), wait=False)  # same keys: modified, not a size change
    engine.run_cycle()
    with pytest.raises(queue.Empty):
        s.next(timeout=0.4)
    unary(ch, RELEASE, session_pb2.ReleaseRequest(id=ticket_pb2.Ticket(ticket=export_ticket(2))), md)
    fetch(ch, md, "keyed", 2)  # a new export under a released id is new again
    assert _update(s.next()) == (export_ticket(2), 210, "")
    unary(ch, CLOSE, session_pb2.HandshakeRequest(), md)
    assert s.ended() == (grpc.StatusCode.OK, "")  # as Deephaven ends it


def test_exported_table_updates_see_only_their_own_session(served):
    _engine, _srv, ch = served
    md_a, _ = login(ch)
    md_b, _ = login(ch)
    fetch(ch, md_a, "keyed", 1)
    s = Stream(ch, UPDATES, md_b)
    with pytest.raises(queue.Empty):
        s.next(timeout=0.4)
    fetch(ch, md_b, "static", 7)
    assert _update(s.next()) == (export_ticket(7), 50, "")
    s.cancel()


def test_exported_table_updates_ends_when_cancelled_as_an_export_wakes_it():
    """A browser's socket closing cancels its ExportedTableUpdates stream. Python 3.11's
    asyncio.wait_for, which the stream waited with, returns the awaited result instead of raising
    when its task is cancelled in the loop iteration that result arrives: a stream cancelled just as
    an export changed ran on, and the closed socket, which waits for its streams to end, never
    ended. Cancelled at each step of its wake-up (the handler run on this test's loop), it ends."""
    from tickwire.server.services.table_service import TableService

    engine, srv = make_server(config=ServerConfig(list_fields_poll_s=3600.0))
    try:
        service = next(s for s in srv.services if isinstance(s, TableService))
        table = engine.resolve("static")

        class Context:
            def __init__(self, md):
                self.md = md

            def invocation_metadata(self):
                return self.md

            async def send_initial_metadata(self, _md):
                pass

        async def trial(step: int) -> bool:
            session = srv.sessions.authenticate(ANON)
            updates = service.exported_table_updates(None, Context((("authorization", f"Bearer {session.token}"),)))
            seen = asyncio.Queue()

            async def read():
                async for msg in updates:
                    seen.put_nowait(msg)

            task = asyncio.ensure_future(read())
            await asyncio.sleep(0)  # the stream starts and listens for its session's exports
            session.export(1, table)
            await seen.get()  # reported: the stream waits for the next change
            for _ in range(3):
                await asyncio.sleep(0)
            session.export(2, table)  # wakes it ...
            for _ in range(step):
                await asyncio.sleep(0)
            task.cancel()  # ... as its socket closes
            done, _pending = await asyncio.wait({task}, timeout=10)
            if not done:
                task.cancel()
                await asyncio.wait({task}, timeout=10)
            srv.sessions.close(session)
            return bool(done) and task.cancelled()

        async def trials() -> list[bool]:
            return [await trial(k) for k in range(8)]  # one after the other: each counts its own steps

        ended = asyncio.run(trials())
        assert ended == [True] * 8, ended
    finally:
        srv.stop()


# -- TableService.ApplyPreviewColumns ----------------------------------------------------------------------------

def test_apply_preview_columns_exports_the_source_table(served):
    _engine, srv, ch = served
    md, token = login(ch)
    fetched = fetch(ch, md, "keyed", 1)
    req = table_pb2.ApplyPreviewColumnsRequest(convert_arrays=True, unpreviewed_types=["long", "java.lang.String"])
    req.source_id.ticket.ticket = export_ticket(1)
    req.result_id.ticket = export_ticket(2)
    resp = unary(ch, PREVIEW, req, md)
    assert resp.success and resp.result_id.ticket.ticket == export_ticket(2)
    assert (resp.size, resp.is_static, resp.schema_header) == (fetched.size, fetched.is_static, fetched.schema_header)
    assert resp.size == 200 and not resp.is_static
    # e/2 serves the same rows (and stays when e/1 is released)
    unary(ch, RELEASE, session_pb2.ReleaseRequest(id=ticket_pb2.Ticket(ticket=export_ticket(1))), md)
    client = fl.FlightClient(f"grpc://{srv.target}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", f"Bearer {token}".encode())])
    got = client.do_get(fl.Ticket(export_ticket(2)), options=opts).read_all()
    assert sorted(got.column("k").to_pylist()) == list(range(200))
    client.close()
    # without a result ticket it is refused like the other operations
    bad = table_pb2.ApplyPreviewColumnsRequest()
    bad.source_id.ticket.ticket = b"s/keyed"
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, PREVIEW, bad, md)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@needs_widget_capture
def test_apply_preview_columns_takes_the_browsers_request(served):
    _engine, _srv, ch = served
    md, _token = login(ch)
    fetch(ch, md, "keyed", 1)
    body = next(r.payload for r in read_cap(WIDGET / "0009_TableService_ApplyPreviewColumns.cap") if r.direction == "C")
    req = table_pb2.ApplyPreviewColumnsRequest.FromString(body)
    assert req.source_id.ticket.ticket == export_ticket(1) and req.result_id.ticket == export_ticket(2)
    out, _ = raw_unary(ch, PREVIEW, body, md)
    resp = table_pb2.ExportedTableCreationResponse.FromString(out)
    assert resp.success and resp.result_id.ticket.ticket == export_ticket(2) and resp.size == 200


def test_apply_preview_columns_in_a_batch(served):
    _engine, _srv, ch = served
    md, _token = login(ch)
    req = table_pb2.BatchTableRequest()
    op = req.ops.add()
    op.fetch_table.source_id.ticket.ticket = b"s/static"
    op = req.ops.add()
    op.apply_preview_columns.source_id.batch_offset = 0
    op.apply_preview_columns.result_id.ticket = export_ticket(3)
    m = METHODS[DH + "TableService/Batch"]
    out = list(ch.unary_stream(m.path, request_serializer=m.request.SerializeToString,
                               response_deserializer=m.response.FromString)(req, metadata=md, timeout=10))
    assert [r.success for r in out] == [True, True]
    assert out[1].result_id.ticket.ticket == export_ticket(3) and out[1].size == 50


# -- StorageService ----------------------------------------------------------------------------------------------

@needs_widget_capture
def test_list_items_answers_the_bytes_deephaven_sent(served):
    _engine, _srv, ch = served
    md, _token = login(ch)
    records = read_cap(WIDGET / "0006_StorageService_ListItems.cap")
    request = next(r.payload for r in records if r.direction == "C")
    golden = [r.payload for r in records if r.direction == "S"]
    body, _ = raw_unary(ch, LIST_ITEMS, request, md)
    assert [body] == golden
    assert body == b"\x12\x01/"  # 3 bytes: no items, canonical_path "/"


def test_list_items_is_empty_everywhere_and_checks_its_input(served):
    _engine, srv, ch = served
    md, _token = login(ch)
    for path, canonical in (("", "/"), ("/", "/"), ("layouts", "/layouts"), ("/a/./b/../c", "/a/c")):
        resp = unary(ch, LIST_ITEMS, storage_pb2.ListItemsRequest(path=path), md)
        assert (list(resp.items), resp.canonical_path) == ([], canonical)
    for req in (storage_pb2.ListItemsRequest(path="../etc"), storage_pb2.ListItemsRequest(filter_glob="**.json"),
                storage_pb2.ListItemsRequest(filter_glob="a/*.json")):
        with pytest.raises(grpc.RpcError) as e:
            unary(ch, LIST_ITEMS, req, md)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # it wants a session like every other call; the rest of the service is not there
    with pytest.raises(grpc.RpcError) as e:
        unary(ch, LIST_ITEMS, storage_pb2.ListItemsRequest(), ())
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(ch, DH + "StorageService/FetchFile", b"", md)
    assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED and "StorageService.FetchFile" in e.value.details()
    assert DH + "StorageService/SaveFile" in srv.method_paths


def test_doput_over_the_websocket_writes_the_table():
    """A DoPut on the browsers' websocket, as on the gRPC port: the table is made and written
    once the upload's stream ends."""
    import asyncio

    from tickwire.clients.websocket import WebsocketChannel
    from tickwire.protocol.opening import put_batches, put_opening
    from tickwire.protocol.proto.methods import FLIGHT_SERVICE

    engine, srv = make_server()
    data = rows(0, 30)

    async def browser():
        async with await WebsocketChannel.connect(srv.web_url) as ws:
            call = await ws.open(f"/{FLIGHT_SERVICE}/DoPut", {"authorization": "Anonymous"})
            messages = put_opening(["scope", "uploaded"], data.schema) + put_batches(data)
            for i, m in enumerate(messages):
                await call.send(m, half_close=i == len(messages) - 1)
            got = [m async for m in call]
            return call.status, call.message, got

    try:
        status, message, got = asyncio.run(asyncio.wait_for(browser(), 30))
        engine.run_cycle()
        table = engine.resolve("uploaded")
        assert status == 0, message
        assert got  # a PutResult per batch
        assert table is not None and table.size == data.num_rows
        _step, contents = engine.snapshot(table)
        assert contents.equals(data)
    finally:
        srv.stop()
        engine.stop()
