"""The web side: one port for gRPC and browsers, Deephaven's pages, and gRPC over the multiplexed
websocket (run by the same handlers as the gRPC port)."""
from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time
import urllib.error
import urllib.request

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire import TickwireServer
from tickwire.clients.websocket import WebsocketChannel
from tickwire.protocol import barrage
from tickwire.protocol.opening import exchange_opening, request_message, subscription_request
from tickwire.protocol.proto import config_pb2, flight_pb2
from tickwire.protocol.update import StreamDecoder
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.perf_tables import NAMES as PERF_TABLES
from tickwire.server.web import HTTP2_PREFACE, classify
from tickwire.server.web.assets import installed_jar

from .waiting import wait_until

CONFIG = "/io.deephaven.proto.backplane.grpc.ConfigService/"
FLIGHT = "/arrow.flight.protocol.FlightService/"
ANON = {"authorization": "Anonymous"}
N = 5_000


@pytest.fixture(scope="module")
def served():
    engine = Engine(interval_ms=20)
    engine.create(TableSpec("static", "static",
                            data=pa.table({"i": np.arange(N, dtype=np.int64), "s": [f"r{i}" for i in range(N)]})))
    keyed = engine.create(TableSpec("keyed", "keyed", pa.schema([("k", pa.int64()), ("v", pa.float64())]), keys=("k",)))
    engine.write(keyed, pa.table({"k": np.arange(100, dtype=np.int64), "v": np.zeros(100)}), wait=False)
    srv = TickwireServer(engine, port=0).start()
    yield srv, engine, keyed
    srv.stop()
    engine.stop()


