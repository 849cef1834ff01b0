"""The web port with TLS: HTTP/2 gRPC-Web calls (what Deephaven's JS API makes on an https page),
the pages over HTTP/2, and HTTP/1.1 on the same port; on a socket, with a self-signed certificate.
The JS API itself over https is in tests/test_browser_https.py."""
from __future__ import annotations

import urllib.request

import pyarrow as pa
import pytest

from tests.certs import self_signed
from tests.h2client import H2Client, grpc_web_body
from tests.waiting import wait_until
from tickwire.clients.state import NaturalTableState
from tickwire.protocol.proto import config_pb2, flight_pb2, session_pb2
from tickwire.protocol.responses import ResponseReader, SchemaReceived
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

CONFIG = "/io.deephaven.proto.backplane.grpc.ConfigService/"
FLIGHT = "/arrow.flight.protocol.FlightService/"
SESSION = "/io.deephaven.proto.backplane.grpc.SessionService/"
GRPC_WEB = (("content-type", "application/grpc-web"), ("x-grpc-web", "1"), ("authorization", "Anonymous"))


@pytest.fixture(scope="module")
def https_server(tmp_path_factory):
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    engine = Engine(interval_ms=50)
    data = pa.table({"a": list(range(1000)), "b": [f"s{i}" for i in range(1000)]})
    engine.create(TableSpec("t", "static", data=data))
    server = TickwireServer(engine, host="localhost", port=0, tls_cert=cert, tls_key=key, web_port=0).start()
    try:
        yield server, cert
    finally:
        server.stop()
        engine.stop()


@pytest.fixture()
def h2(https_server):
    server, cert = https_server
    client = H2Client("localhost", server.web_port, str(cert))
    try:
        yield client
    finally:
        client.close()


def test_unary_and_server_streaming_grpc_web_calls_over_http2(https_server, h2):
    server, _cert = https_server
    a = h2.request("POST", CONFIG + "GetConfigurationConstants", GRPC_WEB, grpc_web_body(b""))
    assert a.status == 200 and a.headers["content-type"].startswith("application/grpc-web")
    messages, trailers = a.grpc_web()
    assert trailers["grpc-status"] == "0" and len(messages) == 1
    assert config_pb2.ConfigurationConstantsResponse.FromString(messages[0]).config_values

    ticket = flight_pb2.Ticket(ticket=b"s/t").SerializeToString()
    a = h2.request("POST", FLIGHT + "DoGet", GRPC_WEB, grpc_web_body(ticket))
    messages, trailers = a.grpc_web()
    assert trailers["grpc-status"] == "0", trailers
    reader, state = ResponseReader(), None
    for raw in messages:
        for ev in reader.feed(raw):
            if isinstance(ev, SchemaReceived):
                state = NaturalTableState(ev.schema, viewport=False)
            else:
                state.apply_plain(ev.update)
    assert state is not None and state.table().column("b").to_pylist() == [f"s{i}" for i in range(1000)]


def test_grpc_web_refusals_are_statuses_in_the_trailer_block(h2):
    def status(path: str, body: bytes, headers=GRPC_WEB) -> tuple[str, str]:
        _m, trailers = h2.request("POST", path, headers, body).grpc_web()
        return trailers["grpc-status"], trailers.get("grpc-message", "")

    code, message = status(CONFIG + "Nope", grpc_web_body(b""))
    assert code == "12" and "Method not found" in message
    code, message = status(FLIGHT + "DoExchange", grpc_web_body(b""))
    assert code == "12" and "BrowserFlightService" in message
    assert status(CONFIG + "GetConfigurationConstants", b"\x00\x00\x00\x00\x09abc")[0] == "3"  # cut short
    assert status(CONFIG + "GetConfigurationConstants", grpc_web_body(b"") * 2)[0] == "3"  # two requests
    no_auth = (("content-type", "application/grpc-web"),)
    assert status(FLIGHT + "DoGet", grpc_web_body(flight_pb2.Ticket(ticket=b"s/t").SerializeToString()),
                  no_auth)[0] == "16"  # UNAUTHENTICATED, as on the gRPC port


def test_pages_over_http2_and_http1_on_the_same_port(https_server, h2):
    server, cert = https_server
    a = h2.request("GET", "/js-plugins/manifest.json")
    assert a.status == 200 and a.body == b'{"plugins": []}'
    a = h2.request("GET", "/")
    assert a.status == 302 and a.headers["location"] == "/tables/"
    a = h2.request("GET", "/tables/")
    assert a.status == 200 and b">t</a>" in a.body
    assert h2.request("GET", "/nothing-here").status == 404
    import ssl

    ctx = ssl.create_default_context(cafile=str(cert))  # HTTP/1.1 (no ALPN h2): aiohttp, as on plain http
    with urllib.request.urlopen(f"https://localhost:{server.web_port}/js-plugins/manifest.json", context=ctx,
                                timeout=10) as resp:
        assert resp.status == 200 and resp.read() == b'{"plugins": []}'


def test_a_stream_the_browser_resets_ends_its_handler(https_server, h2):
    server, _cert = https_server
    a = h2.request("POST", SESSION + "NewSession", (("content-type", "application/grpc-web"),
                                                    ("authorization", "Anonymous")), grpc_web_body(b""))
    messages, trailers = a.grpc_web()
    assert trailers["grpc-status"] == "0"
    token = session_pb2.HandshakeResponse.FromString(messages[0]).session_token.decode()
    auth = (("content-type", "application/grpc-web"), ("authorization", f"Bearer {token}"))
    # held open until the session ends (the JS API keeps one open all along)
    sid = h2.send("POST", SESSION + "TerminationNotification", auth,
                  grpc_web_body(session_pb2.TerminationNotificationRequest().SerializeToString()))
    front = server.https
    assert wait_until(lambda: any(sid in c.calls for c in front.connections), 10)
    assert not h2.answers[sid].ended
    h2.reset(sid)
    assert wait_until(lambda: not any(sid in c.calls for c in front.connections), 10)
    # the connection goes on
    assert h2.request("GET", "/js-plugins/manifest.json").status == 200
