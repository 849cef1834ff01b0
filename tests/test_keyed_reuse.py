"""A keyed table reuses the row keys (and value slots) of deleted rows, so that a table churning
keys holds memory for its live rows: when, in what order, and that nobody downstream sees a reused
key's old values (derived tables, full, viewport and coalescing subscribers, a restart).

Memory itself is measured by bench/bench_keyed_churn.py; here the key space stands for it."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tests.harness import Services
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph import ROW_KEY
from tickwire.server.engine.graph.sources import _REUSE_MIN
from tickwire.server.engine.storage import Durability

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(keys, tag: str = "a") -> pa.Table:
    keys = np.asarray(keys, dtype=np.int64)
    return pa.table({"k": keys, "v": (keys % 97) / 97.0 + (0.5 if tag == "b" else 0.0),
                     "s": [f"{tag}{k}" for k in keys]}, schema=SCHEMA)


def keys_of(table, ks) -> list[int]:
    return table.row_keys_for(pa.table({"k": np.asarray(ks, dtype=np.int64)})).tolist()


def test_new_keys_go_to_the_end_until_many_are_free_then_take_the_lowest_freed_from_the_next_cycle():
    engine = Engine()
    t = engine.create(TableSpec("t", "keyed", SCHEMA, keys=["k"]))
    high = t.where(lambda b: pc.greater(b.column("v"), 0.5), name="high", columns=["v"])
    by_s = t.sort("s", name="by_s")
    engine.write(t, rows(np.arange(3000)), wait=False)
    engine.run_cycle()
    # a few deletes: new keys still go to the end, as Deephaven's keyed input tables put them
    engine.write(t, delete=pa.table({"k": np.arange(10)}), wait=False)
    engine.run_cycle()
    engine.write(t, rows(np.arange(3000, 3010)), wait=False)
    engine.run_cycle()
    assert keys_of(t, range(3000, 3010)) == list(range(3000, 3010)) and t.reused_keys == 0
    # many deletes free enough keys, but not for rows of the cycle that freed them
    with engine.writes(wait=False) as w:
        w.write(t, delete=pa.table({"k": np.arange(10, 10 + _REUSE_MIN + 500)}))
    with engine.writes(wait=False) as w:
        w.write(t, rows(np.arange(5000, 5010)))
    engine.run_cycle()
    assert keys_of(t, range(5000, 5010)) == list(range(3010, 3020)) and t.reused_keys == 0
    # the next cycle's new keys take the lowest freed ones, in input order; the key space stays
    engine.write(t, rows(np.arange(6099, 5999, -1), "b"), wait=False)
    engine.run_cycle()
    assert keys_of(t, range(6099, 5999, -1)) == list(range(100)) and t.reused_keys == 100
    assert t.next_key == 3020
    # a key deleted and a new one in one cycle, an upsert of a reused row: values are the new ones
    engine.write(t, rows([6000], "a"), wait=False)
    engine.write(t, delete=pa.table({"k": [6001]}), wait=False)
    engine.run_cycle()
    got = t.gather_with_keys()
    assert got.num_rows == 3020 - 10 - _REUSE_MIN - 500 + 100 - 1
    assert np.all(np.diff(got[ROW_KEY].to_numpy()) > 0)
    live = np.sort(got["k"].to_numpy())
    want = pa.concat_tables([rows([6000]), rows(np.arange(6002, 6100), "b"),
                             rows(np.arange(10 + _REUSE_MIN + 500, 3010)), rows(np.arange(5000, 5010))])
    assert np.array_equal(live, np.sort(want["k"].to_numpy()))
    assert got.drop_columns([ROW_KEY]).sort_by("k").equals(want.sort_by("k"))
    # derived tables follow the reused keys: equal to recomputation from the table
    now = t.to_arrow()
    assert high.to_arrow().equals(now.filter(pc.greater(now["v"], 0.5)))
    assert by_s.to_arrow().equals(now.take(pc.sort_indices(now, [("s", "ascending")])))


def test_subscribers_never_see_a_reused_keys_old_values():
    with Services() as s:
        t = s.engine.create(TableSpec("t", "keyed", SCHEMA, keys=["k"]))
        s.write(t, rows(np.arange(3000)))
        s.cycle()
        c = s.client()
        full = c.subscribe("t")
        window = c.subscribe("t", viewport=[(0, 9)])
        slow = c.subscribe("t", min_update_interval_ms=5000)  # coalesces cycles until the clock moves
        seen = []
        fast = c.subscribe("t", on_update=seen.append)
        for sub in (full, window, slow, fast):
            assert s.wait_for(sub, lambda x: x.update_count >= 1)
        s.write(t, delete=pa.table({"k": np.arange(2 * _REUSE_MIN)}))
        s.cycle()
        s.write(t, rows(np.arange(10_000, 10_500), "b"))
        s.cycle()
        assert keys_of(t, [10_000, 10_499]) == [0, 499]  # the new rows took freed row keys
        reuse_step = s.engine.step

        def same(sub) -> bool:
            want = t.gather_with_keys()
            if sub.viewport is not None:
                return sub.table.equals(want.drop_columns([ROW_KEY]).slice(0, 10))
            return bool(np.array_equal(sub.state.keys, want[ROW_KEY].to_numpy())) and \
                sub.table.equals(want.drop_columns([ROW_KEY]))

        for sub in (full, window, fast):
            assert s.wait_for(sub, lambda x: x.last_seq == reuse_step)
            assert same(sub), sub
        removal, reuse = seen[-2], seen[-1]
        assert removal.removed.num_rows == 2 * _REUSE_MIN and removal.added.num_rows == 0
        assert removal.removed.column("s")[0].as_py() == "a0"  # the values the removed rows had
        assert reuse.added_rows.tolist() == [[0, 499]]
        assert reuse.added.column("s").to_pylist() == [f"b{k}" for k in range(10_000, 10_500)]
        assert reuse.removed.num_rows == 0 and not reuse.modified_rows
        # the slow subscriber gets both cycles as one update: row keys 0..499 removed and added
        assert slow.last_seq < reuse_step
        s.advance(6)
        s.cycle()
        assert s.wait_for(slow, lambda x: x.last_seq == reuse_step)
        assert same(slow)
        assert set(slow.table.column("s").to_pylist()).isdisjoint({f"a{k}" for k in range(500)})


def test_a_restart_goes_on_reusing_keys_as_the_process_it_replaces_and_compacts_a_sparse_key_space(tmp_path):
    def churn(engine, t, start: int, cycles: int) -> None:
        for c in range(start, start + cycles):
            rng = np.random.default_rng(c)
            live = t.gather_with_keys()["k"].to_numpy()
            gone = rng.choice(live, min(live.size, 400), replace=False)
            new = np.arange(100_000 + c * 400, 100_000 + (c + 1) * 400)
            engine.write(t, delete=pa.table({"k": gone}), batch_id=("d", c), wait=False)
            engine.write(t, rows(new, "b" if c % 2 else "a"), batch_id=("u", c), wait=False)
            engine.run_cycle()

    def open_at(path):
        engine = Engine(interval_ms=3_600_000)
        found = {x.name: x for x in engine.open_storage(path, Durability(checkpoint_cycles=3))}
        t = found.get("t") or engine.get_or_create(TableSpec("t", "keyed", SCHEMA, keys=("k",)))[0]
        return engine, t

    # one process, 12 cycles, against one restarted every 4 cycles
    engine, t = open_at(tmp_path / "one")
    engine.write(t, rows(np.arange(5000)), wait=False)
    engine.run_cycle()
    churn(engine, t, 0, 12)
    want = t.gather_with_keys()
    assert t.reused_keys > 0 and t.next_key < 5000 + 2 * _REUSE_MIN + 800
    engine.close_storage()
    engine, t = open_at(tmp_path / "restarted")
    engine.write(t, rows(np.arange(5000)), wait=False)
    engine.run_cycle()
    for start in (0, 4, 8):
        churn(engine, t, start, 4)
        engine.storage.wait_checkpoints()
        engine.close_storage()
        engine, t = open_at(tmp_path / "restarted")
    assert t.gather_with_keys().equals(want)  # the same rows under the same row keys

    # a table that shrank: its rows come back in their order under keys 0.. n-1
    engine.write(t, delete=pa.table({"k": want["k"].to_numpy()[: want.num_rows - 100]}), wait=False)
    engine.run_cycle()
    kept = t.to_arrow()
    engine.storage.checkpoint(t)
    engine.storage.wait_checkpoints()
    engine.close_storage()
    engine, t = open_at(tmp_path / "restarted")
    assert t.to_arrow().equals(kept) and t.next_key == 100
    assert t.rowset.keys().tolist() == list(range(100))
    engine.write(t, rows([1, 2, 3], "b"), wait=False)  # and it goes on
    engine.run_cycle()
    assert keys_of(t, [1, 2, 3]) == [100, 101, 102]
    engine.close_storage()
