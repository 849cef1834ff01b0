"""Forwarding: calls passed to another gRPC server as raw bytes, with their metadata and status.

    forwarder = Forwarder("engine-host:10000")
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([forwarder])    # every method, any service
    ...
    await forwarder.close()

A `Forwarder` is a catch-all generic handler of a grpc.aio server: each call it receives is made
again on `target` under the same method name, with the caller's metadata (authorization headers
included, so sessions, tokens and exports stay the target's), its deadline, and every request
message as it arrives; the target's initial metadata, responses, trailing metadata and status
(code and details) come back unchanged. Unary, server-streaming, client-streaming and bidi calls
all travel as bidi streams of raw bytes: the wire is the same for every kind, and nothing is
decoded. A client that cancels cancels the forwarded call; a target that cannot be reached answers
UNAVAILABLE naming it. `forward(method, requests, context, first=...)` passes one call on from a
handler of one's own that has already read its first requests (to look at them and decide).

The target sees the forwarder as the calls' peer. A Forwarder made with a `forwarded_key` names
each call's own client to it in one more header, FORWARDED_FOR ("KEY PEER"); a target that knows
the key takes that peer for the call's (`forwarded_peer`), and one that does not ignores it. A
caller's own FORWARDED_FOR header is never passed on.

This module holds no state of the calls it passes on beyond each call's own; it knows nothing of
tickwire's engine, sessions or methods.
"""
from __future__ import annotations

import asyncio
import hmac
import logging
from typing import AsyncIterator, Collection, Optional, Sequence

import grpc

__all__ = ["FORWARDED_FOR", "Forwarder", "forwarded_peer", "passed_metadata"]

log = logging.getLogger(__name__)

# headers of one hop, which grpc sets itself on each connection and call
_HOP = frozenset({"content-type", "te", "user-agent", "host", "connection", "keep-alive", "transfer-encoding",
                  "upgrade", "accept-encoding", "content-encoding"})


def passed_metadata(md: Optional[Sequence[tuple[str, object]]]) -> list[tuple[str, object]]:
    """The metadata a call passes on: everything but HTTP/2 pseudo-headers, grpc's reserved
    `grpc-` keys and per-hop headers."""
    out: list[tuple[str, object]] = []
    for key, value in md or ():
        k = key.lower()
        if k.startswith((":", "grpc-")) or k in _HOP:
            continue
        out.append((k, value))
    return out


#: the header under which a Forwarder with a `forwarded_key` names the client of a call it passes on
FORWARDED_FOR = "x-tickwire-forwarded-for"


def forwarded_peer(metadata: Optional[Sequence[tuple[str, object]]], key: Optional[str]) -> Optional[str]:
    """The client a forwarder sharing `key` named in a call's metadata, or None (no key, no such
    header, or another key)."""
    if not key:
        return None
    for k, v in metadata or ():
        if k == FORWARDED_FOR and isinstance(v, str):
            given, _, peer = v.partition(" ")
            if peer and hmac.compare_digest(given.encode(), key.encode()):
                return peer
    return None


class Forwarder(grpc.GenericRpcHandler):
    """A grpc.aio generic handler that forwards every call to `target` (see the module
    docstring). `options`: channel options of the connection to the target (message size
    limits, keepalive); `credentials`: TLS to the target (None: plaintext).

    `hold`: methods whose requests are passed on only once the target has answered the call's
    headers (or ended it), for a target that answers them before it reads any request, as
    tickwire does for its streaming-request methods (it checks credentials first). A request
    sent under a call the target has just refused fails, and grpcio then reports the call as
    INTERNAL ("Internal error from Core") in place of the target's status; holding the requests
    until the headers keeps the target's refusal.

    `forwarded_key`: names each call's client to the target under this key (FORWARDED_FOR)."""

    def __init__(self, target: str, *, options: Sequence[tuple[str, object]] = (),
                 credentials: Optional[grpc.ChannelCredentials] = None, hold: Collection[str] = (),
                 forwarded_key: Optional[str] = None):
        self.target = target
        self.hold = frozenset(hold)
        self.forwarded_key = forwarded_key
        self._options = list(options)
        self._credentials = credentials
        self._channel: Optional[grpc.aio.Channel] = None

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        method = method.decode() if isinstance(method, bytes) else str(method)

        async def serve(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            async for raw in self.forward(method, requests, context):
                yield raw
        return grpc.stream_stream_rpc_method_handler(serve)

    def channel(self) -> grpc.aio.Channel:
        """The connection to the target (made on first use, on the running loop)."""
        if self._channel is None:
            if self._credentials is not None:
                self._channel = grpc.aio.secure_channel(self.target, self._credentials, options=self._options)
            else:
                self._channel = grpc.aio.insecure_channel(self.target, options=self._options)
        return self._channel

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()

    def call_metadata(self, context: grpc.aio.ServicerContext) -> list[tuple[str, object]]:
        """The metadata a call of `context` passes on: its own (`passed_metadata`) but a
        FORWARDED_FOR header, and with `forwarded_key` this forwarder's naming its client."""
        md = [(k, v) for k, v in passed_metadata(context.invocation_metadata()) if k != FORWARDED_FOR]
        if self.forwarded_key:
            md.append((FORWARDED_FOR, f"{self.forwarded_key} {context.peer()}"))
        return md

    async def forward(self, method: str, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext,
                      first: Sequence[bytes] = ()) -> AsyncIterator[bytes]:
        """Makes the call `method` ("/package.Service/Method") on the target with `first` (the
        requests already read, when any) and then `requests`, yields its responses and ends as
        it ends: its status, details and trailing metadata become this call's."""
        remaining = context.time_remaining()
        call = self.channel().stream_stream(method)(
            metadata=self.call_metadata(context),
            timeout=remaining if remaining is not None and remaining < 1e9 else None)
        writer = asyncio.ensure_future(_pump(call, requests, first, method in self.hold))
        failure: Optional[grpc.aio.AioRpcError] = None
        try:
            try:
                initial = passed_metadata(await call.initial_metadata())
                if initial:
                    await context.send_initial_metadata(initial)
                async for raw in call:
                    yield raw
            except grpc.aio.AioRpcError as exc:
                failure = exc
            trailing = passed_metadata(failure.trailing_metadata() if failure is not None
                                       else await call.trailing_metadata())
            if failure is None:
                if trailing:
                    context.set_trailing_metadata(trailing)
                return
        finally:
            writer.cancel()
            if not call.done():
                call.cancel()  # this call ended first (cancelled by its client): so does the target's
        code, details = failure.code(), failure.details() or ""
        if code == grpc.StatusCode.UNAVAILABLE and not trailing:
            details = f"forwarding to {self.target}: {details}"
        await context.abort(code, details, trailing_metadata=tuple(trailing))


async def _pump(call: grpc.aio.StreamStreamCall, requests: AsyncIterator[bytes], first: Sequence[bytes],
                hold: bool) -> None:
    """The client's requests to the forwarded call (with `hold`, once the target has answered its
    headers), then its half-close."""
    try:
        if hold:
            await call.initial_metadata()
            if call.done():
                return
        for raw in first:
            await call.write(raw)
        async for raw in requests:
            await call.write(raw)
        await call.done_writing()
    except asyncio.CancelledError:
        raise
    except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
        # the forwarded call is over: its status reaches the client through the responses
        log.debug("forwarded call over while passing requests on: %r", exc)
    except Exception:  # noqa: BLE001 - the client's stream failed: the forwarded call ends with it
        log.debug("forwarding requests failed", exc_info=True)
        call.cancel()