def run(coro, timeout: float = 30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# -- the splitter ---------------------------------------------------------------------------------

def test_classify_by_first_bytes():
    assert classify(HTTP2_PREFACE + b"\x00\x00") == "grpc"
    assert classify(HTTP2_PREFACE[:10]) is None
    assert classify(b"GET / HTTP/1.1\r\n") == "web"
    assert classify(b"\x16\x03\x01") == "web"


def test_grpc_and_http_share_the_port(served):
    srv, _engine, _keyed = served
    assert srv.web_url == f"http://127.0.0.1:{srv.port}"
    client = fl.FlightClient(f"grpc://{srv.target}")
    anon = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    t = client.do_get(fl.Ticket(b"s/static"), anon).read_all()
    assert t.num_rows == N and t.column("i").to_pylist() == list(range(N))
    status, _h, body = get(srv.web_url + "/tables/")
    assert status == 200 and b"/iframe/widget/?name=static" in body and b"keyed" in body
    status, _h, _b = get(srv.web_url + "/no/such/page")
    assert status == 404


def test_a_preface_split_over_two_segments_still_reaches_grpc(served):
    srv, _engine, _keyed = served
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(HTTP2_PREFACE[:7])
        time.sleep(0.1)
        s.sendall(HTTP2_PREFACE[7:] + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")  # an empty SETTINGS frame
        s.settimeout(5)
        reply = s.recv(9)
    assert len(reply) == 9 and reply[3] == 0x04  # grpcio answers with its SETTINGS frame


def test_a_silent_connection_does_not_stop_others(served):
    srv, _engine, _keyed = served
    idle = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(20)]
    try:
        status, _h, _b = get(srv.web_url + "/js-plugins/manifest.json")
        assert status == 200
        with grpc.insecure_channel(srv.target) as ch:
            raw = ch.unary_unary(CONFIG + "GetConfigurationConstants")(b"", metadata=tuple(ANON.items()), timeout=5)
        assert config_pb2.ConfigurationConstantsResponse.FromString(raw).config_values["barrage.version"]
    finally:
        for s in idle:
            s.close()


class _Relayed:
    """A PortSplitter on its own event loop (a thread) in front of a plain TCP server standing in
    for grpcio: each connection it accepts is handed to `serve(conn)` on a thread of its own."""

    def __init__(self, serve):
        from tickwire.server.web.splitter import PortSplitter

        self.upstream = socket.create_server(("127.0.0.1", 0))
        self.serve = serve
        threading.Thread(target=self._accept, daemon=True).start()
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        self.splitter = PortSplitter(listener, self.upstream.getsockname()[:2])
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self):
        self.splitter.start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.upstream.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(conn,), daemon=True).start()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port))
        s.sendall(HTTP2_PREFACE)
        return s

    def close(self):
        asyncio.run_coroutine_threadsafe(self.splitter.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.upstream.close()


def _recv_all(s: socket.socket) -> bytes:
    parts = []
    while True:
        b = s.recv(1 << 16)
        if not b:
            return b"".join(parts)
        parts.append(b)


def test_the_relay_carries_both_ways_under_backpressure_and_passes_half_closes_on():
    # 8 MB each way, more than the pipes and socket buffers hold, read late on both sides: the
    # relay must wait for each side to take more; then each side's end reaches the other
    payload = np.random.default_rng(3).integers(0, 256, 8 << 20, dtype=np.uint8).tobytes()
    got: dict = {}

    def echo_after_eof(conn):
        with conn:
            got["up"] = _recv_all(conn)          # until the client's half-close arrives
            time.sleep(0.2)                       # the client is not reading yet either
            conn.sendall(got["up"][len(HTTP2_PREFACE):][::-1])

    relayed = _Relayed(echo_after_eof)
    try:
        c = relayed.connect()
        c.settimeout(30)
        sender = threading.Thread(target=lambda: (c.sendall(payload), c.shutdown(socket.SHUT_WR)))
        sender.start()
        time.sleep(0.3)                          # the upstream reads while the client still sends
        back = _recv_all(c)                      # ends when the upstream closes
        sender.join(30)
        c.close()
        assert got["up"] == HTTP2_PREFACE + payload
        assert back == payload[::-1]
        assert wait_until(lambda: relayed.splitter.bridged == 0, 10)
        relay = relayed.splitter._relay
        assert relay is not None and not relay._links and not relay._masks  # nothing left registered
    finally:
        relayed.close()


def test_closing_the_splitter_cuts_relayed_connections_and_ends_the_relay():
    started = threading.Event()

    def hold(conn):
        with conn:
            started.set()
            _recv_all(conn)                       # until the relay cuts it

    relayed = _Relayed(hold)
    c = relayed.connect()
    c.settimeout(10)
    assert started.wait(10) and wait_until(lambda: relayed.splitter.bridged == 1, 10)
    relay = relayed.splitter._relay
    relayed.close()
    assert c.recv(10) == b""                      # the client sees its connection end
    assert wait_until(lambda: relayed.splitter.bridged == 0, 10)
    relay._thread.join(10)
    assert not relay._thread.is_alive()
    c.close()


def test_web_port_apart_and_web_off():
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1, 2]})))
    apart = TickwireServer(engine, port=0, web_port=0, start_engine=False).start()
    off = TickwireServer(engine, port=0, web=False, start_engine=False).start()
    try:
        assert apart.web_port not in (None, apart.port)
        assert get(f"http://127.0.0.1:{apart.web_port}/js-plugins/manifest.json")[0] == 200
        assert off.web_url is None and off.web is None
        for srv in (apart, off):
            t = fl.FlightClient(f"grpc://{srv.target}").do_get(
                fl.Ticket(b"s/t"), fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])).read_all()
            assert t.column("a").to_pylist() == [1, 2]
        with socket.create_connection(("127.0.0.1", off.port)) as s:  # grpcio itself: no HTTP/1.1 answer
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            s.settimeout(5)
            assert not s.recv(64).startswith(b"HTTP/1.1")
    finally:
        apart.stop()
        off.stop()


# -- pages and assets --------------------------------------------------------------------------------

def test_pages(served):
    srv, _engine, _keyed = served
    status, headers, _b = get(srv.web_url + "/js-plugins/manifest.json")
    assert status == 200 and _b == b'{"plugins": []}'
    req = urllib.request.Request(srv.web_url + "/", method="GET")
    opener = urllib.request.build_opener(type("NoRedirect", (urllib.request.HTTPRedirectHandler,),
                                              {"redirect_request": lambda *a, **k: None}))
    with pytest.raises(urllib.error.HTTPError) as exc:
        opener.open(req)
    assert exc.value.code == 302 and exc.value.headers["Location"] == "/tables/"
    for bad in ("/jsapi/../../etc/passwd", "/iframe/widget/%2e%2e/%2e%2e/x", "/ide/"):
        assert get(srv.web_url + bad)[0] == 404


