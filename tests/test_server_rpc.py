"""The server at the gRPC level: exact status codes and messages for bad input, Deephaven's
session services, PSK and TLS, subscription streams driven by hand (viewport changes, snapshot
requests, half-close), and a stalled subscriber that neither grows memory nor holds others up."""
from __future__ import annotations

import queue
import threading
import time

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.engine import Engine, TableSpec
from tickwire.clients.state import TableState
from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.proto import config_pb2, flight_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import METHODS
from tickwire.protocol.tickets import export_ticket
from tickwire.protocol.update import StreamDecoder
from tickwire.server.app import TickwireServer
from tickwire.server.services.sessions import PSK_SCHEME
from tests.certs import self_signed

FLIGHT = "/arrow.flight.protocol.FlightService/"
ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(start: int, n: int, version: int = 0) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 1.5 + version, "s": [f"r{x}.{version}" for x in k.tolist()]}, schema=SCHEMA)


@pytest.fixture()
def server():
    graph = Engine(interval_ms=3_600_000)
    keyed = graph.create(TableSpec("keyed", "keyed", SCHEMA, keys=["k"]))
    keyed.add(rows(0, 200))
    graph.create(TableSpec("static", "static", data=rows(0, 50)))
    graph.run_cycle()
    srv = TickwireServer(graph, port=0, start_engine=False).start()
    yield srv
    srv.stop()


def unary(channel, path, request, metadata=ANON):
    m = METHODS[path]
    return channel.unary_unary(path, request_serializer=m.request.SerializeToString,
                               response_deserializer=m.response.FromString)(request, metadata=metadata)


