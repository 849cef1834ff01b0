"""One port for gRPC and the browser: connections are told apart by their first bytes.

An HTTP/2 client (every gRPC client, Flight and Barrage included) opens with the 24-byte connection
preface `PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n`; a browser opens with an HTTP/1.1 request line. The
splitter owns the listening socket, peeks at each new connection without consuming anything, and

  * hands an HTTP/2 connection to grpcio, which listens on a private loopback port: one relay
    thread moves the bytes of every such connection with non-blocking `splice(2)` (kernel to
    kernel, never through Python objects) as epoll reports them ready. splice is called without
    releasing the interpreter lock: it returns at once, and a thread that released the lock for
    each call would wait to take it back behind every busy thread, for each message (a thread per
    connection and direction did: a third of the server's CPU and most of its latency tail with 50
    subscribers at a 10 ms cycle). The extra hop is still not free on one machine:
    bench/bench_web.py measures a bulk DoGet through the splitter against grpcio's own port
    (`--web-port`, or `web=False`, serves gRPC directly);
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
import ctypes
import ctypes.util
import errno
import logging
import os
import select
import socket
import sys
import threading
from typing import Any, Callable, Optional, Union

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


_SPLICE_F_MOVE = 1
_SPLICE_F_NONBLOCK = 2


def _splice_holding_the_lock() -> Optional[Callable[..., int]]:
    """libc's splice(2) through ctypes.PyDLL, which keeps the interpreter lock during the call
    (None where there is none: not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.PyDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = libc.splice
    except (OSError, AttributeError):  # pragma: no cover - a Linux without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    fn.restype = ctypes.c_ssize_t
    return fn  # type: ignore[no-any-return]


_splice = _splice_holding_the_lock()


def _cut(*socks: socket.socket) -> None:
    """Shuts both directions of each socket (whoever reads or writes them sees them end)."""
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class _Flow:
    """One direction of a relayed connection: src -> a pipe -> dst."""

    __slots__ = ("src", "dst", "dst_sock", "r", "w", "held", "ended", "done")

    def __init__(self, src: socket.socket, dst: socket.socket):
        self.src, self.dst, self.dst_sock = src.fileno(), dst.fileno(), dst
        self.r, self.w = os.pipe()
        try:
            import fcntl
            fcntl.fcntl(self.w, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:  # past the user's pipe allowance: the default size still works
            pass
        self.held = 0        # bytes in the pipe, not yet written to dst
        self.ended = False   # src has ended (read all it sent)
        self.done = False    # ... and dst's writing side is shut

    @property
    def reading(self) -> bool:
        return not self.ended and not self.held


class _Link:
    """One relayed gRPC connection (client <-> grpcio): two flows; both sockets close when both
    flows are done or either side fails."""

    def __init__(self, client: socket.socket, upstream: socket.socket, done: Callable[[Any], None],
                 hop: Optional[tuple[str, int]] = None):
        self.client, self.upstream, self.done = client, upstream, done
        self.hop = hop  # the upstream socket's (host, port): how grpcio sees this connection
        client.setblocking(False)
        upstream.setblocking(False)
        self.socks = {client.fileno(): client, upstream.fileno(): upstream}
        self.flows = (_Flow(client, upstream), _Flow(upstream, client))
        self.closed = False

    def flow_from(self, fd: int) -> _Flow:
        return self.flows[0] if self.flows[0].src == fd else self.flows[1]

    def flow_to(self, fd: int) -> _Flow:
        return self.flows[0] if self.flows[0].dst == fd else self.flows[1]

    def abort(self) -> None:
        """Cuts both sides (from any thread): the relay sees them end and closes the link."""
        _cut(self.client, self.upstream)


class _Relay:
    """The thread that moves the bytes of every relayed connection (see the module docstring):
    an fd is in its epoll set with what its flows wait for (readable while its outgoing flow's
    pipe is empty, writable while its incoming flow's pipe holds bytes), and nothing else."""

    def __init__(self, splice: Callable[..., int]):
        self._splice = splice
        self._ep = select.epoll()
        self._links: dict[int, _Link] = {}   # fd -> its link
        self._masks: dict[int, int] = {}     # fd -> the events it is registered for
        self._lock = threading.Lock()        # _links and _masks: add() runs on other threads
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        self._ep.register(self._wake_r, select.EPOLLIN)
        self._thread = threading.Thread(target=self._run, name="tickwire-splice", daemon=True)
        self._thread.start()

    def add(self, link: _Link) -> None:
        with self._lock:
            for fd in link.socks:
                self._links[fd] = link
                self._set_mask(fd, select.EPOLLIN)

    def stop(self) -> None:
        """Ends the thread once every link has closed (the caller aborts them)."""
        self._stopping = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass

    def _set_mask(self, fd: int, mask: int) -> None:
        old = self._masks.get(fd, 0)
        if mask == old:
            return
        if not mask:
            self._ep.unregister(fd)   # an fd waiting for nothing must not report its hang-up
            del self._masks[fd]
        elif old:
            self._ep.modify(fd, mask)
        else:
            self._ep.register(fd, mask)
        if mask:
            self._masks[fd] = mask

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._stopping and not self._links:
                    break
            try:
                events = self._ep.poll(1.0 if self._stopping else -1)
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            for fd, ev in events:
                if fd == self._wake_r:
                    os.read(self._wake_r, 64)
                    continue
                with self._lock:
                    link = self._links.get(fd)
                if link is None or link.closed:
                    continue
                try:
                    self._serve(link, fd, ev)
                except OSError as exc:
                    log.debug("relayed connection failed: %s", exc)
                    self._close(link)
                except Exception:  # pragma: no cover - a defect: that link goes, the others are served
                    log.exception("relaying a connection failed")
                    self._close(link)
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _serve(self, link: _Link, fd: int, ev: int) -> None:
        if ev & select.EPOLLERR:
            raise OSError(errno.ECONNRESET, "socket error")
        out, back = link.flow_from(fd), link.flow_to(fd)
        if ev & (select.EPOLLIN | select.EPOLLHUP) and out.reading:
            self._fill(out)
        if ev & (select.EPOLLOUT | select.EPOLLHUP) and back.held:
            self._drain(back)
        if all(f.done for f in link.flows):
            self._close(link)
            return
        with self._lock:
            for s in link.socks:
                f_out, f_back = link.flow_from(s), link.flow_to(s)
                self._set_mask(s, (select.EPOLLIN if f_out.reading else 0)
                               | (select.EPOLLOUT if f_back.held else 0))

    def _call(self, *args: Any) -> int:
        n = self._splice(*args)
        if n < 0:
            err = ctypes.get_errno()
            if err in (errno.EAGAIN, errno.EINTR):
                return -1
            raise OSError(err, os.strerror(err))
        return n

    def _fill(self, f: _Flow) -> None:
        n = self._call(f.src, None, f.w, None, _PIPE_BYTES, _SPLICE_F_MOVE | _SPLICE_F_NONBLOCK)
        if n == 0:
            f.ended = True
        elif n > 0:
            f.held += n
        self._drain(f)

    def _drain(self, f: _Flow) -> None:
        while f.held:
            n = self._call(f.r, None, f.dst, None, f.held, _SPLICE_F_MOVE | _SPLICE_F_NONBLOCK)
            if n < 0:  # dst is full: the flow waits for it to take more
                return
            f.held -= n
        if f.ended and not f.done:  # src ended and everything it sent is through: so does dst
            f.done = True
            try:
                f.dst_sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def _close(self, link: _Link) -> None:
        if link.closed:
            return
        link.closed = True
        with self._lock:
            for fd in link.socks:
                self._set_mask(fd, 0)
                self._links.pop(fd, None)
        for f in link.flows:
            for pipe_end in (f.r, f.w):
                try:
                    os.close(pipe_end)
                except OSError:
                    pass
        for sock in link.socks.values():
            try:
                sock.close()
            except OSError:
                pass
        link.done(link)


def _wake(ready: "asyncio.Future[None]") -> None:
    """A reader callback: the socket has bytes to read."""
    if not ready.done():
        ready.set_result(None)


class _Bridge:
    """One proxied gRPC connection where there is no splice(2) to relay it: a pump (a thread)
    each way; both sockets close when both pumps end."""

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
        _cut(self.client, self.upstream)


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
        self._bridges: set[Union[_Bridge, _Link]] = set()
        self._relay: Optional[_Relay] = None   # started with the first relayed connection
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
                self.counts["grpc"] += 1
                with self._bridges_lock:
                    if client is not None:
                        self._peers[hop] = client  # before the first byte reaches grpcio
                    if _splice is not None:
                        if self._relay is None:
                            self._relay = _Relay(_splice)
                        link = _Link(conn, upstream, self._bridge_done, hop)
                        self._bridges.add(link)
                        self._relay.add(link)
                    else:  # pragma: no cover - platforms without splice
                        conn.setblocking(True)
                        upstream.setblocking(True)
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

    def _bridge_done(self, bridge: Union[_Bridge, _Link]) -> None:
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
            relay, self._relay = self._relay, None
        for b in bridges:
            b.abort()
        if relay is not None:
            relay.stop()
