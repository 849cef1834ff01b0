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


def test_reachable_bytes_counts_each_buffer_once_and_stops_where_told():
    from tickwire.server.engine.footprint import reachable_bytes

    class Holder:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    a = np.zeros(1_000_000, dtype=np.int64)  # 8 MB
    views = [a[:10], a[5:], a]
    arrow = pa.array(np.arange(500_000, dtype=np.int64))  # 4 MB
    other = Holder(big=np.zeros(2_000_000))  # 16 MB behind a stop
    root = Holder(views=views, arrow=arrow, other=other, listener=lambda: other)
    n = reachable_bytes(root, stop=lambda o: o is other)
    assert 12_000_000 <= n < 12_100_000
    assert reachable_bytes(root) >= n + 16_000_000
    assert reachable_bytes(other, stop=lambda o: o is other) >= 16_000_000  # the root itself is walked


def test_the_trace_says_which_table_grew(tmp_path):
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=100)
    schema = pa.schema([("Key", pa.int64()), ("V", pa.float64())])
    small, _ = engine.get_or_create(TableSpec("small", "keyed", schema, keys=("Key",)))
    grows, _ = engine.get_or_create(TableSpec("grows", "append", schema))
    engine.write(small, pa.table({"Key": [1, 2], "V": [1.0, 2.0]}), wait=False)
    engine.run_cycle()

    def holders():
        return {f"table:{k}": v for k, v in engine.memory_by_table().items()}

    trace = memtrace.MemTrace(str(tmp_path / "mem.jsonl"), seconds=3600, holders=holders, python=False)
    first = trace.line()
    assert "traced_mb" not in first and dict(first["holders"])["table:small"] > 0
    engine.write(grows, pa.table({"Key": np.arange(1_000_000), "V": np.ones(1_000_000)}), wait=False)
    engine.run_cycle()
    second = trace.line()
    name, grew = second["holders_grown"][0]
    assert name == "table:grows" and grew >= 16_000_000
    assert dict(second["holders_grown"])["table:small"] == 0
    json.dumps(second)


def test_a_server_names_its_tables_sessions_and_publishers_as_holders():
    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import TableSpec

    server = TickwireServer(port=0, web=False).start()
    try:
        table, _ = server.engine.get_or_create(TableSpec("held", "append", pa.schema([("V", pa.int64())])))
        server.engine.write(table, pa.table({"V": np.arange(100_000)}))
        with BarrageClient(server.target) as client:
            sub = client.subscribe("held")
            assert sub.wait_for(lambda s: s.table.num_rows == 100_000, timeout=60)
            held = server.memory_by_holder()
            sub.close()
        assert held["table:held"] >= 800_000
        assert held["publisher:held"] > 0 and held["sessions"] > 0
    finally:
        server.stop()
