"""The CLI's allocator settings (server/process_memory.py): the arena cap, checked in fresh
interpreters by counting the arenas glibc reports (malloc_info) after many threads allocated at
once, and the trimmer."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux") or os.environ.get("MALLOC_ARENA_MAX"),
                                reason="glibc's allocator; MALLOC_ARENA_MAX set by the caller")

PROBE = r"""
import ctypes, os, sys, tempfile, threading
from tickwire.server.process_memory import limit_malloc_arenas
print(limit_malloc_arenas())
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
go = threading.Barrier(16)
def churn():
    go.wait()
    for _ in range(20000):
        libc.free(libc.malloc(4096))
threads = [threading.Thread(target=churn) for _ in range(16)]
for t in threads: t.start()
for t in threads: t.join()
path = tempfile.mktemp()
fp = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, fp)
libc.fclose(fp)
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""


def run(env_extra: dict) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | env_extra
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_the_cap_holds_however_many_threads_allocate():
    cap, heaps = run({})
    assert cap == "2" and 1 <= int(heaps) <= 2


def test_a_users_malloc_arena_max_is_left_alone():
    cap, heaps = run({"MALLOC_ARENA_MAX": "3"})
    assert cap == "None" and 1 <= int(heaps) <= 3


def test_the_cli_sets_it_before_serving(monkeypatch):
    from tickwire import cli, logs
    from tickwire.server import process_gc, process_memory

    calls: list[str] = []
    monkeypatch.setattr(logs, "configure", lambda *a, **k: None)  # the test process's logging stays as it is
    monkeypatch.setattr(process_memory, "limit_malloc_arenas", lambda: calls.append("cap"))
    monkeypatch.setattr(process_gc, "tune_gc", lambda young: calls.append(f"gc {young}"))

    class Trimmer:
        def start(self):
            calls.append("trim")
            return self

        def stop(self):
            calls.append("stop")

    monkeypatch.setattr(process_memory, "MallocTrimmer", Trimmer)
    monkeypatch.setattr(cli, "_serve", lambda settings: calls.append("serve") or 0)
    monkeypatch.setattr(cli, "_demo", lambda settings: calls.append("demo") or 0)
    assert cli.main(["serve", "--port", "0"]) == 0
    assert cli.main(["demo", "--port", "0", "--gc-young", "5000"]) == 0
    assert calls == ["cap", "gc 20000", "trim", "serve", "stop", "cap", "gc 5000", "trim", "demo", "stop"]


def test_the_trimmer_gives_freed_pages_back_and_stops():
    from tickwire.server.process_memory import MallocTrimmer

    t = MallocTrimmer(seconds=3600)
    assert t.available
    # a freed block in the middle of the heap: only a trim gives its pages back
    probe = r"""
import ctypes
from tickwire.server.process_memory import MallocTrimmer
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: free() itself trims nothing
libc.mallopt(-3, 1 << 30)  # M_MMAP_THRESHOLD: the blocks are on the heap, not mapped
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1])
blocks = [libc.malloc(1 << 20) for _ in range(200)]
for b in blocks:
    ctypes.memset(b, 1, 1 << 20)
keep = libc.malloc(64)  # above them: the heap's top stays in use
for b in blocks:
    libc.free(b)
before = rss()
t = MallocTrimmer(seconds=3600)
gave = t.trim()
print(gave, before - rss(), t.trims)
"""
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    gave, freed_kb, trims = out.stdout.split()
    assert gave == "True" and int(freed_kb) > 150 * 1024 and trims == "1"
    t.start()
    assert t._thread is not None and t._thread.is_alive()
    t.stop()
    assert t._thread is None
