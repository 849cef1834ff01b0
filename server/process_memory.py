"""The C allocator of a server process: how many arenas it keeps, and handing freed pages back.

Why: glibc gives each thread that meets contention an arena of its own (up to eight per core) and
an arena returns memory to the system only from its top. gRPC's, the web side's and the engine's
threads allocate and free native, numpy and Python buffers of every size in all of them, and what
they free stays resident. In the demo soak (bench/soak_demo.py) the growth sat in the threads'
arenas and one `malloc_trim(0)` gave 28 MB back at once; with the cap and the trims the hour's RSS
slope fell from +59 % to +33 % of its mean, the rest being the demo's tables growing (its append
tables and what is derived from them, by design).

`tickwire serve` and `tickwire demo` cap the arenas (before the server's threads start) and trim
every minute; a server embedded in another program leaves its allocator to that program (which may
call these itself, or set MALLOC_ARENA_MAX). Not glibc (musl, macOS): both do nothing.

Touches no engine state: process-wide allocator settings only.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import os
import threading
from typing import Callable, Optional

__all__ = ["limit_malloc_arenas", "MallocTrimmer", "malloc_figures"]

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # glibc's mallopt parameter


@functools.lru_cache(maxsize=None)
def _libc() -> Optional[ctypes.CDLL]:
    """The C library, looked up once (find_library runs ldconfig in a subprocess)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only
    except (OSError, AttributeError):
        return None
    return libc


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
        "keepcost")]


@functools.lru_cache(maxsize=None)
def _mallinfo2() -> Optional[Callable[[], _MallInfo2]]:
    libc = _libc()
    fn = getattr(libc, "mallinfo2", None) if libc is not None else None
    if fn is not None:
        fn.restype = _MallInfo2
    return fn


def malloc_figures() -> Optional[dict]:
    """The C heap in MB, from glibc's mallinfo2 (None elsewhere): `in_use_mb` (allocated and not
    freed, mmapped blocks included) and `free_mb` (freed but still held by the arenas). A growing
    first figure is memory somebody holds (numpy arrays, gRPC, Arrow buffers outside its pool); a
    growing second is fragmentation."""
    fn = _mallinfo2()
    if fn is None:
        return None
    info = fn()
    return {"in_use_mb": (info.uordblks + info.hblkhd) / 2**20, "free_mb": info.fordblks / 2**20}


def limit_malloc_arenas(arenas: int = 2) -> Optional[int]:
    """Caps glibc's malloc arenas for this process, unless the user set MALLOC_ARENA_MAX; returns
    the cap set (None: left as it was, or not glibc). Call before the threads start."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return None
    libc = _libc()
    if libc is None:
        return None
    return arenas if libc.mallopt(_M_ARENA_MAX, arenas) == 1 else None


class MallocTrimmer:
    """A daemon thread handing the allocator's free pages back to the system every `seconds`
    (glibc's malloc_trim, which runs without the interpreter lock). `trims` counts them."""

    def __init__(self, seconds: float = 60.0):
        self.seconds = seconds
        self.trims = 0
        self._libc = _libc()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    @property
    def available(self) -> bool:
        return self._libc is not None

    def trim(self) -> bool:
        """One trim now; True when memory went back to the system."""
        if self._libc is None:
            return False
        self.trims += 1
        return bool(self._libc.malloc_trim(0))

    def start(self) -> "MallocTrimmer":
        if self._libc is not None and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tickwire-malloc-trim", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(self.seconds):
            try:
                self.trim()
            except Exception:  # noqa: BLE001 - never takes the server down
                log.debug("malloc_trim failed", exc_info=True)
