"""The memory figures of /metrics and the optional memory trace (server/observability/memtrace.py)."""
from __future__ import annotations

import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.observability import memtrace


def test_memory_figures_follow_arrow_buffers_and_python_objects():
    before = memtrace.memory_figures()
    held = pc.multiply(pa.array(np.arange(4_000_000, dtype=np.int64)), 2)  # 32 MB allocated by Arrow
    objs = [object() for _ in range(200_000)]
    after = memtrace.memory_figures()
    assert after["arrow_mb"] - before["arrow_mb"] >= 30
    assert after["py_blocks"] - before["py_blocks"] >= 150_000
    assert after["rss_mb"] > 0
    del held, objs


def test_the_trace_names_the_type_and_the_site_that_grew(tmp_path):
    was_tracing = tracemalloc.is_tracing()
    trace = memtrace.MemTrace(str(tmp_path / "mem.jsonl"), seconds=3600)
    if not was_tracing:
        tracemalloc.start(4)
    try:
        first = trace.line()
        assert {"rss_mb", "arrow_mb", "py_blocks", "traced_mb", "types", "sites"} <= set(first)

        class LeakyThing:
            pass

        kept = [LeakyThing() for _ in range(50_000)]
        second = trace.line()
        types = dict(second["types"])
        assert types.get("test_the_trace_names_the_type_and_the_site_that_grew.<locals>.LeakyThing") == 50_000
        top_site, grew, _count = second["sites"][0]
        assert "test_memtrace.py" in top_site and grew > 50_000 * 16
        json.dumps(second)  # what the thread writes
        del kept
    finally:
        if not was_tracing:
            tracemalloc.stop()


def test_the_thread_appends_lines_until_stopped(tmp_path):
    path = tmp_path / "mem.jsonl"
    was_tracing = tracemalloc.is_tracing()
    trace = memtrace.MemTrace(str(path), seconds=3600).start()
    try:
        trace.stop()
        trace._thread.join(60)
        assert not trace._thread.is_alive()
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        assert len(lines) == 1 and "error" not in lines[0] and lines[0]["types"]
    finally:
        if not was_tracing:
            tracemalloc.stop()
