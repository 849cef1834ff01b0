"""The engine's two locks are always taken in one order: the graph's, then the catalog's. A block
of writes holds the graph's lock and may make a table (taking the catalog's); making a table
outside such a block must therefore take the graph's lock first too, or a DoPut making a table and
a Spark sink writing in a block could each hold one lock and wait for the other for ever (as a
soak of the demo once did). Checked by watching every acquisition in one thread at a time, so no
timing decides the outcome."""
from __future__ import annotations

import threading

import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.ingest import Destination

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64())])


class _Watched:
    """A lock that notes, per thread, which watched locks are held, and every time the graph's is
    asked for while the catalog's is held without it (the order that can deadlock)."""

    def __init__(self, inner, name: str, held: threading.local, wrong: list):
        self.inner, self.name, self.held, self.wrong = inner, name, held, wrong

    def _stack(self) -> list:
        if not hasattr(self.held, "stack"):
            self.held.stack = []
        return self.held.stack

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        stack = self._stack()
        if self.name == "graph" and "catalog" in stack and "graph" not in stack:
            import traceback

            self.wrong.append("".join(traceback.format_stack(limit=8)))
        ok = self.inner.acquire(blocking, timeout)
        if ok:
            stack.append(self.name)
        return ok

    def release(self) -> None:
        stack = self._stack()
        stack.reverse()
        stack.remove(self.name)
        stack.reverse()
        self.inner.release()

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def test_making_tables_takes_the_graphs_lock_before_the_catalogs():
    engine = Engine()
    held, wrong = threading.local(), []
    engine.graph.lock = _Watched(engine.graph.lock, "graph", held, wrong)
    engine._create = _Watched(engine._create, "catalog", held, wrong)
    data = pa.table({"k": [1, 2], "v": [0.5, 1.5]}, schema=SCHEMA)
    # a DoPut or Python making a table, outside any block
    engine.get_or_create(TableSpec("made", "append", SCHEMA))
    engine.create(TableSpec("static", "static", data=data))
    # a sink's destination, made outside a block and inside one (where the graph's lock is held)
    engine.destination_table(Destination("dest_out", "append"), SCHEMA)
    with engine.writes(wait=False) as w:
        w.write(TableSpec("in_block", "keyed", SCHEMA, keys=("k",)), data)
        engine.destination_table(Destination("dest_in", "append"), SCHEMA)
    engine.run_cycle()
    assert not wrong, "the graph's lock was asked for while only the catalog's was held:\n" + wrong[0]
    assert {"made", "static", "dest_out", "in_block", "dest_in"} <= set(engine.public_names())
    assert engine.resolve("in_block").size == 2