def status_of(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value.code(), e.value.details()


class Exchange:
    """A raw DoExchange: requests fed from a queue, responses decoded in a thread."""

    def __init__(self, channel, metadata=ANON, *, as_list=False):
        self.q: queue.Queue = queue.Queue()
        self.decoder = StreamDecoder(columns_as_list=as_list)
        self.updates = []
        self.error = None
        self.done = threading.Event()
        self.call = channel.stream_stream(FLIGHT + "DoExchange")(iter(self.q.get, None), metadata=metadata)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        try:
            for raw in self.call:
                u = self.decoder.feed(raw)
                if u is not None:
                    self.updates.append(u)
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()

    def send(self, app_metadata: bytes | None, descriptor=None):
        self.q.put(encode_flight_data(b"", app_metadata, descriptor=descriptor))

    def half_close(self):
        self.q.put(None)

    def wait(self, n, timeout=10.0):
        end = time.monotonic() + timeout
        while len(self.updates) < n and not self.done.is_set() and time.monotonic() < end:
            time.sleep(0.005)
        assert len(self.updates) >= n, f"{len(self.updates)} updates, wanted {n}; error {self.error}"


def sub_request(ticket=b"s/keyed", viewport=None, columns=None, **opts) -> bytes:
    return barrage.wrap(barrage.SubscriptionRequest(
        ticket=ticket, viewport=None if viewport is None else np.array(viewport, dtype=np.int64).reshape(-1, 2),
        columns=None if columns is None else np.array(columns), options=barrage.SubscriptionOptions(**opts)))


# -- auth and sessions ----------------------------------------------------------------------------------------------

def test_anonymous_session_handshake_and_bearer_reuse(server):
    with grpc.insecure_channel(server.target) as ch:
        path = "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants"
        m = METHODS[path]
        fn = ch.unary_unary(path, request_serializer=m.request.SerializeToString,
                            response_deserializer=m.response.FromString)
        resp, call = fn.with_call(config_pb2.ConfigurationConstantsRequest(), metadata=ANON)
        assert resp.config_values["barrage.version"].string_value == "1.0.0"
        assert resp.config_values["http.session.durationMs"].string_value == "300000"
        bearer = dict(call.initial_metadata())["authorization"]
        assert bearer.startswith("Bearer ")
        _resp, call2 = fn.with_call(config_pb2.ConfigurationConstantsRequest(), metadata=(("authorization", bearer),))
        assert dict(call2.initial_metadata())["authorization"] == bearer  # the same session
        code, msg = status_of(lambda: fn(config_pb2.ConfigurationConstantsRequest()))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "authorization" in msg
        code, _ = status_of(lambda: fn(config_pb2.ConfigurationConstantsRequest(),
                                       metadata=(("authorization", "Bearer nope"),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        # CloseSession ends it: the token stops working
        unary(ch, "/io.deephaven.proto.backplane.grpc.SessionService/CloseSession", session_pb2.HandshakeRequest(),
              metadata=(("authorization", bearer),))
        code, _ = status_of(lambda: fn(config_pb2.ConfigurationConstantsRequest(),
                                       metadata=(("authorization", bearer),)))
        assert code == grpc.StatusCode.UNAUTHENTICATED


def test_fetch_table_exports_release_and_batch(server):
    with grpc.insecure_channel(server.target) as ch:
        path = "/io.deephaven.proto.backplane.grpc.ConfigService/GetConfigurationConstants"
        m = METHODS[path]
        _r, call = ch.unary_unary(path, request_serializer=m.request.SerializeToString,
                                  response_deserializer=m.response.FromString).with_call(
            config_pb2.ConfigurationConstantsRequest(), metadata=ANON)
        md = (("authorization", dict(call.initial_metadata())["authorization"]),)
        req = table_pb2.FetchTableRequest()
        req.source_id.ticket.ticket = b"s/keyed"
        req.result_id.ticket = export_ticket(3)
        resp = unary(ch, "/io.deephaven.proto.backplane.grpc.TableService/FetchTable", req, md)
        assert resp.success and not resp.is_static and resp.size == 200
        assert pa.ipc.read_schema(pa.py_buffer(resp.schema_header)).names == ["k", "v", "s"]
        # the export is a subscribable ticket in this session
        ex = Exchange(ch, md)
        ex.send(sub_request(ticket=export_ticket(3)))
        ex.wait(1)
        assert ex.updates[0].metadata.table_size == 200
        ex.half_close()
        assert ex.done.wait(10) and ex.error is None
        # the same id twice is refused; release frees it; releasing again is NOT_FOUND
        code, msg = status_of(lambda: unary(ch, "/io.deephaven.proto.backplane.grpc.TableService/FetchTable",
                                            req, md))
        assert code == grpc.StatusCode.ALREADY_EXISTS and "export 3" in msg
        rel = session_pb2.ReleaseRequest()
        rel.id.ticket = export_ticket(3)
        unary(ch, "/io.deephaven.proto.backplane.grpc.SessionService/Release", rel, md)
        code, _ = status_of(lambda: unary(ch, "/io.deephaven.proto.backplane.grpc.SessionService/Release", rel, md))
        assert code == grpc.StatusCode.NOT_FOUND
        # Batch: fetch_table works, operations tickwire lacks are UNIMPLEMENTED by name
        batch = table_pb2.BatchTableRequest()
        op = batch.ops.add()
        op.fetch_table.source_id.ticket.ticket = b"s/static"
        op.fetch_table.result_id.ticket = export_ticket(4)
        bm = METHODS["/io.deephaven.proto.backplane.grpc.TableService/Batch"]
        call = ch.unary_stream(bm.path, request_serializer=bm.request.SerializeToString,
                               response_deserializer=bm.response.FromString)
        (r,) = list(call(batch, metadata=md))
        assert r.is_static and r.size == 50
        op2 = batch.ops.add()
        op2.select_distinct.source_id.batch_offset = 0
        code, msg = status_of(lambda: list(call(batch, metadata=md)))
        assert code == grpc.StatusCode.UNIMPLEMENTED and "'select_distinct'" in msg


def test_psk_is_required_when_configured():
    graph = Engine(interval_ms=3_600_000)
    graph.create(TableSpec("t", "static", data=rows(0, 5)))
    srv = TickwireServer(graph, port=0, psk="s3cret", start_engine=False).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
            req = flight_pb2.Ticket(ticket=b"s/t")
            get = ch.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
            for md in (ANON, (("authorization", f"{PSK_SCHEME} wrong"),), ()):
                code, msg = status_of(lambda: list(get(req, metadata=md)))
                assert code == grpc.StatusCode.UNAUTHENTICATED, md
            out = list(get(req, metadata=(("authorization", f"{PSK_SCHEME} s3cret"),)))
            assert len(out) == 2  # schema + one batch
    finally:
        srv.stop()


def test_tls(tmp_path):
    cert, key = self_signed(tmp_path)
    graph = Engine(interval_ms=3_600_000)
    graph.create(TableSpec("t", "static", data=rows(0, 5)))
    srv = TickwireServer(graph, host="localhost", port=0, tls_cert=cert, tls_key=key, start_engine=False).start()
    try:
        import pyarrow.flight as fl
        c = fl.FlightClient(f"grpc+tls://localhost:{srv.port}", tls_root_certs=cert.read_bytes())
        got = c.do_get(fl.Ticket(b"s/t"), fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])).read_all()
        assert got.num_rows == 5
        plain = fl.FlightClient(f"grpc://localhost:{srv.port}")
        with pytest.raises(Exception):
            plain.do_get(fl.Ticket(b"s/t"), fl.FlightCallOptions(timeout=3)).read_all()
    finally:
        srv.stop()


# -- DoExchange errors --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["malformed", "unknown_type", "no_ticket", "missing_table", "late_no_metadata",
                                  "bad_column", "reverse_full", "mixed_types", "full_to_viewport"])
