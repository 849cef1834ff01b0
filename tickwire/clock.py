"""Time, as the code that decides by it reads it: one `Clock` passed in, never the `time` module.

Everything whose behaviour depends on time (the update graph's cycle timing, publishing
intervals, session leases, staging TTLs, the performance tables' timestamps and intervals,
fsync intervals, reconnect backoff) reads an injected `Clock`:

- `now()` / `now_ns()`: wall-clock time (seconds / nanoseconds since the epoch), for timestamps;
- `monotonic()`: seconds that never go back, for deadlines, intervals and leases;
- `wait(event, timeout)`: blocks until `event` is set or `timeout` seconds of this clock pass;
- `sleep(seconds)` (async): an asyncio sleep of this clock's seconds.

`SYSTEM_CLOCK` is the real one. `ManualClock` is a test's: its time moves only when the test
calls `advance(seconds)`, which wakes every `wait` and `sleep` whose deadline it passes, so a test
steps a lease, a TTL or an update interval exactly, however loaded the machine is.

Durations that are only measured and reported (how long a cycle or a snapshot took:
`time.perf_counter`) are not read through the clock: nothing decides by them.

This module imports nothing of tickwire: every layer may use it.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import threading
import time
from typing import Callable, Optional, Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "ManualClock", "SYSTEM_CLOCK"]


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    def now_ns(self) -> int:
        """Wall-clock nanoseconds since the epoch."""
        ...

    def monotonic(self) -> float:
        """Seconds that never go back (deadlines, intervals, leases)."""
        ...

    def wait(self, event: threading.Event, timeout: Optional[float]) -> bool:
        """Blocks until `event` is set (True) or `timeout` seconds of this clock have passed
        (False); `timeout` None waits for the event only."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Sleeps `seconds` of this clock (on the running event loop)."""
        ...


class SystemClock:
    """The machine's clocks."""

    def now(self) -> float:
        return time.time()

    def now_ns(self) -> int:
        return time.time_ns()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, timeout: Optional[float]) -> bool:
        return event.wait(None if timeout is None else max(0.0, timeout))

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock whose time moves only when `advance` (or `set`) is called.

    `monotonic()` starts at `start` (1000.0: not zero, so code that treats 0 as "never" is not
    fooled) and `now()` at `wall` (2024-01-01T00:00:00Z). `advance(dt)` moves both, then wakes
    every `wait` and `sleep` whose deadline has passed, in deadline order. Threads blocked in
    `wait` poll their event every `poll` real seconds as well, so an event set by another thread
    wakes them without the test advancing time."""

    def __init__(self, start: float = 1000.0, wall: float = 1_704_067_200.0, poll: float = 0.005):
        self._mono = float(start)
        self._offset = float(wall) - float(start)  # wall time = monotonic + offset
        self._lock = threading.Lock()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._ids = itertools.count()
        self._poll = poll
        self.waits = 0  # how many wait() calls have started: a test can wait for a thread to be waiting

    # -- reading ------------------------------------------------------------------------------------
    def monotonic(self) -> float:
        with self._lock:
            return self._mono

    def now(self) -> float:
        with self._lock:
            return self._mono + self._offset

    def now_ns(self) -> int:
        return int(round(self.now() * 1e9))

    # -- moving -------------------------------------------------------------------------------------
    def advance(self, seconds: float) -> float:
        """Moves time forward by `seconds` (not negative); returns the new monotonic time."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back ({seconds} s)")
        with self._lock:
            self._mono += float(seconds)
            now = self._mono
            due = []
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
        for fire in due:
            fire()
        return now

    def set(self, monotonic: float) -> float:
        """Moves time forward to `monotonic`."""
        return self.advance(max(0.0, monotonic - self.monotonic()))

    def _at(self, deadline: float, fire: Callable[[], None]) -> Optional[int]:
        """Calls `fire()` once time reaches `deadline` (now if it has); the timer's id, to `_drop`
        it, or None when it fired at once."""
        with self._lock:
            if deadline <= self._mono:
                timer = None
            else:
                timer = next(self._ids)
                heapq.heappush(self._timers, (deadline, timer, fire))
        if timer is None:
            fire()
        return timer

    def _drop(self, timer: Optional[int]) -> None:
        """Forgets a timer that is no longer wanted (its wait ended another way)."""
        if timer is None:
            return
        with self._lock:
            kept = [t for t in self._timers if t[1] != timer]
            if len(kept) != len(self._timers):
                heapq.heapify(kept)
                self._timers = kept

    @property
    def pending(self) -> int:
        """Waits and sleeps not yet due."""
        with self._lock:
            return len(self._timers)

    # -- waiting ------------------------------------------------------------------------------------
    def wait(self, event: threading.Event, timeout: Optional[float]) -> bool:
        with self._lock:
            self.waits += 1
        if timeout is None:
            while not event.wait(self._poll):
                pass
            return True
        expired = threading.Event()
        timer = self._at(self.monotonic() + max(0.0, timeout), expired.set)
        try:
            while True:
                if event.is_set():
                    return True
                if expired.is_set():
                    return event.is_set()
                event.wait(self._poll)
        finally:
            self._drop(timer)

    async def sleep(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def fire() -> None:
            def done() -> None:
                if not fut.done():
                    fut.set_result(None)
            try:
                loop.call_soon_threadsafe(done)
            except RuntimeError:  # the loop is closed
                pass

        timer = self._at(self.monotonic() + max(0.0, seconds), fire)
        try:
            await fut
        finally:  # a cancelled sleep leaves no timer behind: `pending` counts real waits only
            self._drop(timer)

    def __repr__(self) -> str:
        return f"ManualClock(monotonic={self.monotonic():.6f})"