@pytest.mark.skipif(installed_jar() is None, reason="deephaven-server (tickwire[web]) is not installed")
def test_assets_come_from_the_installed_jar(served):
    srv, _engine, _keyed = served
    status, headers, body = get(srv.web_url + "/jsapi/dh-core.js")
    assert status == 200 and headers["Content-Type"].startswith("text/javascript") and len(body) > 100_000
    import zipfile
    with zipfile.ZipFile(installed_jar()) as z:
        assert body == z.read("META-INF/resources/jsapi/dh-core.js")
    status, headers, body = get(srv.web_url + "/iframe/widget/?name=keyed")
    assert status == 200 and headers["Content-Type"].startswith("text/html") and b"<script" in body
    gz = urllib.request.Request(srv.web_url + "/jsapi/dh-core.js", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(gz) as r:
        assert r.headers["Content-Encoding"] == "gzip"
        packed = r.read()
    import gzip
    plain = get(srv.web_url + "/jsapi/dh-core.js")[2]
    assert len(packed) < len(plain) // 3 and gzip.decompress(packed) == plain
    etag = get(srv.web_url + "/jsapi/dh-core.js")[1]["ETag"]
    req = urllib.request.Request(srv.web_url + "/jsapi/dh-core.js", headers={"If-None-Match": etag})
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    assert exc.value.code == 304


def test_without_assets_the_pages_say_what_to_install(tmp_path):
    engine = Engine(interval_ms=50)
    srv = TickwireServer(engine, port=0, start_engine=False)
    srv.web_assets = None  # as when deephaven-server is not installed
    srv.start()
    try:
        status, _h, body = get(srv.web_url + "/jsapi/dh-core.js")
        assert status == 404 and b"tickwire[web]" in body and b"--web-assets" in body
        status, _h, body = get(srv.web_url + "/tables/")
        assert status == 200 and b"tickwire[web]" in body
        with grpc.insecure_channel(srv.target) as ch:  # everything else keeps working
            ch.unary_unary(CONFIG + "GetConfigurationConstants")(b"", metadata=tuple(ANON.items()), timeout=5)
    finally:
        srv.stop()
    with pytest.raises(ValueError, match="no such file"):
        TickwireServer(engine, port=0, web_assets=tmp_path / "missing.jar")
    with pytest.raises(ValueError, match="dh-core.js"):
        TickwireServer(engine, port=0, web_assets=tmp_path)


# -- gRPC over the websocket ---------------------------------------------------------------------------

def test_unary_calls_over_the_websocket(served):
    srv, _engine, _keyed = served

    async def go():
        async with await WebsocketChannel.connect(srv.web_url + CONFIG + "GetConfigurationConstants") as ch:
            call = await ch.open(CONFIG + "GetConfigurationConstants", ANON)
            raw = await call.unary(b"")
            resp = config_pb2.ConfigurationConstantsResponse.FromString(raw)
            assert resp.config_values["barrage.version"].string_value == "1.0.0"
            auth = dict(call.headers)["authorization"]
            assert auth.startswith("Bearer ") and dict(call.headers)["content-type"] == "application/grpc-web+proto"
            # the token works on the gRPC port too: one session manager
            with grpc.insecure_channel(srv.target) as gch:
                gch.unary_unary(CONFIG + "GetConfigurationConstants")(b"", metadata=(("authorization", auth),),
                                                                      timeout=5)
            # no credentials: the same status as on the gRPC port
            bad = await ch.open(CONFIG + "GetConfigurationConstants", {})
            await bad.send(b"", half_close=True)
            assert [m async for m in bad] == [] and bad.status == 16
            # an unknown method
            unknown = await ch.open("/no.Such/Method", ANON)
            await unknown.send(b"", half_close=True)
            assert [m async for m in unknown] == [] and bad.status == 16 and unknown.status == 12
            # a malformed body: INVALID_ARGUMENT, printable, no '%'
            garbled = await ch.open(FLIGHT + "GetFlightInfo", {"authorization": auth})
            await garbled.send(b"\xff\xff\xff%\x00", half_close=True)
            assert [m async for m in garbled] == [] and garbled.status == 3
            assert "FlightDescriptor" in garbled.message and "%" not in garbled.message
            assert all(" " <= c <= "~" for c in garbled.message)
            # the socket still serves
            again = await ch.unary(CONFIG + "GetConfigurationConstants", b"", {"authorization": auth})
            assert again
    run(go())


def test_browsers_get_status_messages_their_js_api_can_read_and_grpc_clients_the_exact_ones(served):
    """dh-core.js splits a trailer line on every ':' and fails on '%': over the websocket a status
    message has neither (its meaning kept); on the gRPC port it is exactly what the server said."""
    from tickwire.protocol.proto import table_pb2

    srv, _graph, _keyed = served
    table = "/io.deephaven.proto.backplane.grpc.TableService/"
    req = table_pb2.FilterTableRequest()
    req.source_id.ticket.ticket = b"s/keyed"
    req.result_id.ticket = b"e\x01\x00\x00\x00"
    cond = req.filters.add().invoke
    cond.method = "frobnicate"
    cond.target.reference.column_name = "Nope"
    exact = "invoke: unknown column 'Nope'"

    async def go():
        async with await WebsocketChannel.connect(srv.web_url) as ch:
            answers = []
            for path, body in ((table + "Filter", req.SerializeToString()), ("/no.Such/Method", b"")):
                call = await ch.open(path, ANON)
                await call.send(body, half_close=True)
                assert [m async for m in call] == []
                answers.append((call.status, call.message))
            return answers
    filtered, unknown = run(go())
    assert filtered == (3, exact.replace(":", " -")), filtered
    assert unknown == (12, "Method not found - /no.Such/Method"), unknown
    with grpc.insecure_channel(srv.target) as ch:
        with pytest.raises(grpc.RpcError) as err:
            ch.unary_unary(table + "Filter")(req.SerializeToString(), metadata=tuple(ANON.items()), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and err.value.details() == exact


def test_doget_over_the_websocket_equals_doget_over_grpc(served):
    srv, _engine, _keyed = served

    async def go():
        async with await WebsocketChannel.connect(srv.web_url) as ch:
            call = await ch.open(FLIGHT + "DoGet", ANON)
            await call.send(flight_pb2.Ticket(ticket=b"s/static").SerializeToString(), half_close=True)
            payloads = [m async for m in call]
            assert call.status == 0
            return payloads
    payloads = run(go())
    dec = StreamDecoder()
    parts = [u for u in (dec.feed(p) for p in payloads) if u is not None]
    got = pa.concat_tables([pa.Table.from_arrays(u.added, schema=dec.schema) for u in parts])
    assert got.column("i").to_pylist() == list(range(N)) and got.column("s")[N - 1].as_py() == f"r{N - 1}"


def test_a_result_named_right_after_the_batch_that_makes_it_waits_for_it(served):
    """What Deephaven's JS API does on every sort of a grid: a Batch, and some microseconds later
    an ApplyPreviewColumns whose source is the Batch's result, without waiting for the Batch's
    answer. The preview waits for the Batch's export (it used to be NOT_FOUND about half the time)."""
    from tickwire.protocol.proto import table_pb2

    srv, _graph, _keyed = served
    table = "/io.deephaven.proto.backplane.grpc.TableService/"

    def ticket(i: int) -> bytes:
        return b"e" + i.to_bytes(4, "little")

    async def go():
        async with await WebsocketChannel.connect(srv.web_url) as ch:
            first = await ch.open(CONFIG + "GetConfigurationConstants", ANON)
            await first.unary(b"")
            bearer = {"authorization": dict(first.headers)["authorization"]}
            fetch = table_pb2.FetchTableRequest()
            fetch.source_id.ticket.ticket = b"s/keyed"
            fetch.result_id.ticket = ticket(1)
            await ch.unary(table + "FetchTable", fetch.SerializeToString(), bearer)
            answers = []
            for i in range(50):
                made, shown = 2 + 2 * i, 3 + 2 * i
                batch = table_pb2.BatchTableRequest()
                srt = batch.ops.add().sort
                srt.source_id.ticket.ticket = ticket(1)
                srt.result_id.ticket = ticket(made)
                d = srt.sorts.add()
                d.column_name = "k"
                d.direction = table_pb2.SortDescriptor.DESCENDING if i % 2 else table_pb2.SortDescriptor.ASCENDING
                preview = table_pb2.ApplyPreviewColumnsRequest()
                preview.source_id.ticket.ticket = ticket(made)
                preview.result_id.ticket = ticket(shown)
                b = await ch.open(table + "Batch", bearer)
                await b.send(batch.SerializeToString(), half_close=True)
                p = await ch.open(table + "ApplyPreviewColumns", bearer)
                await p.send(preview.SerializeToString(), half_close=True)
                made_answers = [table_pb2.ExportedTableCreationResponse.FromString(m) async for m in b]
                shown_answers = [table_pb2.ExportedTableCreationResponse.FromString(m) async for m in p]
                answers.append((b.status, p.status, p.message, [(r.success, r.size) for r in made_answers],
                                [(r.success, r.size) for r in shown_answers]))
            return answers
    answers = run(go(), 120)
    assert answers == [(0, 0, "", [(True, 100)], [(True, 100)])] * 50, [a for a in answers if a[1]][:3]


def _viewport_updates(payloads, dec):
    return [u for u in (dec.feed(p) for p in payloads) if u is not None]


def test_a_viewport_subscription_moves_over_one_exchange_and_ends_with_the_socket(served):
    srv, engine, keyed = served
    registry = srv.registry

    async def go():
        ch = await WebsocketChannel.connect(srv.web_url)
        call = await ch.open(FLIGHT + "DoExchange", ANON)
        opening = exchange_opening(subscription_request(b"s/keyed", viewport=[(10, 19)],
                                                        options=barrage.SubscriptionOptions(batch_size=1000)))
        for m in opening:
            await call.send(m)
        dec = StreamDecoder()
        rows: dict = {}

        async def until(pred, timeout=10):
            deadline = time.monotonic() + timeout
            while not pred():
                msg = await asyncio.wait_for(call.responses.get(), max(0.01, deadline - time.monotonic()))
                u = dec.feed(msg)
                if u is not None and u.metadata is not None and u.added:
                    for k, v in zip(u.added[0].to_pylist(), u.added[1].to_pylist()):
                        rows[k] = v
                    until.last = u
        await until(lambda: len(rows) >= 10)
        assert sorted(rows) == list(range(10, 20))
        assert registry_subscribers(registry) >= 1
        rows.clear()
        await call.send(request_message(subscription_request(b"s/keyed", viewport=[(50, 54)])))
        await until(lambda: set(range(50, 55)) <= set(rows))
        # a change inside the viewport arrives on the same stream
        engine.write(keyed, pa.table({"k": [52], "v": [7.5]}), wait=False)
        changed = {}

        def seen_change():
            u = getattr(until, "last", None)
            return u is not None and any(u.modified) and changed.setdefault("m", True)
        mods = []
        deadline = time.monotonic() + 10
        while not mods and time.monotonic() < deadline:
            msg = await asyncio.wait_for(call.responses.get(), 10)
            u = dec.feed(msg)
            if u is not None and u.modified and len(u.modified[1]):
                mods.append(u.modified[1].to_pylist())
        assert mods and 7.5 in mods[0]
        before = registry_subscribers(registry)
        await ch.close()
        return before
    before = run(go())
    deadline = time.monotonic() + 10
    while registry_subscribers(registry) >= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert registry_subscribers(registry) < before  # closing the socket ended its subscription


def registry_subscribers(registry) -> int:
    return len(registry.subscriptions)


def test_malformed_framing_closes_only_that_socket(served):
    srv, _engine, _keyed = served

    async def go():
        async with await WebsocketChannel.connect(srv.web_url) as good:
            bad = await WebsocketChannel.connect(srv.web_url)
            await bad.ws.send_bytes(b"\x00\x00\x00\x05\x07garbage")  # control byte on a never-opened stream
            await asyncio.wait_for(bad.closed.wait(), 5)
            assert bad.close_code == 1002
            await bad.close()
            text = await WebsocketChannel.connect(srv.web_url)
            await text.ws.send_str("hello")
            await asyncio.wait_for(text.closed.wait(), 5)
            assert text.close_code == 1003
            await text.close()
            assert await good.unary(CONFIG + "GetConfigurationConstants", b"", ANON)
    run(go())


def test_a_second_request_on_a_unary_call_fails_that_call_only(served):
    srv, _engine, _keyed = served

    async def go():
        async with await WebsocketChannel.connect(srv.web_url) as ch:
            call = await ch.open("/io.deephaven.proto.backplane.grpc.SessionService/TerminationNotification", ANON)
            await call.send(b"")
            await call.send(b"")
            await asyncio.wait_for(call.started.wait(), 5)
            assert [m async for m in call] == [] and call.status == 3 and "more than one" in call.message
            assert await ch.unary(CONFIG + "GetConfigurationConstants", b"", ANON)
    run(go())


def test_the_websocket_refuses_the_old_subprotocol(served):
    srv, _engine, _keyed = served
    import aiohttp

    async def go():
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as exc:
                await s.ws_connect("ws" + srv.web_url[4:] + "/x", protocols=("grpc-websockets",))
            assert exc.value.status == 400
    run(go())


def test_shutdown_sends_go_away_and_ends_open_streams():
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1, 2]})))
    srv = TickwireServer(engine, port=0, start_engine=False).start()

    async def go():
        ch = await WebsocketChannel.connect(srv.web_url)
        call = await ch.open(FLIGHT + "DoExchange", ANON)
        for m in exchange_opening(subscription_request(b"s/t")):
            await call.send(m)
        await asyncio.wait_for(call.started.wait(), 10)
        await asyncio.get_running_loop().run_in_executor(None, srv.stop)
        await asyncio.wait_for(ch.go_away.wait(), 5)
        while call.status is None:
            await asyncio.wait_for(call.responses.get(), 5)
        await ch.close()
        return call.status
    assert run(go()) == 14  # UNAVAILABLE


