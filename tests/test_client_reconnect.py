"""A reconnecting subscription hands its subscriber the difference as one update.

The server goes away, the table changes while it is down, the server comes back on the same
port: each subscription (full and viewport) gets exactly one update marked `reconnected`, which
applied to what the subscriber held gives what the server now has (and what a DoGet returns).

The server is the services in process (tests.harness.Services): `down()` cuts the client's streams
as a lost connection does, `up()` brings a new server (no sessions, no subscriptions) over the same
engine, and the client's reconnect backoff runs on the test's clock. The basic follow-across-a-restart
case on a real socket and port is in tests/test_client.py.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa

from tests.harness import Services, until
from tickwire.clients.client import Update
from tickwire.protocol.rowset import ranges_to_keys
from tickwire.server.engine import TableSpec

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


BACKOFF = (0.05, 0.5)


def test_a_reconnection_delivers_the_difference_as_one_update():
    with Services() as s:
        table = s.engine.create(TableSpec("kv", "keyed", SCHEMA, keys=["k"]))
        s.write(table, pa.table({"k": np.arange(40), "v": np.arange(40) * 10, "s": [f"r{i}" for i in range(40)]},
                                schema=SCHEMA))
        s.cycle()
        client = s.client()
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
            return _rows(s.engine.snapshot(table)[1].sort_by("k"))

        full = client.subscribe("kv", reconnect=True, on_update=on_full, on_connection=states.append, backoff=BACKOFF)
        view = client.subscribe("kv", viewport=[(0, 9)], reconnect=True, on_update=on_view, backoff=BACKOFF)
        assert s.wait_for(full, lambda x: x.size == 40)
        assert s.wait_for(view, lambda x: x.table.num_rows == 10)
        assert full_model.table() == server_rows()
        assert view_model.rows == server_rows()[:10]

        s.down()
        assert until(lambda: any(st.startswith("disconnected") for st in states)), states
        full_before, view_before = len(full_seen), len(view_seen)
        s.write(table, pa.table({"k": [7, 200], "v": [-7, 2000], "s": ["r7", "new"]}, schema=SCHEMA),
                delete=pa.table({"k": [3, 4]}))
        s.cycle()
        assert len(server_rows()) == 39
        # while the server is down, a try after the backoff fails, and the subscription stays open
        tried = len(states)
        assert s.advance_until(lambda: "reconnecting" in states[tried:] and states[-1].startswith("disconnected"),
                               BACKOFF[0]), states
        assert not full.closed and not view.closed
        s.up()

        assert s.advance_until(lambda: len(full_seen) > full_before and len(view_seen) > view_before, BACKOFF[0]), \
            (states, full.error)
        u = full_seen[full_before]
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

        w = view_seen[view_before]
        assert w.reconnected and w.table_size == 39
        assert view_model.rows == expected[:10]
        assert _rows(view.table) == expected[:10]
        assert _rows(client.snapshot("kv", viewport=[(0, 9)])) == expected[:10]
        # counted once the new stream is open, which may be after its reader handed the update over
        assert until(lambda: full.reconnects == 1 and view.reconnects == 1), (full.reconnects, view.reconnects)
        assert not full.closed and not view.closed

        s.write(table, pa.table({"k": [1], "v": [99], "s": ["r1"]}, schema=SCHEMA))  # and they keep following
        step = s.cycle()
        assert s.wait_for(full, lambda x: x.last_seq == step) and s.wait_for(view, lambda x: x.last_seq == step)
        # the reconnection was one update each: the next one they got is this change
        assert len(full_seen) == full_before + 2 and len(view_seen) == view_before + 2
        assert full_model.table() == server_rows() and view_model.rows == server_rows()[:10]
        assert not full_seen[-1].reconnected and list(full_seen[-1].modified_rows) == ["v"]
        assert not view_seen[-1].reconnected


def test_a_reconnection_to_an_unchanged_table_delivers_an_empty_update():
    with Services() as s:
        s.engine.create(TableSpec("t", "static", data=pa.table({"a": np.arange(5)})))
        client = s.client()
        seen: list[Update] = []
        sub = client.subscribe("t", reconnect=True, on_update=seen.append, backoff=BACKOFF)
        assert s.wait_for(sub, lambda x: x.size == 5)
        s.restart()
        assert s.advance_until(lambda: sub.reconnects == 1 and len(seen) == 2, BACKOFF[0]), (seen, sub.error)
        u = seen[-1]
        assert u.reconnected and u.added.num_rows == 0 and u.removed.num_rows == 0 and not u.modified_rows
        assert sub.table.column("a").to_pylist() == list(range(5))
        assert len(seen) == 2
