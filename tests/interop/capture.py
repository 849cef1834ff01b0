"""A recording gRPC proxy that writes captures in the golden format (shared/golden/README.md).

    with CaptureProxy("127.0.0.1:10000", out_dir) as proxy:
        client = connect(proxy.target)      # "127.0.0.1:<proxy.port>"
        ...
    # out_dir now holds NNNN_<Service>_<Method>.cap per call, index.json and proxy.log

The proxy is a grpcio server with one generic handler that accepts every method path as a
bidirectional stream of raw bytes (no (de)serializers) and forwards it over
`channel.stream_stream(path)` to the upstream server. On the wire unary, server-streaming,
client-streaming and bidirectional calls are all HTTP/2 streams of length-prefixed messages, so
one handler relays them all unchanged: request metadata (minus the headers gRPC reserves for
itself), response initial metadata, messages both ways, trailing metadata, status code and details.

Each message is appended to the call's `.cap` file as it passes: `dir` (b"C" client to server,
b"S" server to client), `t_us` (uint64 LE, microseconds since the call started), `len` (uint32 LE)
and the serialized protobuf message without its 5-byte gRPC frame header.

`index.json` lists the calls in the golden layout (id, method, file, t_start, request_metadata,
response_initial_metadata, response_trailing_metadata, duration_s, status, details, message and
byte counts). A call the client cancels gets the status `CLIENT_CANCELLED (upstream <code>)`,
where <code> is what the upstream call ended with after the proxy cancelled it, as in the goldens.
Metadata values of `-bin` keys are written as `base64:<text>`.
"""
from __future__ import annotations

import base64
import json
import os
import struct
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path

import grpc

__all__ = ["RECORD_HEADER", "CaptureProxy", "cap_file_name", "write_record"]

#: dir (1 byte), t_us (uint64 LE), len (uint32 LE)
RECORD_HEADER = struct.Struct("<cQI")

# Headers that grpc manages itself: it refuses or silently drops them when an application passes them
# (":"-pseudo headers, "grpc-*" such as grpc-status or grpc-timeout, and the HTTP/2 transport headers).
_RESERVED_HEADERS = frozenset({"user-agent", "content-type", "te", "content-length", "host"})
# ... except the rich error status, which an application may set and which is relayed as it is.
_RELAYED_GRPC_HEADERS = frozenset({"grpc-status-details-bin"})

_UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]


def cap_file_name(call_id: int, method: str) -> str:
    """`0003_FlightService_DoExchange.cap` for call 3 of `/arrow.flight.protocol.FlightService/DoExchange`."""
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{call_id:04d}_{service.rpartition('.')[2]}_{name}.cap"


def write_record(fh, direction: str, t_us: int, payload: bytes) -> None:
    """Appends one capture record to a binary file object."""
    fh.write(RECORD_HEADER.pack(direction.encode("ascii"), max(0, int(t_us)), len(payload)))
    fh.write(payload)


def _forwardable(metadata: Iterable | None) -> list[tuple[str, object]]:
    out = []
    for key, value in metadata or ():
        k = key.lower()
        if k.startswith(":") or (k.startswith("grpc-") and k not in _RELAYED_GRPC_HEADERS) or k in _RESERVED_HEADERS:
            continue
        out.append((k, value))
    return out


def _jsonable(metadata: Iterable | None) -> list[list[str]] | None:
    if metadata is None:
        return None
    out = []
    for key, value in metadata:
        if isinstance(value, (bytes, bytearray)):
            value = "base64:" + base64.b64encode(bytes(value)).decode("ascii")
        out.append([key, value])
    return out


