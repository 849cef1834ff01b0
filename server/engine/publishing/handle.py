"""A subscription as a transport sees it: a handle that yields FlightData payloads.

A transport (the gRPC DoExchange handler, or any other that moves the same bytes) opens a handle
for a table and a view, iterates `payloads()` and sends each payload as it comes, tells the
handle about view changes (`change`) and about the end of the request stream (`end`), and closes
it. Everything else is decided here: when a message is ready (the publisher's notify, one wake-up
of the event loop per burst), whether it is encoded on the event loop (small) or in the worker
pool a few FlightData at a time (large), and what happens to a FlightData over the client's
max_message_size (RESOURCE_EXHAUSTED: it holds a single row that cannot fit).
"""
from __future__ import annotations

import asyncio
import functools
import threading
from concurrent.futures import Executor, Future
from typing import AsyncIterator, Callable, Iterator, Optional

from tickwire.protocol.batches import DEFAULT_MAX_MESSAGE_SIZE
from tickwire.server.engine.graph import Table
from tickwire.server.engine.publishing.messages import EncodeOptions, Message, RequestOptions, TableWire
from tickwire.server.engine.publishing.publisher import PublisherRegistry, Subscriber
from tickwire.server.engine.publishing.views import SubscriptionError, View

__all__ = ["SubscriptionHandle", "Waker", "encoded_payloads", "describe_view", "outcome_of"]


def describe_view(view: View, ncols: Optional[int] = None) -> str:
    """A view for logs: "all columns, full" or "columns [0, 2], viewport 0-99 reversed"."""
    cols = view.columns
    if ncols is not None and len(cols) == ncols:
        what = f"all {ncols} columns"
    else:
        shown = ", ".join(str(c) for c in cols[:8]) + (", ..." if len(cols) > 8 else "")
        what = f"columns [{shown}]"
    if view.viewport is None:
        return what + ", full"
    ranges = view.viewport.ranges()
    window = ", ".join(f"{a}-{b}" for a, b in ranges[:4].tolist()) + (", ..." if len(ranges) > 4 else "")
    return f"{what}, viewport {window or 'empty'}" + (" reversed" if view.reverse else "")


def outcome_of(exc: BaseException) -> str:
    """How a call that raised `exc` ended, for logs: "cancelled by the client" or "failed: CODE: message"."""
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):
        return "cancelled by the client"
    code = getattr(exc, "code", None)
    code = code if isinstance(code, str) else type(exc).__name__
    text = " ".join(str(exc).split())
    return f"failed: {code}: {text[:300]}"