def test_do_exchange_bad_input_gets_a_clear_status(server, case):
    with grpc.insecure_channel(server.target) as ch:
        ex = Exchange(ch)
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
        assert ex.done.wait(10)
        assert ex.error is not None and ex.error.code() == want, ex.error
        assert text in ex.error.details()
    assert server.registry.subscriptions == []  # everything the stream held is released


def test_server_keeps_serving_after_bad_requests(server):
    with grpc.insecure_channel(server.target) as ch:
        bad = Exchange(ch)
        bad.send(b"junk")
        assert bad.done.wait(10) and bad.error is not None
        good = Exchange(ch)
        good.send(sub_request())
        good.wait(1)
        assert good.updates[0].metadata.table_size == 200
        good.half_close()
        assert good.done.wait(10) and good.error is None


# -- streams driven by hand ----------------------------------------------------------------------------------------------

def test_pyarrow_style_opening_message_viewport_changes_and_half_close(server):
    graph = server.graph
    keyed = graph.tables["keyed"]
    with grpc.insecure_channel(server.target) as ch:
        ex = Exchange(ch, as_list=True)
        ex.send(None, descriptor=FlightDescriptor.for_command(b"dphn"))  # ignored first message
        ex.send(sub_request(viewport=[[10, 19]], columns_as_list=True, batch_size=3))
        ex.wait(1)
        state = TableState(ex.decoder.schema, viewport=True)
        state.apply(ex.updates[0])
        assert state.to_arrow().column("k").to_pylist() == list(range(10, 20))
        snap = ex.updates[0].metadata
        assert snap.is_snapshot and snap.effective_viewport.tolist() == [[10, 19]] and snap.table_size == 200
        keyed.add(rows(15, 3, version=1))  # modify rows 15..17
        keyed.delete(pa.table({"k": pa.array([0, 1], pa.int64())}))  # rows before the window: it slides
        graph.run_cycle()
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
        assert ex.done.wait(10) and ex.error is None  # OK after the client half-closes
    assert server.registry.subscriptions == []


def test_snapshot_request_ends_after_half_close(server):
    with grpc.insecure_channel(server.target) as ch:
        ex = Exchange(ch)
        ex.send(barrage.wrap(barrage.SnapshotRequest(ticket=b"s/keyed", viewport=np.array([[195, 205]]),
                                                     columns=np.array([0, 2]))))
        ex.wait(1)
        md = ex.updates[0].metadata
        assert md.is_snapshot and md.effective_viewport.tolist() == [[195, 205]]
        assert md.added_rows.tolist() == [[0, 199]] and md.added_rows_included.tolist() == [[195, 199]]
        assert md.effective_column_set.tolist() == [0, 2] and md.mod_column_nodes is None
        assert ex.updates[0].added[0].to_pylist() == [195, 196, 197, 198, 199] and len(ex.updates[0].added[1]) == 0
        time.sleep(0.3)
        assert not ex.done.is_set()  # held open until the client half-closes (§7.5)
        ex.half_close()
        assert ex.done.wait(10) and ex.error is None


def test_static_doget_has_barrage_metadata_like_deephaven(server):
    with grpc.insecure_channel(server.target) as ch:
        get = ch.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
        out = list(get(flight_pb2.Ticket(ticket=b"s/static"), metadata=ANON))
        dec = StreamDecoder()
        (u,) = [x for x in (dec.feed(p) for p in out) if x is not None]
        md = u.metadata
        assert md.is_snapshot and md.first_seq == md.last_seq == -1 and md.table_size == 0
        assert md.added_rows.tolist() == [[0, 49]] and md.removed_rows is None and md.mod_column_nodes is None