def test_a_slow_browser_is_coalesced_not_buffered_and_nobody_waits_for_it():
    """A browser that stops reading holds at most the socket's queue and the subscriber's outbox;
    changes meanwhile fold into one pending update; another browser keeps receiving; once the slow
    one reads again it converges to the table."""
    from tickwire.clients.state import TableState

    engine = Engine(interval_ms=20)
    rows = 2000
    schema = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("pad", pa.string())])
    hot = engine.create(TableSpec("hot", "keyed", schema, keys=("k",)))
    pad = ["x" * 200] * rows
    engine.write(hot, pa.table({"k": np.arange(rows, dtype=np.int64), "v": np.zeros(rows, dtype=np.int64), "pad": pad}),
                 wait=False)
    srv = TickwireServer(engine, port=0).start()
    stop = asyncio.Event()
    steps = [0]  # the writer's steps so far

    async def write(loop_stop):
        while not loop_stop.is_set():
            steps[0] += 1
            step = steps[0]
            text = [f"{step:06d}" * 33] * rows  # every column changes: about 420 KB an update
            engine.write(hot, pa.table({"k": np.arange(rows, dtype=np.int64), "v": np.full(rows, step, dtype=np.int64),
                                        "pad": text}), wait=False)  # not waiting: this loop serves the browsers
            await asyncio.sleep(0.02)
        return steps[0]

    async def subscribe(ch):
        call = await ch.open(FLIGHT + "DoExchange", ANON)
        for m in exchange_opening(subscription_request(b"s/hot")):
            await call.send(m)
        return call

    async def go():
        slow = await WebsocketChannel.connect(srv.web_url)
        healthy = await WebsocketChannel.connect(srv.web_url)
        slow_call, healthy_call = await subscribe(slow), await subscribe(healthy)

        async def drain(call):  # the healthy browser reads everything it is sent
            async for _msg in call:
                pass
        reader = asyncio.ensure_future(drain(healthy_call))
        await asyncio.wait_for(slow_call.started.wait(), 10)
        writer = asyncio.ensure_future(write(stop))
        slow.pause()
        await asyncio.sleep(0.5)
        def folds():
            return max(s.coalesced for s in srv.registry.subscriptions)
        before, step0, folds0 = healthy.messages_received, steps[0], folds()
        # until the slow one's changes have been folded ten more times (polled on a thread: this
        # loop runs the writer and the healthy reader meanwhile)
        folded = await asyncio.to_thread(wait_until, lambda: folds() > max(10, folds0 + 10), 30)
        during, written = healthy.messages_received - before, steps[0] - step0
        socks = list(srv.web.sockets)
        queued = [s.out.qsize() for s in socks]
        subs = srv.registry.subscriptions
        coalesced = max(s.coalesced for s in subs)
        outboxes = [s.pending() for s in subs]
        stop.set()
        final = await writer
        slow.resume()
        dec, state = StreamDecoder(), None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            msg = await asyncio.wait_for(slow_call.responses.get(), 10)
            u = dec.feed(msg)
            if u is None:
                continue
            if state is None:
                state = TableState(dec.schema)
            state.apply(u)
            t = state.to_arrow()
            if t.num_rows == rows and set(t.column("v").to_pylist()) == {final}:
                break
        await slow.close()
        await healthy.close()
        await reader
        return folded, during, written, folds0, queued, coalesced, outboxes, state.to_arrow(), final

    try:
        folded, during, written, folds0, queued, coalesced, outboxes, table, final = run(go(), 120)
    finally:
        srv.stop()
        engine.stop()
    assert folded, (folds0, coalesced)
    # the healthy browser kept receiving while the slow one's changes were folded: a fair share of
    # the writer's steps in that same window (one message a cycle; a cycle may take several steps)
    assert during >= max(10, written / 4), (during, written)
    assert max(queued) <= 8  # WebSide.send_queue: the socket holds at most that many messages
    assert max(outboxes) <= 2 and coalesced > 10  # the slow one's changes were folded, not queued
    assert table.num_rows == rows and set(table.column("v").to_pylist()) == {final}
    assert sorted(table.column("k").to_pylist()) == list(range(rows))