class Waker:
    """Wakes writers on an event loop from other threads with one loop wake-up per burst: a cycle
    that gives a message to a thousand subscribers costs one call_soon_threadsafe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: list[asyncio.Event] = []
        self._scheduled = False

    def wake(self, loop: asyncio.AbstractEventLoop, event: asyncio.Event) -> None:
        with self._lock:
            self._events.append(event)
            if self._scheduled:
                return
            self._scheduled = True
        loop.call_soon_threadsafe(self._flush)

    def _flush(self) -> None:
        with self._lock:
            events, self._events, self._scheduled = self._events, [], False
        for e in events:
            e.set()


def _next_payloads(it: Iterator[bytes], n: int) -> list[bytes]:
    out = []
    for p in it:
        out.append(p)
        if len(out) >= n:
            break
    return out


async def encoded_payloads(msg: Message, opts: EncodeOptions, executor: Executor,
                           per_hop: int = 2) -> AsyncIterator[bytes]:
    """The message's FlightData, encoded in the worker pool `per_hop` at a time.
    Batches are split to stay under the client's max_message_size; one that is still over it
    holds a single row that cannot fit, which ends the call with RESOURCE_EXHAUSTED rather than
    sending what the client refuses."""
    loop = asyncio.get_running_loop()
    limit = opts.max_message_size or DEFAULT_MAX_MESSAGE_SIZE
    it = msg.payloads(opts)
    while True:
        chunk = await loop.run_in_executor(executor, functools.partial(_next_payloads, it, per_hop))
        if not chunk:
            return
        for p in chunk:
            if len(p) >= limit:
                raise SubscriptionError(f"a single row needs a FlightData of {len(p)} bytes, over max_message_size "
                                        f"{limit}", "RESOURCE_EXHAUSTED")
            yield p


class SubscriptionHandle:
    """One subscriber's stream of FlightData. Use from one event loop:

        handle = SubscriptionHandle(registry, table, view, options, executor=pool, waker=w)
        await handle.open()                 # subscribes (off the loop); errors carry their status
        async for payload in handle.payloads():
            send(payload)                    # the schema first, then every message
        # meanwhile, from the task that reads requests:
        await handle.change(new_view)        # a new viewport / columns / direction
        handle.end()                         # the client half-closed: payloads() returns
        handle.end(error)                    # a bad request: payloads() raises it
        handle.close()                       # always, when the call is over
    """

    def __init__(self, registry: PublisherRegistry, table: Table, view: View, options: RequestOptions, *,
                 executor: Executor,
                 inline_cells: int = 16_384, payloads_per_hop: int = 2, waker: Optional[Waker] = None):
        """`inline_cells`: messages of up to this many values are encoded on the event loop;
        larger ones in `executor`, `payloads_per_hop` FlightData per trip."""
        self.registry = registry
        self.table = table
        self.view = view
        self.options = options
        self.wire = TableWire(table)
        self.encode = EncodeOptions.of(options)
        self.executor = executor
        self.inline_cells = inline_cells
        self.payloads_per_hop = payloads_per_hop
        self.waker = waker or Waker()
        self.sub: Optional[Subscriber] = None
        self._wake: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._ended = False
        self._error: Optional[BaseException] = None
        self._closed = False

    async def open(self) -> "SubscriptionHandle":
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        started = self.executor.submit(self.registry.subscribe, self.table, self.view, self.options, self._notify)
        try:
            self.sub = await asyncio.wrap_future(started)
        except asyncio.CancelledError:  # the call ended while subscribing: release what it got
            def release(f: "Future[Subscriber]") -> None:
                if f.exception() is None:
                    f.result().close()
            started.add_done_callback(release)
            raise
        return self

    def _notify(self) -> None:  # any thread
        assert self._loop is not None and self._wake is not None  # open() sets them before subscribing
        self.waker.wake(self._loop, self._wake)

    def _background(self, fn: Callable[[], None]) -> None:
        self.executor.submit(fn)  # fire and forget: its message arrives with a notify

    async def change(self, view: View) -> None:
        """Asks for another view; the publisher answers it with a snapshot in the stream."""
        assert self.sub is not None, "change() before open()"
        await asyncio.wrap_future(self.executor.submit(self.sub.change, view))
        self.view = view

    def end(self, error: Optional[BaseException] = None) -> None:
        """The request stream ended (half-close), or failed with `error`."""
        self._ended = True
        if error is not None and self._error is None:
            self._error = error
        if self._wake is not None:
            self._wake.set()

    async def payloads(self) -> AsyncIterator[bytes]:
        yield self.wire.schema_payload(self.encode.columns_as_list)
        opts = self.encode
        limit = opts.max_message_size or DEFAULT_MAX_MESSAGE_SIZE
        assert self._wake is not None and self.sub is not None, "payloads() before open()"
        while True:
            await self._wake.wait()  # a message is ready, or the request stream ended
            self._wake.clear()
            if self._error is not None:
                raise self._error
            if self._ended:
                return  # half-closed: the call ends with OK
            while True:
                msg = self.sub.take(self._background)  # raises once the table failed and the outbox has been sent
                if msg is None:
                    break
                ready = msg.cached(opts)
                if ready is None and msg.cells <= self.inline_cells:
                    ready = list(msg.payloads(opts))  # small: encoding here costs less than a trip to the pool
                if ready is not None and all(len(p) < limit for p in ready):
                    for p in ready:
                        yield p
                else:
                    async for p in encoded_payloads(msg, opts, self.executor, self.payloads_per_hop):
                        yield p

    def close(self) -> None:
        """Releases the subscription (not awaited: a cancelled call cannot skip it)."""
        if self._closed or self.sub is None:
            return
        self._closed = True
        try:
            self.executor.submit(self.sub.close)
        except RuntimeError:  # the worker pool is gone: the server is stopping
            self.sub.close()