def test_stalled_subscriber_stays_bounded_and_converges(server):
    """A client that stops reading holds at most a bounded amount on the server while another
    keeps receiving every step; once it reads again it catches up in one coalesced message."""
    graph = server.graph
    keyed = graph.tables["keyed"]
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
        deadline = time.monotonic() + 10
        while len(server.registry.subscriptions) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        slow_sub = [s for s in server.registry.subscriptions if s is not None][-1]
        big = 20_000
        for step in range(40):  # each cycle rewrites many rows with long strings: ~1 MB of changes
            t = rows(0, big, version=step + 1)
            t = t.set_column(2, "s", pa.array([("x" * 40) + str(step)] * big))
            keyed.add(t)
            graph.run_cycle()
            fast.wait(2 + step, timeout=20)
            assert slow_sub.pending() <= 2
        assert fast.error is None
        # a cycle's message is ~1 MB; 40 of them never queued up: the slow one was coalesced
        assert slow_sub.coalesced >= 20
        # now read the stalled stream to the end of what it was sent
        dec = StreamDecoder()
        state = None
        expected = graph.snapshot("keyed")[1]
        for raw in stalled:
            u = dec.feed(raw)
            if u is None:
                continue
            if state is None:
                state = TableState(dec.schema)
            state.apply(u)
            if state.last_seq == graph.step:
                break
        assert state.to_arrow().equals(expected)
        stalled.cancel()
        fast.half_close()
        fast.done.wait(10)
    deadline = time.monotonic() + 10
    while server.registry.subscriptions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.registry.subscriptions == []  # a cancelled stream releases its subscription


def test_max_message_size_splits_batches_and_refuses_a_row_that_cannot_fit(server):
    graph = server.graph
    with grpc.insecure_channel(server.target) as ch:
        ex = Exchange(ch)
        ex.send(sub_request(max_message_size=2048))
        ex.wait(1)
        sizes = []  # the payload sizes are read on a second stream that records them
        q: queue.Queue = queue.Queue()
        call = ch.stream_stream(FLIGHT + "DoExchange")(iter(q.get, None), metadata=ANON)
        q.put(encode_flight_data(b"", sub_request(max_message_size=2048)))
        dec = StreamDecoder()
        for p in call:
            sizes.append(len(p))
            if dec.feed(p) is not None:
                break
        assert len(sizes) > 3 and max(sizes) < 2048  # 200 rows split into batches under the limit
        q.put(None)
        call.cancel()
        # a row whose FlightData cannot be under the limit ends the stream with RESOURCE_EXHAUSTED
        graph.tables["keyed"].add(pa.table({"k": pa.array([7], pa.int64()), "v": [0.5], "s": ["x" * 5000]},
                                           schema=SCHEMA))
        graph.run_cycle()
        assert ex.done.wait(10)
        assert ex.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "max_message_size 2048" in ex.error.details()


def test_a_cancelled_subscription_is_not_reported_as_a_server_error(server, caplog):
    """A client cancelling its stream while updates flow is a normal end: the subscription is
    released and nothing is logged as an internal error."""
    import logging
    import threading
    caplog.set_level(logging.ERROR)
    graph = server.graph
    keyed = graph.tables["keyed"]
    stop = threading.Event()

    def tick():
        v = 0
        while not stop.is_set():
            v += 1
            keyed.add(rows(0, 2000, version=v))
            graph.run_cycle()
            time.sleep(0.002)

    ticker = threading.Thread(target=tick)
    ticker.start()
    try:
        with grpc.insecure_channel(server.target) as ch:
            for i in range(30):
                q: queue.Queue = queue.Queue()
                call = ch.stream_stream(FLIGHT + "DoExchange")(iter(q.get, None), metadata=ANON)
                q.put(encode_flight_data(b"", sub_request()))
                it = iter(call)
                for _ in range(2 + i % 5):  # the schema, the snapshot, a few updates
                    next(it)
                call.cancel()
    finally:
        stop.set()
        ticker.join()
    deadline = time.monotonic() + 10
    while server.registry.subscriptions and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.registry.subscriptions == []
    time.sleep(0.2)
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], caplog.text


def test_a_streaming_handler_closed_by_grpc_is_not_aborted():
    """When gRPC closes a response stream (the client went away while the server was suspended at
    a `yield`), the handler's generator gets GeneratorExit: that ends the call quietly instead of
    trying to send an error status on a finished call."""
    import asyncio

    from tickwire.server.services.rpc import SERVER_STREAM, _guard

    aborted = []

    class Ctx:
        async def abort(self, code, details):
            aborted.append((code, details))

    async def handler(request, context):
        while True:
            yield b"x"

    async def run():
        gen = _guard(handler, SERVER_STREAM)(None, Ctx())
        assert await gen.__anext__() == b"x"
        await gen.aclose()

    asyncio.run(run())
    assert aborted == []
