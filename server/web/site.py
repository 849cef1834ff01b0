"""The web side: HTTP/1.1 pages and the browsers' gRPC websocket, on aiohttp.

Routes:
  * `/` redirects to `/tables/`, a page listing the global scope's tables, each linking to its grid;
  * `/jsapi/*` and `/iframe/widget/*`: Deephaven's JavaScript API and grid page, read from the
    installed deephaven-server package (tickwire.server.web.assets); a clear 404 when it is missing;
  * `/js-plugins/manifest.json`: an empty plugin list (the grid page asks for it);
  * `/healthz` (200 "SERVING" or 503) and `/metrics` (Prometheus text), from the server's
    tickwire.server.observability;
  * a websocket upgrade on any path offering the `grpc-websockets-multiplex` subprotocol: gRPC calls
    multiplexed over the socket (tickwire.server.web.multiplex).
"""
from __future__ import annotations

import asyncio
import gzip
import html
import logging
import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Optional
from urllib.parse import quote

from aiohttp import WSMsgType, web

from tickwire.server.services.context import ServerContext
from tickwire.server.services.rpc import GuardedMethod
from tickwire.server.web.assets import MISSING_ASSETS, AssetSource
from tickwire.server.web.multiplex import CURRENT_SOCKET, MultiplexSocket

if TYPE_CHECKING:
    from tickwire.server.observability import Observability

__all__ = ["WebSide", "SUBPROTOCOL"]

log = logging.getLogger(__name__)

SUBPROTOCOL = "grpc-websockets-multiplex"
GZIP_CACHE_BYTES = 32 * 1024 * 1024