def test_a_closed_socket_frees_its_sessions_exports_after_a_short_lease():
    from tickwire.protocol.proto import table_pb2

    engine = Engine(interval_ms=50)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1, 2, 3]})))
    srv = TickwireServer(engine, port=0).start()
    srv.web.session_grace_s = 0.5
    table_service = "/io.deephaven.proto.backplane.grpc.TableService/"

    async def open_and_fetch(ch, export_id):
        call = await ch.open(CONFIG + "GetConfigurationConstants", ANON)
        await call.unary(b"")
        bearer = {"authorization": dict(call.headers)["authorization"]}
        req = table_pb2.HeadOrTailRequest(num_rows=2)  # a derived table only this export holds
        req.source_id.ticket.ticket = b"s/t"
        req.result_id.ticket = b"e" + export_id.to_bytes(4, "little")
        await ch.unary(table_service + "Head", req.SerializeToString(), bearer)
        return bearer

    async def go():
        kept = await WebsocketChannel.connect(srv.web_url)
        closed = await WebsocketChannel.connect(srv.web_url)
        await open_and_fetch(kept, 1)
        await open_and_fetch(closed, 1)
        assert srv.sessions.count == 2 and engine_tables() == 3
        t0 = time.monotonic()
        await closed.close()
        # polled on a thread so that this loop keeps serving the kept socket meanwhile
        released = await asyncio.to_thread(
            wait_until, lambda: srv.sessions.count == 1 and engine_tables() == 2, 15)
        took = time.monotonic() - t0
        remaining = srv.sessions.count, engine_tables()
        # the kept socket's session still works
        await kept.unary(CONFIG + "GetConfigurationConstants", b"", {"authorization": "Anonymous"})
        await kept.close()
        return released, took, remaining

    def engine_tables():
        # every table, the hidden ones (the exports') too, at a cycle boundary: the reaper may be
        # removing the export's table meanwhile
        names = {t.name for t in engine.tables(hidden=True)}
        return len(names - set(PERF_TABLES))
    try:
        released, took, (sessions, tables) = run(go())
    finally:
        srv.stop()
        engine.stop()
    # the closed page's session and its export are gone, and the kept page's are not
    assert released and sessions == 1 and tables == 2, (took, sessions, tables)
    # on the short lease (0.5 s grace, then the reaper's next pass), not the sessions' 300 s duration
    assert srv.sessions.duration_ms >= 300_000 and took < 10.0, took


