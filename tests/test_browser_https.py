"""Deephaven's JS API and grid page over https, in headless Chromium with a self-signed certificate
(`--ignore-certificate-errors`): on an https page the JS API makes gRPC-Web calls over HTTP/2 and
follows tables through BrowserFlightService, not the websocket. The same checks as
tests/test_browser.py's (a viewport that converges to DoGet and follows the ticking table, a grid
that draws its cells and keeps drawing), against a real Deephaven 42.7 with TLS (its own
`ssl.identity.*` settings, the same certificate) and against tickwire with `--tls-cert` and
`--web-port`."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from .browser.jsapi import JsApiPage
from .certs import self_signed
from .interop.dh_server import start_dh_server
from .test_browser import (
    KINDS,
    PausableTicker,
    Served,
    _skip_unless,
    grid_renders_and_updates,
    viewport_follows_doget,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.interop]

HTTPS_SHOT = Path(__file__).resolve().parent.parent / "docs" / "img" / "grid-https.png"


@dataclass
class HttpsServed(Served):
    cert: str = ""

    @property
    def origin(self) -> str:
        return f"https://localhost:{self.web_port}"

    def doget(self, name: str) -> pa.Table:
        with open(self.cert, "rb") as fh:
            root = fh.read()
        client = fl.FlightClient(f"grpc+tls://localhost:{self.port}", tls_root_certs=root)
        try:
            return client.do_get(fl.Ticket(b"s/" + name.encode()), self.options).read_all()
        finally:
            client.close()


@pytest.fixture(scope="module")
def tls_browser():
    from tests.browser.cdp import launch_chromium

    with launch_chromium(extra_args=("--ignore-certificate-errors",)) as b:
        yield b


@pytest.fixture()
def tls_page(tls_browser):
    p = tls_browser.new_page()
    yield p
    p.close()


@pytest.fixture(scope="module", params=KINDS)
def served_https(request, tmp_path_factory):
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    _skip_unless(request.param)
    cert, key = self_signed(tmp_path_factory.mktemp("tls"))
    if request.param == "deephaven":  # a server of its own: the run's shared one speaks plain http
        dh = start_dh_server(extra_jvm_args=["-Dssl.identity.type=privatekey", f"-Dssl.identity.certChainPath={cert}",
                                             f"-Dssl.identity.privateKeyPath={key}"])
        try:
            yield HttpsServed("deephaven", dh.port, None, dh, None, dh.port, cert=str(cert))
        finally:
            dh.stop()
        return
    engine = Engine(interval_ms=100)
    ticker = PausableTicker(engine)
    server = TickwireServer(engine, host="localhost", port=0, tls_cert=cert, tls_key=key, web_port=0).start()
    ticker.start()
    try:
        yield HttpsServed("tickwire", server.port, None, server, ticker, server.web_port, cert=str(cert))
    finally:
        ticker.stop()
        server.stop()
        engine.stop()


def test_jsapi_over_https_follows_a_ticking_viewport_over_http2(served_https, tls_page):
    viewport_follows_doget(served_https, tls_page)
    if served_https.kind == "tickwire":
        server = served_https.server
        # it went over HTTP/2 gRPC-Web: the https front holds the page's connection, no websocket was opened
        assert server.https.connections and server.web.stats["sockets_opened"] == 0


def test_grid_page_renders_and_updates_over_https(served_https, tls_page, tmp_path):
    second = grid_renders_and_updates(served_https, tls_page, tmp_path, f"https-{served_https.kind}")
    if served_https.kind == "tickwire":
        if not HTTPS_SHOT.exists():  # the README's picture, written once
            HTTPS_SHOT.parent.mkdir(parents=True, exist_ok=True)
            HTTPS_SHOT.write_bytes(second.read_bytes())
        assert served_https.server.web.stats["sockets_opened"] == 0
    assert not tls_page.exceptions(), tls_page.diagnostics()


def test_closing_the_https_page_ends_its_subscriptions(served_https, tls_browser):
    """The page's fetches are aborted when it closes (HTTP/2 stream resets): each OpenDoExchange
    handler is cancelled and its subscription ends. (Its session and exports stay until the session
    expires or is closed: over HTTP/2 no socket stands for the page. A page only navigated away may
    be kept by Chromium's back-forward cache, its fetches open.)"""
    from .test_browser import server_counts

    if served_https.kind != "tickwire":
        pytest.skip("server-side subscription counts are only read from tickwire")
    server = served_https.server
    wait_until(lambda: server_counts(server)["subscriptions"] == 0, 30, "earlier pages' subscriptions to end",
               lambda: f": {server_counts(server)}")
    page = tls_browser.new_page()
    closed = False
    try:
        js = JsApiPage(page, served_https.origin)
        js.login()
        js.open("ticking_keyed")
        js.viewport(0, 9)
        js.wait_rows(lambda s: len(s["rows"]) > 0)
        assert server_counts(server)["subscriptions"] > 0
        streams = sum(len(c.calls) for c in server.https.connections)
        page.close()
        closed = True
        wait_until(lambda: server_counts(server)["subscriptions"] == 0, 30,
                   "the page's subscriptions to end once it closed", lambda: f": {server_counts(server)}")
        wait_until(lambda: sum(len(c.calls) for c in server.https.connections) < streams, 30,
                   "the page's streams to end", lambda: f": {streams} before")
    finally:
        if not closed:
            page.close()
