"""A reconnecting subscription hands its subscriber the difference as one update.

The server goes away, the table changes while it is down, the server comes back on the same
port: each subscription (full and viewport) gets exactly one update marked `reconnected`, which
applied to what the subscriber held gives what the server now has (and what a DoGet returns).
The basic follow-across-a-restart case is in tests/test_client.py.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec
from tickwire import TickwireServer
from tickwire.clients.client import BarrageClient, Update
from tickwire.protocol.rowset import ranges_to_keys
from tests import waiting
from tests.serving import start_again

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("s", pa.string())])


def _rows(t: pa.Table) -> list[dict]:
    return t.to_pylist()


class KeyedModel:
    """A full subscriber's rows by row key, kept only from the updates it was handed."""

    def __init__(self):
        self.rows: dict[int, dict] = {}

    def apply(self, u: Update) -> None:
        for k in ranges_to_keys(u.removed_rows).tolist():
            del self.rows[k]
        if u.shifts.size:
            moved = {}
            for k, row in self.rows.items():
                for s, e, d in u.shifts.tolist():
                    if s <= k <= e:
                        k += d - s
                        break
                moved[k] = row
            self.rows = moved
        for k, row in zip(ranges_to_keys(u.added_rows).tolist(), _rows(u.added)):
            self.rows[k] = row
        for name, ranges in u.modified_rows.items():
            for k, value in zip(ranges_to_keys(ranges).tolist(), u.modified[name].to_pylist()):
                self.rows[k][name] = value

    def table(self) -> list[dict]:
        return [self.rows[k] for k in sorted(self.rows)]


class WindowModel:
    """A viewport subscriber's window, kept only from the updates it was handed."""

    def __init__(self):
        self.rows: list[dict] = []

    def apply(self, u: Update) -> None:
        gone = set(ranges_to_keys(u.removed_rows).tolist())
        self.rows = [r for i, r in enumerate(self.rows) if i not in gone]
        for i, row in zip(ranges_to_keys(u.added_rows).tolist(), _rows(u.added)):
            self.rows.insert(i, row)
        for name, ranges in u.modified_rows.items():
            for i, value in zip(ranges_to_keys(ranges).tolist(), u.modified[name].to_pylist()):
                self.rows[i] = dict(self.rows[i], **{name: value})


def _wait(predicate, timeout: float = 20.0) -> bool:
    return waiting.wait_until(predicate, timeout)


def test_a_reconnection_delivers_the_difference_as_one_update():
    graph = Engine(interval_ms=20).start()
    table = graph.create(TableSpec("kv", "keyed", SCHEMA, keys=["k"]))
    table.add(pa.table({"k": np.arange(40), "v": np.arange(40) * 10, "s": [f"r{i}" for i in range(40)]},
                       schema=SCHEMA))
    srv = TickwireServer(graph, port=0).start()
    port = srv.port  # the restart listens on it again
    client = BarrageClient(f"grpc://127.0.0.1:{port}")
    full_seen: list[Update] = []
    view_seen: list[Update] = []
    full_model, view_model = KeyedModel(), WindowModel()
    states: list[str] = []

    def on_full(u):
        full_model.apply(u)
        full_seen.append(u)

    def on_view(u):
        view_model.apply(u)
        view_seen.append(u)

    def server_rows():
        return _rows(graph.snapshot(table)[1].sort_by("k"))

    try:
        full = client.subscribe("kv", reconnect=True, on_update=on_full, on_connection=states.append,
                                backoff=(0.05, 0.5))
        view = client.subscribe("kv", viewport=[(0, 9)], reconnect=True, on_update=on_view, backoff=(0.05, 0.5))
        assert full.wait_for(lambda s: s.size == 40, 20)
        assert view.wait_for(lambda s: s.table.num_rows == 10, 20)
        assert full_model.table() == server_rows()
        assert view_model.rows == server_rows()[:10]

        srv.stop()
        assert _wait(lambda: any(s.startswith("disconnected") for s in states), 10), states
        full_before, view_before = len(full_seen), len(view_seen)
        table.delete(pa.table({"k": [3, 4]}))
        table.add(pa.table({"k": [7, 200], "v": [-7, 2000], "s": ["r7", "new"]}, schema=SCHEMA))
        assert _wait(lambda: len(server_rows()) == 39, 10)
        srv = start_again(lambda: TickwireServer(graph, port=port).start())

        assert _wait(lambda: len(full_seen) > full_before and len(view_seen) > view_before, 30), (states, full.error)
        time.sleep(0.5)  # nothing else is coming: the table does not change any more
        assert len(full_seen) == full_before + 1 and len(view_seen) == view_before + 1
        u = full_seen[-1]
        assert u.reconnected and not u.is_snapshot and u.shifts.size == 0
        assert u.removed.column("k").to_pylist() == [3, 4]
        assert u.added.to_pylist() == [{"k": 200, "v": 2000, "s": "new"}]
        assert list(u.modified_rows) == ["v"]  # k and s of row 7 did not change
        assert u.modified["v"].to_pylist() == [-7]
        assert u.table_size == 39
        expected = server_rows()
        assert full_model.table() == expected
        assert _rows(full.table) == expected
        assert _rows(client.snapshot("kv")) == expected  # DoGet

        w = view_seen[-1]
        assert w.reconnected and w.table_size == 39
        assert view_model.rows == expected[:10]
        assert _rows(view.table) == expected[:10]
        assert _rows(client.snapshot("kv", viewport=[(0, 9)])) == expected[:10]
        # counted once the new stream is open, which may be after its reader handed the update over
        assert _wait(lambda: full.reconnects == 1 and view.reconnects == 1, 10), (full.reconnects, view.reconnects)
        assert not full.closed and not view.closed

        n = len(full_seen)
        table.add(pa.table({"k": [1], "v": [99], "s": ["r1"]}, schema=SCHEMA))  # and they keep following
        assert _wait(lambda: len(full_seen) > n and len(view_seen) > view_before + 1, 20)
        assert full_model.table() == server_rows() and view_model.rows == server_rows()[:10]
        assert not full_seen[-1].reconnected and list(full_seen[-1].modified_rows) == ["v"]
    finally:
        client.close()
        srv.stop()
        graph.stop()


def test_a_reconnection_to_an_unchanged_table_delivers_an_empty_update():
    graph = Engine(interval_ms=20).start()
    graph.create(TableSpec("t", "static", data=pa.table({"a": np.arange(5)})))
    srv = TickwireServer(graph, port=0).start()
    port = srv.port  # the restart listens on it again
    client = BarrageClient(f"grpc://127.0.0.1:{port}")
    seen: list[Update] = []
    try:
        sub = client.subscribe("t", reconnect=True, on_update=seen.append, backoff=(0.05, 0.5))
        assert sub.wait_for(lambda s: s.size == 5, 20)
        srv.stop()
        srv = start_again(lambda: TickwireServer(graph, port=port).start())
        assert _wait(lambda: sub.reconnects == 1 and len(seen) == 2, 30), (seen, sub.error)
        u = seen[-1]
        assert u.reconnected and u.added.num_rows == 0 and u.removed.num_rows == 0 and not u.modified_rows
        assert sub.table.column("a").to_pylist() == list(range(5))
    finally:
        client.close()
        srv.stop()
        graph.stop()