class WebSide:
    """The aiohttp application of one server. `methods` are the server's guarded methods (built
    with `precheck` as their credentials check, so that each socket knows the sessions it used)."""

    def __init__(self, ctx: ServerContext, assets: Optional[AssetSource], *, session_grace_s: float = 10.0,
                 send_queue: int = 8, max_streams: int = 256):
        self.ctx = ctx
        self.assets = assets
        self.session_grace_s = session_grace_s
        self.send_queue = send_queue
        self.max_streams = max_streams
        self.methods: dict[str, GuardedMethod] = {}
        self.sockets: "weakref.WeakSet[MultiplexSocket]" = weakref.WeakSet()
        self.runner: Optional[web.AppRunner] = None
        self.sites: list[web.BaseSite] = []
        self.stats = {"sockets_opened": 0, "sockets_closed": 0}
        self._handler_tasks: set[asyncio.Task] = set()
        self._gzip_cache: OrderedDict = OrderedDict()
        self._gzip_bytes = 0
        self._closing = False
        self.observability: Optional[Observability] = None  # the server's health and metrics (set before start)
        self.app = web.Application(client_max_size=1024 * 1024)
        self.app.router.add_route("GET", "/", self._root)
        self.app.router.add_route("GET", "/tables/", self._tables)
        self.app.router.add_route("GET", "/tables", self._root)
        self.app.router.add_route("GET", "/js-plugins/manifest.json", self._plugins)
        self.app.router.add_route("GET", "/healthz", self._healthz)
        self.app.router.add_route("GET", "/metrics", self._metrics)
        self.app.router.add_route("GET", "/{tail:.*}", self._any)

    # -- credentials ----------------------------------------------------------------------------
    def precheck(self, metadata, peer=None):
        """The session manager's check, noting the session on the socket the call came from."""
        sock = CURRENT_SOCKET.get()
        session = self.ctx.sessions.authenticate(metadata, peer=f"ws:{sock.peer}" if sock is not None else peer)
        if sock is not None:
            sock.sessions.add(session)
        return session

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        self.runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self.runner.setup()

    @property
    def protocol_factory(self) -> Callable:
        """For connections accepted elsewhere (the port splitter)."""
        assert self.runner is not None
        server = self.runner.server
        assert server is not None  # set by the runner's setup() in start()
        return server

    async def listen(self, host: str, port: int, ssl_context=None) -> int:
        """Serves on its own port as well; returns the port bound."""
        assert self.runner is not None
        site = web.TCPSite(self.runner, host, port, ssl_context=ssl_context, reuse_address=True)
        await site.start()
        self.sites.append(site)
        return self.runner.addresses[-1][1]  # the site just started is the runner's last

    async def close(self) -> None:
        """Go-away on every socket, then the sockets and the sites close."""
        self._closing = True
        socks = list(self.sockets)
        if socks:
            await asyncio.gather(*(s.go_away() for s in socks), return_exceptions=True)
        tasks = list(self._handler_tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    @property
    def open_sockets(self) -> int:
        return sum(1 for s in self.sockets if not s.closed)

    # -- pages ----------------------------------------------------------------------------------
    async def _root(self, request: web.Request) -> web.StreamResponse:
        if _is_upgrade(request):
            return await self._websocket(request)
        raise web.HTTPFound("/tables/")

    async def _tables(self, request: web.Request) -> web.StreamResponse:
        if _is_upgrade(request):
            return await self._websocket(request)
        names = await self.ctx.run(self.ctx.scope.names)
        items = "\n".join(
            f'<li><a href="/iframe/widget/?name={quote(n, safe="")}">{html.escape(n)}</a></li>' for n in sorted(names))
        note = "" if self.assets is not None else f'<p class="missing">{html.escape(MISSING_ASSETS)}</p>'
        page = (
            "<!doctype html><html><head><meta charset='utf-8'><title>tickwire tables</title>"
            "<style>body{font-family:sans-serif;margin:2em}li{margin:.3em 0}.missing{color:#a00}</style></head>"
            f"<body><h1>Tables</h1>{note}<ul>{items or '<li>(no tables yet)</li>'}</ul>"
            "<p>Each link opens Deephaven's grid page on the live table.</p></body></html>")
        return web.Response(text=page, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def _healthz(self, request: web.Request) -> web.StreamResponse:
        if self.observability is None:
            return web.Response(status=503, text="NOT_SERVING\n")
        return await self.observability.healthz(request)

    async def _metrics(self, request: web.Request) -> web.StreamResponse:
        if self.observability is None:
            raise web.HTTPNotFound(text="/metrics: not found")
        return await self.observability.metrics_page(request)

    async def _plugins(self, request: web.Request) -> web.StreamResponse:
        return web.json_response({"plugins": []})

    async def _any(self, request: web.Request) -> web.StreamResponse:
        if _is_upgrade(request):
            return await self._websocket(request)
        path = request.match_info["tail"]
        if not path.startswith(("jsapi/", "iframe/")) and path not in ("jsapi", "iframe"):
            raise web.HTTPNotFound(text=f"/{path}: not found")
        if path in ("iframe/widget", "jsapi"):
            raise web.HTTPMovedPermanently(f"/{path}/" + (f"?{request.query_string}" if request.query_string else ""))
        if self.assets is None:
            raise web.HTTPNotFound(text=MISSING_ASSETS)
        asset = await self.ctx.run(self.assets.read, path)
        if asset is None:
            raise web.HTTPNotFound(text=f"/{path}: not found")
        headers = {"ETag": asset.etag, "Cache-Control": "no-cache", "Vary": "Accept-Encoding"}
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        body = asset.data
        if "gzip" in request.headers.get("Accept-Encoding", "") and _compressible(asset.content_type, len(body)):
            body = await self._gzipped(path, asset)
            headers["Content-Encoding"] = "gzip"
        return web.Response(body=body, content_type=asset.content_type, headers=headers)

    async def _gzipped(self, path: str, asset) -> bytes:
        """The asset gzipped once (dh-core.js is 8 MB as it is, 1 MB gzipped), kept in a cache of
        at most GZIP_CACHE_BYTES compressed bytes."""
        key = (path, asset.etag)
        hit = self._gzip_cache.get(key)
        if hit is not None:
            self._gzip_cache.move_to_end(key)
            return hit
        data = await self.ctx.run(gzip.compress, asset.data, 6)
        self._gzip_cache[key] = data
        self._gzip_bytes += len(data)
        while self._gzip_bytes > GZIP_CACHE_BYTES and len(self._gzip_cache) > 1:
            _k, old = self._gzip_cache.popitem(last=False)
            self._gzip_bytes -= len(old)
        return data

    # -- the gRPC websocket ----------------------------------------------------------------------
    async def _websocket(self, request: web.Request) -> web.StreamResponse:
        offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        if SUBPROTOCOL not in offered:
            raise web.HTTPBadRequest(text=f"websockets must offer the {SUBPROTOCOL} subprotocol "
                                          f"(offered: {', '.join(offered) or 'none'})")
        cfg = self.ctx.config
        ws = web.WebSocketResponse(protocols=(SUBPROTOCOL,), compress=False, heartbeat=30.0,
                                   max_msg_size=cfg.max_inbound_message_size + 64 * 1024)
        await ws.prepare(request)
        peer = request.remote or "?"

        async def close_ws(code: int, reason: str) -> None:
            await ws.close(code=code, message=reason.encode("ascii", "replace"))

        sock = MultiplexSocket(self.methods, ws.send_bytes, close_ws, peer=peer,
                               max_message_size=cfg.max_inbound_message_size, max_streams=self.max_streams,
                               send_queue=self.send_queue, on_closed=self._socket_closed)
        self.sockets.add(sock)
        self.stats["sockets_opened"] += 1
        task = asyncio.current_task()
        assert task is not None  # a request handler runs in a task
        self._handler_tasks.add(task)
        log.debug("websocket opened from %s", peer)
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    if not await sock.feed(msg.data):
                        break
                elif msg.type == WSMsgType.TEXT:
                    await close_ws(1003, "grpc-websockets-multiplex carries binary messages only")
                    break
                elif msg.type in (WSMsgType.ERROR, WSMsgType.CLOSE, WSMsgType.CLOSING, WSMsgType.CLOSED):
                    break
        finally:
            self._handler_tasks.discard(task)
            await sock.closed_by_peer()
            if not ws.closed and not self._closing:
                await ws.close()
        return ws

    def _socket_closed(self, sock: MultiplexSocket) -> None:
        self.stats["sockets_closed"] += 1
        until = self.ctx.clock.monotonic() + self.session_grace_s
        for session in sock.sessions:
            self.ctx.sessions.shorten_lease(session, until)
        log.debug("websocket from %s closed (%d sessions on a %.0f s lease)", sock.peer, len(sock.sessions),
                  self.session_grace_s)


def _compressible(content_type: str, size: int) -> bool:
    return size >= 1024 and (content_type.startswith("text/") or content_type in (
        "application/json", "image/svg+xml", "application/javascript"))


def _is_upgrade(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").lower() == "websocket"