def test_a_call_that_ended_with_requests_unread_does_not_keep_the_socket_from_hearing_its_close():
    """Reading the socket waits while a stream's short queue of unread requests is full (flow
    control). A call that has ended reads none of its requests again -- here a method the server
    does not have, sent six requests in one websocket message. Its ending must let go of the read
    waiting for room: otherwise the socket is never read again, its close is never heard, and its
    other calls live on; a subscription to a table that does not change writes nothing, so no
    failed write ends it either. Its sessions keep their full lease."""
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1, 2, 3]})))
    srv = TickwireServer(engine, port=0).start()
    srv.web.session_grace_s = 0.2

    async def go():
        ch = await WebsocketChannel.connect(srv.web_url)
        first = await ch.open(CONFIG + "GetConfigurationConstants", ANON)
        await first.unary(b"")
        bearer = {"authorization": dict(first.headers)["authorization"]}
        sub = await ch.open(FLIGHT + "DoExchange", bearer)
        await sub.send(request_message(subscription_request(b"s/t")))
        await sub.__anext__()  # the subscription's first message: it is running
        unknown = await ch.open("/no.Such/Method", bearer)
        requests = b"".join(struct.pack(">BI", 0, 1) + b"x" for _ in range(6))
        await ch.ws.send_bytes(struct.pack(">I", unknown.sid) + b"\x00" + requests)
        await unknown.started.wait()
        while unknown.status is None:  # its answer: UNIMPLEMENTED, after which it reads nothing
            await asyncio.sleep(0.01)
        running = len(srv.registry.subscriptions)
        await ch.close()
        return unknown.status, running
    try:
        status, running = run(go())
        assert status == 12 and running == 1
        # the socket's close ends the subscription, and its session goes after the short lease
        assert wait_until(lambda: not srv.registry.subscriptions and srv.sessions.count == 0, 30), \
            (srv.registry.subscriptions, srv.sessions.count, srv.web.stats)
    finally:
        srv.stop()
        engine.stop()


