"""The server at the gRPC level: exact status codes and messages for bad input, Deephaven's
session services, subscription streams driven by hand (viewport changes, snapshot requests,
half-close, cancellation), answered in process (tests.harness.Services) over an engine the test
steps; PSK and TLS as grpcio carries them, and a stalled subscriber held back by HTTP/2 flow
control that neither grows memory nor holds others up, on real sockets."""
from __future__ import annotations

import logging
import queue

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.certs import self_signed
from tests.harness import ANONYMOUS as ANON
from tests.harness import Exchange, Services, until
from tickwire.clients.state import TableState
from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.proto import config_pb2, flight_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE, SESSION_SERVICE, TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket
from tickwire.protocol.update import StreamDecoder
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.services.sessions import PSK_SCHEME

FLIGHT = "/arrow.flight.protocol.FlightService/"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(start: int, n: int, version: int = 0) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 1.5 + version, "s": [f"r{x}.{version}" for x in k.tolist()]}, schema=SCHEMA)


def _tables(engine: Engine) -> None:
    """`keyed` (200 rows) and `static` (50 rows), applied."""
    keyed = engine.create(TableSpec("keyed", "keyed", SCHEMA, keys=["k"]))
    engine.write(keyed, rows(0, 200), wait=False)
    engine.create(TableSpec("static", "static", data=rows(0, 50)))
    engine.run_cycle()


@pytest.fixture()
def svc():
    """The services in process over an engine that cycles only when the test runs one."""
    with Services() as s:
        _tables(s.engine)
        yield s


@pytest.fixture()
def server():
    """A real server on a socket, its engine stepped by the test."""
    engine = Engine(interval_ms=3_600_000)
    _tables(engine)
    srv = TickwireServer(engine, port=0, start_engine=False).start()
    yield srv
    srv.stop()


def sub_request(ticket=b"s/keyed", viewport=None, columns=None, **opts) -> bytes:
    return barrage.wrap(barrage.SubscriptionRequest(
        ticket=ticket, viewport=None if viewport is None else np.array(viewport, dtype=np.int64).reshape(-1, 2),
        columns=None if columns is None else np.array(columns), options=barrage.SubscriptionOptions(**opts)))


def released(s: Services) -> bool:
    """Whether every subscription is released, once the streams' handlers have ended on the
    services' loop (which may be a moment after their callers saw the end)."""
    return until(lambda: s.ctx.registry.subscriptions == [])


# -- auth and sessions -----------------------------------------------------------------------------------------------

