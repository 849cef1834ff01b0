"""A small blocking HTTP/2 client over TLS (h2's client side), for the tests of the https web port:
requests sent together on one connection, each answered with its status, headers and body, or
a stream reset by the client once part of its answer came."""
from __future__ import annotations

import socket
import ssl
import struct
from dataclasses import dataclass, field
from typing import Optional

import h2.config
import h2.connection
import h2.events


@dataclass
class Answer:
    status: int = 0
    headers: dict = field(default_factory=dict)
    body: bytes = b""
    ended: bool = False
    reset: bool = False

    def grpc_web(self) -> tuple[list[bytes], dict[str, str]]:
        """The messages and the trailer block of a grpc-web response body."""
        messages, trailers, pos, b = [], {}, 0, self.body
        while pos + 5 <= len(b):
            flag, n = struct.unpack_from(">BI", b, pos)
            chunk = b[pos + 5:pos + 5 + n]
            if flag & 0x80:
                for line in chunk.decode("ascii").split("\r\n"):
                    if line:
                        k, _, v = line.partition(":")
                        trailers[k.strip()] = v.strip()
            else:
                messages.append(chunk)
            pos += 5 + n
        assert pos == len(b), f"a grpc-web body with {len(b) - pos} stray bytes"
        return messages, trailers


def grpc_web_body(payload: bytes) -> bytes:
    return struct.pack(">BI", 0, len(payload)) + payload


class H2Client:
    def __init__(self, host: str, port: int, cafile: str, timeout: float = 30.0):
        ctx = ssl.create_default_context(cafile=cafile)
        ctx.set_alpn_protocols(["h2"])
        raw = socket.create_connection((host, port), timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        assert self.sock.selected_alpn_protocol() == "h2"
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.host = f"{host}:{port}"
        self.answers: dict[int, Answer] = {}

    def close(self) -> None:
        try:
            self.conn.close_connection()
            self.sock.sendall(self.conn.data_to_send())
        except OSError:
            pass
        self.sock.close()

    def send(self, method: str, path: str, headers=(), body: bytes = b"") -> int:
        sid = self.conn.get_next_available_stream_id()
        hdrs = [(":method", method), (":path", path), (":scheme", "https"), (":authority", self.host), *headers]
        self.conn.send_headers(sid, hdrs, end_stream=not body)
        if body:
            self.conn.send_data(sid, body, end_stream=True)
        self.sock.sendall(self.conn.data_to_send())
        self.answers[sid] = Answer()
        return sid

    def reset(self, sid: int) -> None:
        self.conn.reset_stream(sid)
        self.sock.sendall(self.conn.data_to_send())
        self.answers[sid].reset = True

    def read_until(self, done, limit: int = 10_000) -> None:
        """Reads frames until `done()` (socket timeout: the client's `timeout`)."""
        for _ in range(limit):
            if done():
                return
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            for ev in self.conn.receive_data(data):
                a: Optional[Answer] = self.answers.get(getattr(ev, "stream_id", -1))
                if isinstance(ev, h2.events.ResponseReceived) and a is not None:
                    a.headers = dict(ev.headers)
                    a.status = int(a.headers[":status"])
                elif isinstance(ev, h2.events.DataReceived):
                    self.conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if a is not None:
                        a.body += ev.data
                elif isinstance(ev, h2.events.StreamEnded) and a is not None:
                    a.ended = True
                elif isinstance(ev, h2.events.StreamReset) and a is not None:
                    a.reset = True
            out = self.conn.data_to_send()
            if out:
                self.sock.sendall(out)
        raise AssertionError("read_until: too many reads")

    def request(self, method: str, path: str, headers=(), body: bytes = b"") -> Answer:
        sid = self.send(method, path, headers, body)
        self.read_until(lambda: self.answers[sid].ended or self.answers[sid].reset)
        return self.answers[sid]