class _Call:
    """One proxied call: its .cap file, its counters and its index entry."""

    def __init__(self, call_id: int, method: str, path: Path, request_metadata):
        self.id = call_id
        self.method = method
        self.path = path
        self.t_start = time.time()
        self.t0 = time.monotonic()
        self.request_metadata = _jsonable(request_metadata)
        self.response_initial_metadata: list = []
        self.response_trailing_metadata: list | None = []
        self.status: str | None = None
        self.details = ""
        self.duration_s = 0.0
        self.counts = {"C": [0, 0], "S": [0, 0]}  # messages, bytes
        self.lock = threading.Lock()
        self.fh = open(path, "wb")

    @property
    def done(self) -> bool:
        return self.status is not None

    def record(self, direction: str, payload: bytes) -> None:
        with self.lock:
            if self.done:
                return  # the call already ended (client cancelled); the message was never delivered
            t_us = int((time.monotonic() - self.t0) * 1e6)  # taken under the lock: file order is time order
            write_record(self.fh, direction, t_us, payload)
            self.counts[direction][0] += 1
            self.counts[direction][1] += len(payload)

    def finish(self, status: str, details: str, trailing) -> bool:
        """Ends the call once; returns False when it had already ended."""
        with self.lock:
            if self.done:
                return False
            self.status = status
            self.details = details or ""
            self.response_trailing_metadata = _jsonable(trailing)
            self.duration_s = round(time.monotonic() - self.t0, 6)
            self.fh.close()
            return True

    def entry(self) -> dict:
        return {
            "id": self.id,
            "method": self.method,
            "file": self.path.name,
            "t_start": self.t_start,
            "request_metadata": self.request_metadata,
            "response_initial_metadata": self.response_initial_metadata,
            "response_trailing_metadata": self.response_trailing_metadata,
            "duration_s": self.duration_s,
            "status": self.status or "UNFINISHED",
            "details": self.details,
            "n_client_msgs": self.counts["C"][0],
            "n_server_msgs": self.counts["S"][0],
            "client_bytes": self.counts["C"][1],
            "server_bytes": self.counts["S"][1],
        }


def _code_name(call) -> str:
    code = call.code()
    return code.name if code is not None else "UNKNOWN"


