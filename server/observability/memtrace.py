"""Where a long-running server's memory goes: an optional trace, off unless asked for.

With `TICKWIRE_MEMTRACE=<file>` in the environment, a server started in this process starts a
daemon thread that appends one JSON line to `<file>` every `TICKWIRE_MEMTRACE_SECONDS` (60 by
default):

* `rss_mb` (from /proc), `arrow_mb` (bytes allocated by Arrow's default memory pool),
  `py_blocks` (`sys.getallocatedblocks()`);
* `held_mb`, `holders` and `holders_grown`: the bytes each holder the server names holds (each
  table, each table's publisher, the sessions, the web side: `TickwireServer.memory_by_holder`,
  which counts numpy arrays, Arrow data and Python objects reachable from each, see
  engine/footprint.py), the 20 largest and the 20 that grew most since the first line.

With `TICKWIRE_MEMTRACE_PYTHON=1` it also runs `tracemalloc` and adds:

* `traced_mb` (what tracemalloc sees Python hold);
* `types`: the 20 object types whose live count grew most since the first line (from the garbage
  collector's list of tracked objects);
* `sites`: the 20 allocation sites (file:line, 4 frames deep) whose held bytes grew most since the
  first line.

The holders say which table or part of the server holds memory that grows; for memory no
holder accounts for (the allocator's, gRPC's core), attach a native profiler (memray attach
--native). tracemalloc slows allocation down, so the Python part is for diagnosis runs, never
for measuring latency.

Touches nothing of the engine: it reads process-wide figures, and what the server's holders
function returns.
"""
from __future__ import annotations

import collections
import gc
import json
import os
import sys
import threading
import time
import tracemalloc
from typing import Callable, Optional

__all__ = ["MemTrace", "start_from_environment", "memory_figures"]

_started: Optional["MemTrace"] = None
_lock = threading.Lock()


def memory_figures() -> dict:
    """The process's memory by holder, cheap enough for every metrics scrape."""
    import pyarrow as pa

    rss = float("nan")
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                    break
    except OSError:
        pass
    return {"rss_mb": rss, "arrow_mb": pa.total_allocated_bytes() / 2**20, "py_blocks": sys.getallocatedblocks()}


def _type_counts() -> collections.Counter:
    return collections.Counter(type(o).__qualname__ for o in gc.get_objects())


class MemTrace:
    """Appends a memory line to `path` every `seconds` until `stop()`."""

    def __init__(self, path: str, seconds: float = 60.0, frames: int = 4, *,
                 holders: Optional[Callable[[], dict[str, int]]] = None, python: bool = True):
        self.path = path
        self.seconds = seconds
        self.frames = frames
        self.holders = holders
        self.python = python
        self._first_holders: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tickwire-memtrace", daemon=True)
        self._first: Optional[tracemalloc.Snapshot] = None
        self._first_types: collections.Counter = collections.Counter()
        self._t0 = time.monotonic()

    def start(self) -> "MemTrace":
        if self.python and not tracemalloc.is_tracing():
            tracemalloc.start(self.frames)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def line(self) -> dict:
        """One line of the trace (the first call sets the baseline the later ones are compared with)."""
        out: dict = {"t": round(time.monotonic() - self._t0, 1), **memory_figures()}
        if self.holders is not None:
            held = self.holders()
            first = self._first_holders = self._first_holders or held
            out["held_mb"] = sum(held.values()) / 2**20
            out["holders"] = [[k, v] for k, v in sorted(held.items(), key=lambda kv: -kv[1])[:20]]
            grown = {k: v - first.get(k, 0) for k, v in held.items()}
            out["holders_grown"] = [[k, v] for k, v in sorted(grown.items(), key=lambda kv: -kv[1])[:20]]
        if not self.python:
            return out
        return self._python_line(out)

    def _python_line(self, out: dict) -> dict:
        snap = tracemalloc.take_snapshot().filter_traces(
            (tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)))
        types = _type_counts()
        out["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
        if self._first is None:
            self._first, self._first_types = snap, types
            out["types"] = [[k, n] for k, n in types.most_common(20)]
            out["sites"] = [[str(s.traceback), s.size] for s in snap.statistics("traceback")[:20]]
            return out
        grown = types.copy()
        grown.subtract(self._first_types)
        out["types"] = [[k, n] for k, n in grown.most_common(20)]
        diff = snap.compare_to(self._first, "traceback")
        diff.sort(key=lambda s: s.size_diff, reverse=True)
        out["sites"] = [[" <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in s.traceback),
                         s.size_diff, s.count_diff] for s in diff[:20]]
        return out

    def _run(self) -> None:
        while True:
            try:
                line = self.line()
                with open(self.path, "a") as f:
                    f.write(json.dumps(line) + "\n")
            except Exception as exc:  # noqa: BLE001 - a diagnosis aid never takes the server down
                with open(self.path, "a") as f:
                    f.write(json.dumps({"error": repr(exc)}) + "\n")
            if self._stop.wait(self.seconds):
                return


def start_from_environment(holders: Optional[Callable[[], dict[str, int]]] = None) -> Optional[MemTrace]:
    """Starts the trace once per process if TICKWIRE_MEMTRACE names a file; `holders` gives the
    bytes by holder (a server's tables, publishers, sessions) for each line.
    TICKWIRE_MEMTRACE_PYTHON=1 also runs tracemalloc (the allocation sites and object types that
    grew; it slows the server down); without it, the holders and the figures only, at little cost."""
    global _started
    path = os.environ.get("TICKWIRE_MEMTRACE")
    if not path:
        return None
    with _lock:
        if _started is None:
            _started = MemTrace(path, float(os.environ.get("TICKWIRE_MEMTRACE_SECONDS", "60")), holders=holders,
                                python=os.environ.get("TICKWIRE_MEMTRACE_PYTHON", "0") == "1").start()
        return _started