def test_anonymous_session_handshake_and_bearer_reuse(svc):
    s = svc
    req = config_pb2.ConfigurationConstantsRequest()
    resp, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants", req, metadata=ANON)
    assert resp.config_values["barrage.version"].string_value == "1.0.0"
    assert resp.config_values["http.session.durationMs"].string_value == "300000"
    bearer = dict(headers)["authorization"]
    assert bearer.startswith("Bearer ")
    _resp, headers2 = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants", req,
                                          metadata=(("authorization", bearer),))
    assert dict(headers2)["authorization"] == bearer  # the same session
    code, msg = s.status(lambda: s.call(CONFIG_SERVICE, "GetConfigurationConstants", req, metadata=()))
    assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization" in msg
    code, _ = s.status(lambda: s.call(CONFIG_SERVICE, "GetConfigurationConstants", req,
                                      metadata=(("authorization", "Bearer nope"),)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    # CloseSession ends it: the token stops working
    s.call(SESSION_SERVICE, "CloseSession", session_pb2.HandshakeRequest(), metadata=(("authorization", bearer),))
    code, _ = s.status(lambda: s.call(CONFIG_SERVICE, "GetConfigurationConstants", req,
                                      metadata=(("authorization", bearer),)))
    assert code == grpc.StatusCode.UNAUTHENTICATED


def test_fetch_table_exports_release_and_batch(svc):
    s = svc
    _r, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants",
                                      config_pb2.ConfigurationConstantsRequest(), metadata=ANON)
    md = (("authorization", dict(headers)["authorization"]),)
    req = table_pb2.FetchTableRequest()
    req.source_id.ticket.ticket = b"s/keyed"
    req.result_id.ticket = export_ticket(3)
    resp = s.call(TABLE_SERVICE, "FetchTable", req, metadata=md)
    assert resp.success and not resp.is_static and resp.size == 200
    assert pa.ipc.read_schema(pa.py_buffer(resp.schema_header)).names == ["k", "v", "s"]
    # the export is a subscribable ticket in this session
    ex = s.exchange(metadata=md)
    ex.send(sub_request(ticket=export_ticket(3)))
    ex.wait(1)
    assert ex.updates[0].metadata.table_size == 200
    ex.half_close()
    assert ex.ended() is None
    # the same id twice is refused; release frees it: the ticket is NOT_FOUND at once (a released id is
    # not waited for), and releasing it again is OK, as Deephaven answers
    code, msg = s.status(lambda: s.call(TABLE_SERVICE, "FetchTable", req, metadata=md))
    assert code == grpc.StatusCode.ALREADY_EXISTS and "export 3" in msg
    rel = session_pb2.ReleaseRequest()
    rel.id.ticket = export_ticket(3)
    s.call(SESSION_SERVICE, "Release", rel, metadata=md)
    code, _ = s.status(lambda: s.doget(export_ticket(3), metadata=md))
    assert code == grpc.StatusCode.NOT_FOUND
    assert s.session_of(md[0][1]).export_items() == []
    s.call(SESSION_SERVICE, "Release", rel, metadata=md)
    # Batch: fetch_table works, operations tickwire lacks are UNIMPLEMENTED by name
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add()
    op.fetch_table.source_id.ticket.ticket = b"s/static"
    op.fetch_table.result_id.ticket = export_ticket(4)
    (r,) = list(s.stream(TABLE_SERVICE, "Batch", batch, metadata=md))
    assert r.is_static and r.size == 50
    # the same result ticket again is refused as the export it would overwrite
    code, msg = s.status(lambda: list(s.stream(TABLE_SERVICE, "Batch", batch, metadata=md)))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add()
    op.fetch_table.source_id.ticket.ticket = b"s/static"
    op2 = batch.ops.add()
    op2.run_chart_downsample.source_id.batch_offset = 0
    code, msg = s.status(lambda: list(s.stream(TABLE_SERVICE, "Batch", batch, metadata=md)))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "'run_chart_downsample'" in msg


def test_psk_is_required_when_configured():
    """On a socket: the key as grpcio carries it in the headers."""
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("t", "static", data=rows(0, 5)))
    srv = TickwireServer(engine, port=0, psk="s3cret", start_engine=False).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            req = flight_pb2.Ticket(ticket=b"s/t")
            get = ch.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
            for md in (ANON, (("authorization", f"{PSK_SCHEME} wrong"),), ()):
                with pytest.raises(grpc.RpcError) as e:
                    list(get(req, metadata=md))
                assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, md
            out = list(get(req, metadata=(("authorization", f"{PSK_SCHEME} s3cret"),)))
            assert len(out) == 2  # schema + one batch
    finally:
        srv.stop()


def test_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("t", "static", data=rows(0, 5)))
    srv = TickwireServer(engine, host="localhost", port=0, tls_cert=cert, tls_key=key, start_engine=False).start()
    try:
        import pyarrow.flight as fl
        c = fl.FlightClient(f"grpc+tls://localhost:{srv.port}", tls_root_certs=cert.read_bytes())
        got = c.do_get(fl.Ticket(b"s/t"), fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])).read_all()
        assert got.num_rows == 5
        plain = fl.FlightClient(f"grpc://localhost:{srv.port}")
        with pytest.raises(fl.FlightError):  # unavailable (no TLS handshake) or timed out
            plain.do_get(fl.Ticket(b"s/t"), fl.FlightCallOptions(timeout=3)).read_all()
    finally:
        srv.stop()