class CaptureProxy:
    """A gRPC proxy on 127.0.0.1 that records every call it relays to `upstream`.

    `port=0` picks a free port. Use it as a context manager, or call `start()` and `close()`.
    Closing stops the server (calls still open are cancelled and recorded as CLIENT_CANCELLED),
    closes the upstream channel and writes `index.json`; `flush()` writes it at any time.
    """

    def __init__(self, upstream: str, out_dir: Path, port: int = 0, *, host: str = "127.0.0.1",
                 max_workers: int = 64, channel_options: list | None = None, grace_s: float = 1.0):
        self.upstream = upstream
        self.out_dir = Path(out_dir)
        self.host = host
        self.grace_s = grace_s
        self._requested_port = port
        self._max_workers = max_workers
        self._channel_options = list(channel_options or []) + _UNLIMITED
        self._lock = threading.Lock()
        self._calls: list[_Call] = []
        self._server: grpc.Server | None = None
        self._channel: grpc.Channel | None = None
        self._log = None
        self.port = 0

    # -- lifecycle ---------------------------------------------------------------------------------
    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> CaptureProxy:
        if self._server is not None:
            raise RuntimeError("CaptureProxy already started")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.out_dir / "proxy.log", "a", buffering=1)
        self._channel = grpc.insecure_channel(self.upstream, options=self._channel_options)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=self._max_workers,
                                                        thread_name_prefix="capture-proxy"),
                             options=_UNLIMITED)
        server.add_generic_rpc_handlers((_Handler(self),))
        port = server.add_insecure_port(f"{self.host}:{self._requested_port}")
        if port == 0:
            raise RuntimeError(f"CaptureProxy could not bind {self.host}:{self._requested_port}")
        self.port = port
        server.start()
        self._server = server
        return self

    def close(self) -> None:
        if self._server is None:
            return
        self._server.stop(self.grace_s).wait()
        self._server = None
        self._channel.close()
        with self._lock:
            calls = list(self._calls)
        for c in calls:
            if c.finish("PROXY_CLOSED", "the proxy closed while the call was open", None):
                self._log_line(f"[{c.id:04d}] <- {c.method} PROXY_CLOSED")
        self.flush()
        self._log.close()

    def __enter__(self) -> CaptureProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- results -----------------------------------------------------------------------------------
    @property
    def calls(self) -> list[dict]:
        """The index entries of the calls recorded so far."""
        with self._lock:
            calls = list(self._calls)
        return [c.entry() for c in calls]

    def flush(self) -> Path:
        """Writes index.json (atomically) and returns its path."""
        path = self.out_dir / "index.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.calls, indent=1) + "\n")
        os.replace(tmp, path)
        return path

    # -- internals ---------------------------------------------------------------------------------
    def _log_line(self, text: str) -> None:
        log = self._log
        if log is not None and not log.closed:
            log.write(text + "\n")

    def _new_call(self, method: str, request_metadata) -> _Call:
        with self._lock:
            call_id = len(self._calls) + 1
            c = _Call(call_id, method, self.out_dir / cap_file_name(call_id, method), request_metadata)
            self._calls.append(c)
        self._log_line(f"[{call_id:04d}] -> {method}")
        return c

    def _ended(self, c: _Call) -> None:
        self._log_line(f"[{c.id:04d}] <- {c.method} {c.status} c={c.counts['C'][0]} s={c.counts['S'][0]} {c.details}")

    def relay(self, method: str, request_iterator, context):
        """The handler body: a generator of response bytes relayed from the upstream call."""
        rec = self._new_call(method, context.invocation_metadata())
        upstream = {"call": None}
        ended = threading.Event()
        gone = threading.Event()  # the client went away: on_terminate records the call, not the relay

        def on_terminate():
            # Runs when the downstream RPC ends; if the relay had not finished, the client went away.
            if ended.is_set():
                return
            gone.set()  # before the cancel, which wakes the relay with an error it must not record
            call = upstream["call"]
            if call is not None:
                call.cancel()
                status = f"CLIENT_CANCELLED (upstream {_code_name(call)})"
                details, trailing = call.details(), call.trailing_metadata()
            else:
                status, details, trailing = "CLIENT_CANCELLED", "", None
            if rec.finish(status, details, trailing):
                self._ended(rec)

        context.add_callback(on_terminate)

        def requests():
            try:
                for msg in request_iterator:
                    rec.record("C", msg)
                    yield msg
            except grpc.RpcError:  # the downstream call was cancelled: stop sending; on_terminate cancels upstream
                return

        remaining = context.time_remaining()
        timeout = remaining if remaining is not None and remaining < 1e8 else None
        call = self._channel.stream_stream(method)(requests(), metadata=_forwardable(context.invocation_metadata()),
                                                   timeout=timeout)
        upstream["call"] = call
        if not context.is_active():
            call.cancel()
        try:
            initial = call.initial_metadata()
        except grpc.RpcError:
            initial = None
        rec.response_initial_metadata = _jsonable(initial) or []
        if initial:
            context.send_initial_metadata(_forwardable(initial))
        try:
            for msg in call:
                rec.record("S", msg)
                yield msg
        except grpc.RpcError:
            pass
        if gone.is_set():
            return
        code = call.code()
        trailing = call.trailing_metadata()
        details = call.details() or ""
        ended.set()
        if rec.finish(code.name, details, trailing):
            self._ended(rec)
        fwd = _forwardable(trailing)
        if fwd:
            context.set_trailing_metadata(fwd)
        if code != grpc.StatusCode.OK:
            context.set_code(code)
            context.set_details(details)


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, proxy: CaptureProxy):
        self._proxy = proxy

    def service(self, handler_call_details):
        method = handler_call_details.method
        proxy = self._proxy

        def behaviour(request_iterator, context):
            return proxy.relay(method, request_iterator, context)

        return grpc.stream_stream_rpc_method_handler(behaviour)