def test_sessions_opened_over_either_transport_log_their_peer(served, caplog):
    import logging

    srv, _engine, _keyed = served
    # an anonymous session used once is logged at DEBUG (at INFO once used again), with its peer either way
    caplog.set_level(logging.DEBUG, logger="tickwire.server.services.sessions")

    async def browser():
        async with await WebsocketChannel.connect(srv.web_url) as ch:
            await ch.unary(CONFIG + "GetConfigurationConstants", b"", ANON)
    run(browser())
    with grpc.insecure_channel(srv.target) as ch:
        ch.unary_unary(CONFIG + "GetConfigurationConstants")(b"", metadata=tuple(ANON.items()), timeout=5)
    peers = [getattr(r, "peer", None) for r in caplog.records if getattr(r, "event", None) == "session_open"]
    assert any(p and p.startswith("ws:127.0.0.1") for p in peers), peers
    assert any(p and p.startswith("ipv4:127.0.0.1") for p in peers), peers


def test_with_tls_the_web_side_needs_its_own_port_and_serves_https(tmp_path):
    import ssl

    from tests.certs import self_signed

    cert, key = self_signed(tmp_path)
    engine = Engine(interval_ms=50)
    engine.create(TableSpec("t", "static", data=pa.table({"a": [1]})))
    shared = TickwireServer(engine, host="localhost", port=0, tls_cert=cert, tls_key=key, start_engine=False).start()
    apart = TickwireServer(engine, host="localhost", port=0, tls_cert=cert, tls_key=key, web_port=0,
                           start_engine=False).start()
    try:
        assert shared.web_url is None and shared.web is None  # grpcio keeps the TLS port to itself
        assert apart.web_url == f"https://localhost:{apart.web_port}"
        ctx = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(apart.web_url + "/js-plugins/manifest.json", context=ctx, timeout=10) as resp:
            assert resp.status == 200 and resp.read() == b'{"plugins": []}'
        creds = grpc.ssl_channel_credentials(cert.read_bytes())
        with grpc.secure_channel(f"localhost:{apart.port}", creds) as ch:
            ch.unary_unary(CONFIG + "GetConfigurationConstants")(b"", metadata=tuple(ANON.items()), timeout=5)
    finally:
        shared.stop()
        apart.stop()