# -- DoExchange errors -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["malformed", "unknown_type", "no_ticket", "missing_table", "late_no_metadata",
                                  "bad_column", "reverse_full", "mixed_types", "full_to_viewport"])
def test_do_exchange_bad_input_gets_a_clear_status(svc, case, caplog):
    s = svc
    caplog.set_level(logging.INFO, logger="tickwire.server.services.flight_service")
    ex = s.exchange()
    if case == "malformed":
        ex.send(b"\x01\x02garbage")
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "bad Barrage request"
    elif case == "unknown_type":
        ex.send(barrage.BarrageMessageWrapper(msg_type=6, payload=b"").to_bytes())
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "unhandled BarrageMessageType: 6"
    elif case == "no_ticket":
        ex.send(sub_request(ticket=None))
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "Ticket not specified"
    elif case == "missing_table":
        ex.send(sub_request(ticket=b"s/nothing"))
        want, text = grpc.StatusCode.NOT_FOUND, "variable 'nothing' not found"
    elif case == "late_no_metadata":
        ex.send(sub_request())
        ex.wait(1)
        ex.send(None)
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "failed to receive Barrage request metadata"
    elif case == "bad_column":
        ex.send(sub_request(columns=[0, 7]))
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "out of range"
    elif case == "reverse_full":
        ex.send(barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/keyed", reverse_viewport=True)))
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "reverse_viewport needs a viewport"
    elif case == "mixed_types":
        ex.send(sub_request())
        ex.wait(1)
        ex.send(barrage.wrap(barrage.SnapshotRequest(ticket=b"s/keyed")))
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "cannot accept a SNAPSHOT_REQUEST"
    else:
        ex.send(sub_request())
        ex.wait(1)
        ex.send(sub_request(viewport=[[0, 5]]))
        want, text = grpc.StatusCode.INVALID_ARGUMENT, "cannot change from full subscription to viewport"
    error = ex.ended()
    assert error is not None and error.code() == want, error
    assert text in error.details()
    assert released(s), s.ctx.registry.subscriptions  # everything the stream held is released
    # the server's log says how each call ended: a call refused before its subscription started too
    ends = [r for r in caplog.records if getattr(r, "event", None) in ("exchange_end", "subscription_end")]
    assert len(ends) == 1 and ends[0].outcome.startswith(f"failed: {want.name}"), [r.getMessage() for r in ends]


def test_server_keeps_serving_after_bad_requests(svc):
    s = svc
    bad = s.exchange()
    bad.send(b"junk")
    assert bad.ended() is not None
    good = s.exchange()
    good.send(sub_request())
    good.wait(1)
    assert good.updates[0].metadata.table_size == 200
    good.half_close()
    assert good.ended() is None


# -- streams driven by hand ------------------------------------------------------------------------------------------

def test_pyarrow_style_opening_message_viewport_changes_and_half_close(svc):
    s = svc
    keyed = s.engine.resolve("keyed")
    ex = s.exchange(as_list=True)
    ex.send(None, descriptor=FlightDescriptor.for_command(b"dphn"))  # ignored first message
    ex.send(sub_request(viewport=[[10, 19]], columns_as_list=True, batch_size=3))
    ex.wait(1)
    state = TableState(ex.decoder.schema, viewport=True)
    state.apply(ex.updates[0])
    assert state.to_arrow().column("k").to_pylist() == list(range(10, 20))
    snap = ex.updates[0].metadata
    assert snap.is_snapshot and snap.effective_viewport.tolist() == [[10, 19]] and snap.table_size == 200
    s.write(keyed, rows(15, 3, version=1),  # modify rows 15..17
            delete=pa.table({"k": pa.array([0, 1], pa.int64())}))  # rows before the window: it slides
    s.cycle()
    ex.wait(2)
    state.apply(ex.updates[1])
    assert state.to_arrow().column("k").to_pylist() == list(range(12, 22))
    assert state.to_arrow().column("v").to_pylist()[3:6] == [15 * 1.5 + 1, 16 * 1.5 + 1, 17 * 1.5 + 1]
    ex.send(sub_request(viewport=[[0, 2]], columns=[0]))
    ex.wait(3)
    state.apply(ex.updates[2])
    assert ex.updates[2].metadata.is_snapshot
    assert state.to_arrow().column("k").to_pylist() == [2, 3, 4]
    ex.half_close()
    assert ex.ended() is None  # OK after the client half-closes
    assert released(s)


def _snapshot_request_exchange(s: Services) -> Exchange:
    ex = s.exchange()
    ex.send(barrage.wrap(barrage.SnapshotRequest(ticket=b"s/keyed", viewport=np.array([[195, 205]]),
                                                 columns=np.array([0, 2]))))
    ex.wait(1)
    return ex


def test_snapshot_request_ends_after_half_close(svc):
    s = svc
    ex = _snapshot_request_exchange(s)
    md = ex.updates[0].metadata
    assert md.is_snapshot and md.effective_viewport.tolist() == [[195, 205]]
    assert md.added_rows.tolist() == [[0, 199]] and md.added_rows_included.tolist() == [[195, 199]]
    assert md.effective_column_set.tolist() == [0, 2] and md.mod_column_nodes is None
    assert ex.updates[0].added[0].to_pylist() == [195, 196, 197, 198, 199] and len(ex.updates[0].added[1]) == 0
    ex.half_close()
    assert ex.ended() is None
    # held open until the client half-closes (§7.5): after its snapshot, the call still reads the
    # client's stream, so what the client sends next (here a malformed message) decides how it ends;
    # a call that ended with the snapshot would have ended OK
    held = _snapshot_request_exchange(s)
    held.send(b"\x01\x02garbage")
    error = held.ended()
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    assert "bad Barrage request" in error.details()


def test_static_doget_has_barrage_metadata_like_deephaven(svc):
    get = svc.channel().unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
    out = list(get(flight_pb2.Ticket(ticket=b"s/static"), metadata=ANON))
    dec = StreamDecoder()
    (u,) = [x for x in (dec.feed(p) for p in out) if x is not None]
    md = u.metadata
    assert md.is_snapshot and md.first_seq == md.last_seq == -1 and md.table_size == 0
    assert md.added_rows.tolist() == [[0, 49]] and md.removed_rows is None and md.mod_column_nodes is None


def test_stalled_subscriber_stays_bounded_and_converges(server):
    """A client that stops reading holds at most a bounded amount on the server while another
    keeps receiving every step; once it reads again it catches up in one coalesced message.
    On sockets: what stalls the subscriber is HTTP/2 flow control (the in-process transport has
    none); coalescing itself is covered without a transport in test_barrage_publisher."""
    engine = server.engine
    keyed = engine.resolve("keyed")
    # no BDP probing on the stalled client's channel: its receive window stays at HTTP/2's 64 KiB instead
    # of growing to take in messages the server should keep (and coalesce) itself
    with grpc.insecure_channel(server.target) as ch, \
            grpc.insecure_channel(server.target, options=[("grpc.http2.bdp_probe", 0)]) as ch2:
        fast = Exchange(ch)
        fast.send(sub_request())
        fast.wait(1)
        # the stalled client: a raw call whose responses nobody reads
        q: queue.Queue = queue.Queue()
        stalled = ch2.stream_stream(FLIGHT + "DoExchange")(iter(q.get, None), metadata=ANON)
        q.put(encode_flight_data(b"", sub_request()))
        assert until(lambda: len(server.registry.subscriptions) >= 2)
        slow_sub = [s for s in server.registry.subscriptions if s is not None][-1]
        big = 20_000
        for step in range(40):  # each cycle rewrites many rows with long strings: ~1 MB of changes
            t = rows(0, big, version=step + 1)
            t = t.set_column(2, "s", pa.array([("x" * 40) + str(step)] * big))
            engine.write(keyed, t, wait=False)
            engine.run_cycle()
            fast.wait(2 + step)
            assert slow_sub.pending() <= 2
        assert fast.error is None
        # a cycle's message is ~1 MB; 40 of them never queued up: the slow one was coalesced
        assert slow_sub.coalesced >= 20
        # now read the stalled stream to the end of what it was sent
        dec = StreamDecoder()
        state = None
        expected = engine.snapshot(keyed)[1]
        for raw in stalled:
            u = dec.feed(raw)
            if u is None:
                continue
            if state is None:
                state = TableState(dec.schema)
            state.apply(u)
            if state.last_seq == engine.step:
                break
        assert state.to_arrow().equals(expected)
        stalled.cancel()
        fast.half_close()
        assert fast.ended() is None
    assert until(lambda: server.registry.subscriptions == [])  # a cancelled stream releases its subscription


def test_max_message_size_splits_batches_and_refuses_a_row_that_cannot_fit(svc):
    s = svc
    ex = s.exchange()
    ex.send(sub_request(max_message_size=2048))
    ex.wait(1)
    sizes = [len(p) for p in ex.payloads]  # the schema and the snapshot's batches
    assert len(sizes) > 3 and max(sizes) < 2048  # 200 rows split into batches under the limit
    # a row whose FlightData cannot be under the limit ends the stream with RESOURCE_EXHAUSTED
    big_row = pa.table({"k": pa.array([7], pa.int64()), "v": [0.5], "s": ["x" * 5000]}, schema=SCHEMA)
    s.write(s.engine.resolve("keyed"), big_row)
    s.cycle()
    error = ex.ended()
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_message_size 2048" in error.details()


def test_a_cancelled_subscription_is_not_reported_as_a_server_error(svc, caplog):
    """A client cancelling its stream while updates flow is a normal end: the subscription is
    released and nothing is logged as an internal error."""
    caplog.set_level(logging.ERROR)
    s = svc
    keyed = s.engine.resolve("keyed")
    version = 0

    def tick() -> None:
        nonlocal version
        version += 1
        s.write(keyed, rows(0, 2000, version=version))
        s.cycle()

    for i in range(30):
        ex = s.exchange()
        ex.send(sub_request())
        ex.wait(1)  # the schema and the snapshot
        for n in range(i % 5):  # a few updates
            tick()
            ex.wait(2 + n)
        tick()  # and one more on its way while the client cancels
        ex.cancel()
    assert released(s), s.ctx.registry.subscriptions
    # every handler has ended (and said how) once the services' loop runs nothing any more
    assert until(lambda: s.running_tasks() == 0)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text


def test_a_streaming_handler_closed_by_grpc_is_not_aborted():
    """When gRPC closes a response stream (the client went away while the server was suspended at
    a `yield`), the handler's generator gets GeneratorExit: that ends the call quietly instead of
    trying to send an error status on a finished call."""
    import asyncio

    from tickwire.protocol.proto.methods import SERVER_STREAM
    from tickwire.server.services.rpc import RAW, guarded_methods

    aborted = []

    class Ctx:
        def peer(self):
            return "ipv4:127.0.0.1:1"

        async def abort(self, code, details):
            aborted.append((code, details))

    async def handler(request, context):
        while True:
            yield b"x"

    path = "/tickwire.test.Streams/Forever"  # not in the method table: raw bytes, its kind given
    guarded = guarded_methods({path: (handler, RAW, RAW, SERVER_STREAM)})[path]

    async def run():
        gen = guarded.fn(b"", Ctx())
        assert await gen.__anext__() == b"x"
        await gen.aclose()

    asyncio.run(run())
    assert aborted == []
