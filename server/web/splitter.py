"""One port for gRPC and the browser: connections are told apart by their first bytes.

An HTTP/2 client (every gRPC client, Flight and Barrage included) opens with the 24-byte connection
preface `PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n`; a browser opens with an HTTP/1.1 request line. The
splitter owns the listening socket, peeks at each new connection without consuming anything, and

  * hands an HTTP/2 connection to grpcio, which listens on a private loopback port: two threads per
    connection move the bytes with `splice(2)` (kernel to kernel, never through Python objects).
    The extra hop is not free on one machine: bench/bench_web.py measures a bulk DoGet through the
    splitter against grpcio's own port (`--web-port`, or `web=False`, serves gRPC directly);
  * hands anything else to the web side's protocol factory (aiohttp) as an accepted socket, on the
    event loop, with the peeked bytes still unread.

A connection that sends nothing within `first_bytes_timeout` seconds is closed; the number of
connections waiting to be classified is bounded, the oldest waiting ones being closed first.

grpcio sees each relayed connection as coming from 127.0.0.1 and the hop's port. Each hop is bound
to a port of its own before it connects, and the splitter remembers which client it carries:
`real_peer("ipv4:127.0.0.1:<hop port>")` gives the client's address, in grpcio's own notation.
Its server hands `real_peer` to its handlers (tickwire.server.services.rpc's `peer_resolver`), so
that sessions, logs and handlers name the client.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from typing import Callable, Optional

__all__ = ["PortSplitter", "HTTP2_PREFACE", "classify", "peer_name", "parse_peer"]

log = logging.getLogger(__name__)

HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20


def classify(first: bytes) -> Optional[str]:
    """"grpc" for the HTTP/2 preface, "web" for anything else, None while `first` is still a
    proper prefix of the preface (more bytes are needed to tell)."""
    if first.startswith(HTTP2_PREFACE):
        return "grpc"
    if HTTP2_PREFACE.startswith(first):
        return None
    return "web"


def peer_name(address) -> str:
    """A socket address as grpcio names peers: "ipv4:1.2.3.4:5678", "ipv6:[::1]:5678"."""
    host, port = address[0], address[1]
    return f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"


def parse_peer(peer: str) -> Optional[tuple[str, int]]:
    """(host, port) of a peer in grpcio's notation, None for any other (e.g. "unix:...")."""
    scheme, _sep, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return None
    host, _sep, port = rest.rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Copies src to dst until src ends, then ends dst's writing side."""
    try:
        if hasattr(os, "splice"):
            r, w = os.pipe()
            try:
                try:
                    import fcntl
                    fcntl.fcntl(w, _F_SETPIPE_SZ, _PIPE_BYTES)
                except OSError:
                    pass
                sfd, dfd = src.fileno(), dst.fileno()
                while True:
                    n = os.splice(sfd, w, _PIPE_BYTES)
                    if n == 0:
                        break
                    while n:
                        n -= os.splice(r, dfd, n)
            finally:
                os.close(r)
                os.close(w)
        else:  # pragma: no cover - platforms without splice
            buf = bytearray(1 << 18)
            view = memoryview(buf)
            while True:
                n = src.recv_into(buf)
                if n == 0:
                    break
                dst.sendall(view[:n])
    except OSError:
        pass
    finally:
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _wake(ready: "asyncio.Future[None]") -> None:
    """A reader callback: the socket has bytes to read."""
    if not ready.done():
        ready.set_result(None)


