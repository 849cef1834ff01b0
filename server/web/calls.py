"""One gRPC call carried by a browser transport (the websocket multiplex, HTTP/2 gRPC-Web), run by
the server's `GuardedMethod` as the gRPC port runs it: the context its handler sees, and the run
that sends each response and ends with one status. Each transport frames the messages and the
status its own way (`send`, `finish`).

Must not touch: the engine or its lock (handlers reach it through the guarded methods).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Iterable, Optional

import grpc

from tickwire.errors import ProtocolError
from tickwire.protocol.proto.methods import CLIENT_STREAM, UNARY
from tickwire.server.services.rpc import GuardedMethod

__all__ = ["CallContext", "run_call", "cancel_until_done"]

log = logging.getLogger(__name__)


class _Aborted(grpc.aio.AbortError):
    pass


class CallContext:
    """What handlers use of a grpc.aio ServicerContext: the call's metadata, its peer, `abort`,
    and `send_initial_metadata` (`start(headers)`: the transport's response headers)."""

    def __init__(self, metadata, peer: Callable[[], str], start: Callable[[tuple], Awaitable[None]]):
        self._metadata = metadata
        self._peer = peer
        self._start = start
        self.code: Optional[grpc.StatusCode] = None
        self.details = ""

    def invocation_metadata(self):
        return self._metadata

    async def send_initial_metadata(self, metadata) -> None:
        await self._start(tuple((str(k), str(v)) for k, v in metadata))

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        self.code, self.details = code, details
        raise _Aborted()

    def peer(self) -> str:
        return self._peer()

    def time_remaining(self) -> Optional[float]:
        """None: the browsers' calls carry no deadline."""
        return None


async def cancel_until_done(tasks: Iterable[asyncio.Task], what: str) -> None:
    """Cancels `tasks` (calls whose client went) and waits for them. A task still running a moment
    after its cancellation (one that let it pass, as asyncio.wait_for can before Python 3.12) is
    cancelled again, and named in the log, until it ends: a call nobody reads must not run on."""
    pending = {t for t in tasks if not t.done()}
    while pending:
        for t in pending:
            t.cancel()
        _done, pending = await asyncio.wait(pending, timeout=1.0)
        if pending:
            log.warning("%s: %d call(s) still running after their cancellation: %s", what, len(pending),
                        sorted(t.get_name() for t in pending))


async def run_call(gm: GuardedMethod, request: Any, context: CallContext,
                   send: Callable[[bytes], Awaitable[None]],
                   finish: Callable[[grpc.StatusCode, str], Awaitable[None]]) -> None:
    """Runs `gm` on `request` (bytes, or an async iterator of them for a method that streams
    requests): `send(payload)` for each response message, then `finish(code, message)` once,
    OK or the status the call ended with. Cancellation and transport errors pass through."""
    ser = gm.serialize
    try:
        if gm.kind in (UNARY, CLIENT_STREAM):
            response = await gm.fn(request, context)
            await send(ser(response) if ser else response)
        else:
            responses = gm.fn(request, context)
            try:
                async for item in responses:
                    await send(ser(item) if ser else item)
            finally:
                await responses.aclose()  # now, not when collected: it may hold a subscription
    except grpc.aio.AbortError:
        await finish(context.code or grpc.StatusCode.UNKNOWN, context.details)
        return
    except ProtocolError as err:
        await finish(grpc.StatusCode[err.code], str(err))
        return
    await finish(grpc.StatusCode.OK, "")