class _Bridge:
    """One proxied gRPC connection: a pump each way; both sockets close when both pumps end."""

    def __init__(self, client: socket.socket, upstream: socket.socket, done: Callable[["_Bridge"], None],
                 hop: Optional[tuple[str, int]] = None):
        self.client, self.upstream, self._done = client, upstream, done
        self.hop = hop  # the upstream socket's (host, port): how grpcio sees this connection
        self._left = 2
        self._lock = threading.Lock()
        for src, dst, name in ((client, upstream, "in"), (upstream, client, "out")):
            threading.Thread(target=self._run, args=(src, dst), name=f"tickwire-splice-{name}", daemon=True).start()

    def _run(self, src, dst) -> None:
        _pump(src, dst)
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if not last:
            # one direction ended: if it ended by an error the other one may be stuck in a read
            return
        for s in (self.client, self.upstream):
            try:
                s.close()
            except OSError:
                pass
        self._done(self)

    def abort(self) -> None:
        for s in (self.client, self.upstream):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class PortSplitter:
    """Accepts on `listener` and routes each connection (see the module docstring).

    `upstream`: the (host, port) grpcio listens on. `web_factory`: an asyncio protocol factory
    (aiohttp's `AppRunner.server`), or None to close non-gRPC connections at once."""

    def __init__(self, listener: socket.socket, upstream: tuple[str, int], web_factory: Optional[Callable] = None, *,
                 first_bytes_timeout: float = 30.0, max_waiting: int = 1024):
        self.listener = listener
        self.upstream = upstream
        self.web_factory = web_factory
        self.first_bytes_timeout = first_bytes_timeout
        self.max_waiting = max_waiting
        self._waiting: dict[socket.socket, asyncio.Task] = {}
        self._bridges: set[_Bridge] = set()
        self._bridges_lock = threading.Lock()
        self._peers: dict[tuple[str, int], str] = {}  # a hop's (host, port) -> the client's peer name
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self.counts = {"grpc": 0, "web": 0, "dropped": 0}

    def start(self) -> None:
        """Starts accepting (on the running loop): the listener is read when it has connections,
        so closing it never leaves an accepted connection behind."""
        self._loop = asyncio.get_running_loop()
        self.listener.setblocking(False)
        self._loop.add_reader(self.listener.fileno(), self._accept_ready)

    def real_peer(self, peer: str) -> str:
        """The client's address (grpcio's notation) for `peer` as grpcio reports a connection
        this splitter relays (the loopback hop); any other peer unchanged."""
        hop = parse_peer(peer)
        if hop is None:
            return peer
        with self._bridges_lock:
            return self._peers.get(hop, peer)

    def _accept_ready(self) -> None:
        for _ in range(64):  # at most this many per wake-up: the loop has other work
            try:
                conn, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE: those already connected keep being served
                log.warning("accept failed: %s", exc)
                return
            if len(self._waiting) >= self.max_waiting:
                oldest = next(iter(self._waiting))
                self._waiting.pop(oldest).cancel()
                self.counts["dropped"] += 1
            conn.setblocking(False)
            assert self._loop is not None  # start() set it before registering this reader
            self._waiting[conn] = self._loop.create_task(self._route(conn))

    async def _first_bytes(self, conn: socket.socket) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.first_bytes_timeout
        while True:
            ready = loop.create_future()
            loop.add_reader(conn.fileno(), _wake, ready)
            try:
                await asyncio.wait_for(ready, max(0.0, deadline - loop.time()))
            finally:
                loop.remove_reader(conn.fileno())
            first = conn.recv(len(HTTP2_PREFACE), socket.MSG_PEEK)
            if not first or classify(first) is not None:
                return first
            await asyncio.sleep(0.002)  # a split preface: wait for the rest without spinning

    async def _route(self, conn: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        try:
            try:
                first = await self._first_bytes(conn)
            except (asyncio.TimeoutError, OSError):
                first = b""
            kind = classify(first) if first else None
            if kind == "grpc":
                upstream = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                upstream.setblocking(False)
                # a port of its own (a connect alone may share its port with connections to
                # other addresses): it names this client to grpcio, and nobody else
                upstream.bind((self.upstream[0], 0))
                hop = upstream.getsockname()[:2]
                try:
                    client = peer_name(conn.getpeername())
                except OSError:  # the client is gone already: the bridge ends at once
                    client = None
                await loop.sock_connect(upstream, self.upstream)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setblocking(True)
                upstream.setblocking(True)
                self.counts["grpc"] += 1
                with self._bridges_lock:
                    if client is not None:
                        self._peers[hop] = client  # before the first byte reaches grpcio
                    self._bridges.add(_Bridge(conn, upstream, self._bridge_done, hop))
                return
            if kind == "web" and self.web_factory is not None:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                self.counts["web"] += 1
                await loop.connect_accepted_socket(self.web_factory, conn)
                return
            conn.close()
        except asyncio.CancelledError:
            conn.close()
        except OSError as exc:
            log.debug("connection dropped while routing: %s", exc)
            conn.close()
        finally:
            self._waiting.pop(conn, None)

    def _bridge_done(self, bridge: _Bridge) -> None:
        with self._bridges_lock:
            self._bridges.discard(bridge)
            if bridge.hop is not None:
                self._peers.pop(bridge.hop, None)

    @property
    def bridged(self) -> int:
        with self._bridges_lock:
            return len(self._bridges)

    async def stop_accepting(self) -> None:
        """Closes the port; connections still being classified are closed (proxied ones go on)."""
        if self._loop is not None and self.listener.fileno() >= 0:
            self._loop.remove_reader(self.listener.fileno())
        self.listener.close()
        tasks = list(self._waiting.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stops accepting; connections being classified are closed, proxied ones cut."""
        await self.stop_accepting()
        with self._bridges_lock:
            bridges = list(self._bridges)
        for b in bridges:
            b.abort()
