"""Source tables and the update graph: seeded random traffic checked against from-scratch models.

A failing random test prints its seed and cycle; replay with TICKWIRE_SEED=<seed>.
"""
from __future__ import annotations

import time

import numpy as np
import pyarrow as pa
import pytest

from tests.soak import seeds
from tickwire.server.engine import CatalogError, Engine, TableInUseError, TableMismatchError, TableSpec
from tickwire.server.engine.graph import ColumnStore, RowSet, SchemaMismatchError, TableUpdate, WhereTable, apply_update
from tickwire.server.engine.graph.batchids import BatchIds

SCHEMA = pa.schema([("sym", pa.string()), ("k", pa.int32()), ("px", pa.float64()), ("qty", pa.int64()),
                    ("flag", pa.bool_()), ("ts", pa.timestamp("ns", "UTC")), ("tags", pa.list_(pa.string()))])
SEEDS = seeds([1, 2, 3, 4], 2)  # all under `make soak`
CYCLES = 350


def random_rows(rng: np.random.Generator, n: int, keys: int = 25) -> pa.Table:
    k = rng.integers(0, keys, n)
    nulls = rng.random(n) < 0.1
    return pa.table({
        "sym": pa.array([f"S{x % 7}" for x in k.tolist()], pa.string()),
        "k": pa.array(k, pa.int32()),
        "px": pa.array(np.round(rng.random(n) * 100, 2), pa.float64(), mask=nulls),
        "qty": pa.array(rng.integers(0, 5, n), pa.int64()),
        "flag": pa.array(rng.random(n) > 0.5, pa.bool_(), mask=rng.random(n) < 0.1),
        "ts": pa.array(rng.integers(0, 2**50, n), pa.timestamp("ns", "UTC")),
        "tags": pa.array([None if x % 5 == 0 else [f"t{x}"] * (x % 3) for x in k.tolist()], pa.list_(pa.string())),
    }, schema=SCHEMA)


class Checker:
    """Keeps each table's state by applying its updates (remove, shift, add, modify) and checks
    the updates validate and that the result equals the table."""

    def __init__(self, table):
        self.table = table
        self.rowset = RowSet()
        self.rows: dict[int, dict] = {}
        self.updates = 0
        # the state as an Arrow table with row keys, advanced by apply_update
        self.arrow_state = table.gather_with_keys()
        table.add_listener(self.on_update)

    def on_update(self, table, update: TableUpdate, step: int):
        update.validate(self.rowset, table.rowset)
        assert table.prev_rowset == self.rowset
        assert update.apply_to(self.rowset) == table.rowset
        assert table.last_step == step
        for k in update.removed.keys().tolist():
            del self.rows[k]
        if not update.shifted.is_empty():
            keys = np.array(sorted(self.rows), dtype=np.int64)
            moved = update.shifted.apply_to_keys(keys)
            self.rows = {int(n): self.rows[int(o)] for o, n in zip(keys, moved)}
        added = table.gather(None, update.added).to_pylist()
        for k, row in zip(update.added.keys().tolist(), added):
            self.rows[k] = row
        if not update.modified.is_empty():
            before = table.prev_gather(None, update.modified.keys()).to_pylist()
            after = table.gather(None, update.modified).to_pylist()
            for i, (k, row) in enumerate(zip(update.modified.keys().tolist(), after)):
                assert self.rows[k] == before[i]  # previous values are what the rows held
                for col in SCHEMA.names:
                    if col not in update.modified_columns:
                        assert self.rows[k][col] == row[col], (k, col)
                self.rows[k] = row
        self.rowset = table.rowset
        self.updates += 1
        new_values = table.gather_with_keys(None, update.added.union(update.modified))
        self.arrow_state = apply_update(self.arrow_state, update, new_values)
        assert self.arrow_state.equals(table.gather_with_keys()), f"{table.name} at step {step}"

    def state(self) -> list[dict]:
        return [self.rows[k] for k in sorted(self.rows)]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_traffic_matches_models(seed):
    rng = np.random.default_rng(seed)
    engine = Engine()
    app = engine.create(TableSpec("append", "append", SCHEMA))
    keyed = engine.create(TableSpec("keyed", "keyed", SCHEMA, keys=["sym", "k"]))
    blink = engine.create(TableSpec("blink", "blink", SCHEMA))
    ring = engine.create(TableSpec("ring", "ring", SCHEMA, capacity=40))
    cheap = keyed.where(lambda v: pa.compute.less(v["qty"], 2), name="keyed_cheap", columns=["qty"])
    flagged = app.where(lambda v: v["flag"], name="append_flagged")
    checkers = {t.name: Checker(t) for t in (app, keyed, blink, ring, cheap, flagged)}
    all_appended: list[pa.Table] = []
    key_model: dict = {}  # (sym, k) -> row, insertion order = row key order of live keys
    blink_last: list[pa.Table] = []
    ring_inputs: list[dict] = []
    batch_id = 0
    for cycle in range(CYCLES):
        try:
            for _ in range(rng.integers(0, 3)):
                t = random_rows(rng, int(rng.integers(0, 12)))
                batch_id += 1
                assert engine.write(app, t, batch_id=batch_id)
                all_appended.append(t)
                if rng.random() < 0.1:  # a replayed batch changes nothing
                    assert not engine.write(app, t, batch_id=batch_id)
            blink_now = []
            for _ in range(rng.integers(0, 2)):
                t = random_rows(rng, int(rng.integers(1, 8)))
                engine.write(blink, t)
                engine.write(ring, t)
                blink_now.append(t)
                ring_inputs.extend(t.to_pylist())
            for _ in range(rng.integers(0, 3)):
                if rng.random() < 0.7:
                    t = random_rows(rng, int(rng.integers(1, 10)))
                    engine.write(keyed, t)
                    for row in t.to_pylist():
                        key = (row["sym"], row["k"])
                        key_model[key] = row  # dict keeps first-insertion order for existing keys
                else:
                    t = random_rows(rng, int(rng.integers(1, 6))).select(["sym", "k"])
                    engine.write(keyed, delete=t)
                    for row in t.to_pylist():
                        key_model.pop((row["sym"], row["k"]), None)
            engine.run_cycle()
            assert not engine.errors, engine.errors[0]  # a Checker assertion inside a listener is recorded here
            blink_last = blink_now
            expected_append = pa.concat_tables(all_appended).to_pylist() if all_appended else []
            assert app.to_arrow().to_pylist() == expected_append
            assert checkers["append"].state() == expected_append
            assert keyed.to_arrow().to_pylist() == list(key_model.values())
            assert checkers["keyed"].state() == list(key_model.values())
            exp_blink = pa.concat_tables(blink_last).to_pylist() if blink_last else []
            assert blink.to_arrow().to_pylist() == exp_blink
            assert checkers["blink"].state() == exp_blink
            exp_cheap = [r for r in key_model.values() if r["qty"] < 2]
            assert cheap.to_arrow().to_pylist() == exp_cheap
            assert checkers["keyed_cheap"].state() == exp_cheap
            exp_flagged = [r for r in expected_append if r["flag"]]
            assert checkers["append_flagged"].state() == exp_flagged
            exp_ring = ring_inputs[-40:]
            assert ring.to_arrow().to_pylist() == exp_ring
            assert checkers["ring"].state() == exp_ring
        except AssertionError:
            print(f"replay with TICKWIRE_SEED={seed} (failed at cycle {cycle})")
            raise
    assert not engine.errors
    assert all(c.updates > 50 for c in checkers.values()), {n: c.updates for n, c in checkers.items()}


def test_ring_keeps_the_last_rows():
    engine = Engine()
    ring = engine.create(TableSpec("ring", "ring", SCHEMA, capacity=10))
    c = Checker(ring)
    rng = np.random.default_rng(9)
    everything = []
    for size in [3, 4, 5, 12, 0, 7, 25, 1]:
        t = random_rows(rng, size)
        engine.write(ring, t)
        everything.append(t)
        engine.run_cycle()
        assert not engine.errors, engine.errors[0]
        expected = pa.concat_tables(everything).to_pylist()[-10:]
        assert ring.to_arrow().to_pylist() == expected
        assert c.state() == expected
    assert ring.rowset.keys().tolist() == list(range(57 - 10, 57))


def test_keyed_modified_columns_are_only_the_changed_ones():
    engine = Engine()
    keyed = engine.create(TableSpec("keyed", "keyed", SCHEMA, keys=["sym", "k"]))
    rng = np.random.default_rng(3)
    t = random_rows(rng, 5, keys=1000).slice(0, 5)
    engine.write(keyed, t)
    engine.run_cycle()
    changed = t.set_column(2, "px", pa.array([1.0, 2.0, 3.0, 4.0, 5.0]))
    engine.write(keyed, changed)
    updates = engine.run_cycle()
    up = updates["keyed"]
    assert up.added.is_empty() and up.removed.is_empty()
    assert len(up.modified) == keyed.size  # every row got a new price
    assert up.modified_columns == {"px"}
    engine.write(keyed, changed)  # the same values again: no update at all
    assert "keyed" not in engine.run_cycle()


def test_keyed_row_keys_are_stable_and_deletes_remove():
    engine = Engine()
    s = pa.schema([("id", pa.string()), ("v", pa.int64())])
    t = engine.create(TableSpec("t", "keyed", s, keys=["id"]))
    engine.write(t, pa.table({"id": ["a", "b", "c"], "v": [1, 2, 3]}, schema=s))
    engine.run_cycle()
    engine.write(t, pa.table({"id": ["b", "d"], "v": [20, 4]}, schema=s))
    engine.write(t, delete=pa.table({"id": ["a"]}))
    up = engine.run_cycle()["t"]
    assert up.removed.keys().tolist() == [0]
    assert up.added.keys().tolist() == [3]
    assert up.modified.keys().tolist() == [1] and up.modified_columns == {"v"}
    assert t.to_arrow().to_pylist() == [{"id": "b", "v": 20}, {"id": "c", "v": 3}, {"id": "d", "v": 4}]
    # add then delete inside one cycle: no trace
    engine.write(t, pa.table({"id": ["z"], "v": [9]}, schema=s))
    engine.write(t, delete=pa.table({"id": ["z"]}))
    assert "t" not in engine.run_cycle()


def test_schema_mismatch_names_table_column_and_types_and_changes_nothing():
    engine = Engine()
    t = engine.create(TableSpec("trades", "append", SCHEMA))
    bad = random_rows(np.random.default_rng(1), 3).set_column(2, "px", pa.array(["1", "2", "3"]))
    with pytest.raises(SchemaMismatchError, match=r"table 'trades': column 'px' has type string, expected double"):
        engine.write(t, bad)
    with pytest.raises(SchemaMismatchError, match="missing column 'tags'"):
        engine.write(t, random_rows(np.random.default_rng(1), 3).drop_columns(["tags"]))
    with pytest.raises(SchemaMismatchError, match="column 'extra'"):
        engine.write(t, random_rows(np.random.default_rng(1), 3).append_column("extra", pa.array([1, 2, 3])))
    engine.run_cycle()
    assert t.size == 0
    # columns in another order are accepted
    engine.write(t, random_rows(np.random.default_rng(1), 3).select(list(reversed(SCHEMA.names))))
    engine.run_cycle()
    assert t.size == 3


def test_listener_error_is_reported_and_others_continue():
    engine = Engine()
    a = engine.create(TableSpec("a", "append", SCHEMA))
    b = engine.create(TableSpec("b", "append", SCHEMA))
    seen = []

    def boom(table, update, step):
        raise RuntimeError("listener exploded")

    a.add_listener(boom)
    b.add_listener(lambda table, update, step: seen.append(step))
    rows = random_rows(np.random.default_rng(2), 4)
    engine.write(a, rows)
    engine.write(b, rows)
    engine.run_cycle()
    assert seen == [1]
    assert len(engine.errors) == 1 and engine.errors[0].table == "a" and "exploded" in repr(engine.errors[0].error)
    assert a.size == 4 and a.last_step == 1


def test_keyed_cycle_with_several_operations_reports_net_change_and_previous_values():
    engine = Engine()
    s = pa.schema([("id", pa.string()), ("n", pa.int32()), ("v", pa.float64()), ("note", pa.string())])
    t = engine.create(TableSpec("t", "keyed", s, keys=["id", "n"]))
    engine.write(t, pa.table({"id": ["a", "b", "c", None], "n": [1, 1, 1, 1], "v": [1.0, 2.0, float("nan"), 4.0],
                              "note": ["x", "y", "z", None]}, schema=s))
    assert engine.run_cycle()["t"].added == RowSet.range(0, 3)
    seen = []
    t.add_listener(lambda table, up, step: seen.append((up, table.prev_gather().to_pylist(), table.gather(
        None, up.modified).to_pylist())))
    # in one cycle: change a twice (ending with its old v), change b's note, rewrite c with NaN again,
    # add d then delete it, delete the null-keyed row, and upsert duplicates of e (last wins)
    with engine.writes() as w:
        assert w.write(t, pa.table({"id": ["a", "b"], "n": [1, 1], "v": [9.0, 2.0], "note": ["x", "y2"]}, schema=s),
                       batch_id="b1")
        assert w.write(t, pa.table({"id": ["a", "c", "d"], "n": [1, 1, 1], "v": [1.0, float("nan"), 5.0],
                                    "note": ["x2", "z", "w"]}, schema=s))
        assert w.write(t, delete=pa.table({"id": ["d", None, "zz"], "n": pa.array([1, 1, 1], pa.int32())}))
        assert w.write(t, pa.table({"id": ["e", "e", "e"], "n": [1, 1, 1], "v": [1.0, 2.0, 3.0],
                                    "note": ["p", "q", "r"]}, schema=s))
    # replayed: ignored
    assert not engine.write(t, delete=pa.table({"id": ["a"], "n": pa.array([1], pa.int32())}), batch_id="b1")
    up = engine.run_cycle()["t"]
    assert up.removed.keys().tolist() == [3]
    assert up.added.keys().tolist() == [5]  # d (key 4) came and went; e got key 5
    assert up.modified.keys().tolist() == [0, 1]  # c was rewritten with equal values: not modified
    assert up.modified_columns == {"note"}  # a's v went 1 -> 9 -> 1: unchanged over the cycle
    (seen_up, before, after), = seen
    assert before == [{"id": "a", "n": 1, "v": 1.0, "note": "x"}, {"id": "b", "n": 1, "v": 2.0, "note": "y"}]
    assert after == [{"id": "a", "n": 1, "v": 1.0, "note": "x2"}, {"id": "b", "n": 1, "v": 2.0, "note": "y2"}]
    assert t.to_arrow().column("id").to_pylist() == ["a", "b", "c", "e"]
    assert t.to_arrow().column("note").to_pylist() == ["x2", "y2", "z", "r"]
    probe = pa.table({"id": ["e", "d", "a", None], "n": pa.array([1, 1, 1, 1], pa.int32())})
    assert t.row_keys_for(probe).tolist() == [5, -1, 0, -1]
    with pytest.raises(RuntimeError):
        t.prev_gather()  # only during the cycle


def test_a_restating_write_reports_every_row_of_a_key_already_there_as_modified():
    """Deephaven's input tables report an add of a key they have as a modification of every
    column, values changed or not (engine.write(..., restate=True), as AddTableToInputTable
    writes); a plain upsert reports only the values that changed."""
    engine = Engine()
    s = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("w", pa.string())])
    t = engine.create(TableSpec("t", "keyed", s, keys=["k"]))
    engine.write(t, pa.table({"k": [1, 2, 3], "v": [1.0, 2.0, 3.0], "w": ["a", "b", "c"]}, schema=s), wait=False)
    engine.run_cycle()
    prev: list = []
    t.add_listener(lambda table, up, step: prev.append(table.prev_gather(None, up.modified).to_pylist()))
    same = pa.table({"k": [2, 3], "v": [2.0, 3.0], "w": ["b", "c"]}, schema=s)
    engine.write(t, same, wait=False)
    assert engine.run_cycle().get("t") is None  # unchanged: no update at all
    # restated: 2 unchanged and 3 with a new w, a new key 4; then a plain write changes 2's v in
    # the same cycle and back again (2 stays modified: it was restated)
    engine.write(t, pa.table({"k": [2, 3, 4], "v": [2.0, 3.0, 4.0], "w": ["b", "c2", "d"]}, schema=s),
                 wait=False, restate=True)
    engine.write(t, pa.table({"k": [2], "v": [9.0], "w": ["b"]}, schema=s), wait=False)
    engine.write(t, pa.table({"k": [2], "v": [2.0], "w": ["b"]}, schema=s), wait=False)
    up = engine.run_cycle()["t"]
    assert up.added.keys().tolist() == [3]
    assert up.modified.keys().tolist() == [1, 2] and up.modified_columns == {"v", "w"}
    assert prev[-1] == [{"k": 2, "v": 2.0, "w": "b"}, {"k": 3, "v": 3.0, "w": "c"}]
    # restating a deleted key adds it; restating nothing already there modifies nothing
    with engine.writes(wait=False) as w:
        w.write(t, delete=pa.table({"k": [4]}))
    engine.run_cycle()
    engine.write(t, pa.table({"k": [4], "v": [4.0], "w": ["d"]}, schema=s), wait=False, restate=True)
    up = engine.run_cycle()["t"]
    assert up.modified.is_empty() and up.added.size == 1 and up.removed.is_empty()


def test_batch_ids_make_every_source_exactly_once():
    engine = Engine()
    s = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    tables = [engine.create(TableSpec("a", "append", s)), engine.create(TableSpec("k", "keyed", s, keys=["k"])),
              engine.create(TableSpec("b", "blink", s)), engine.create(TableSpec("r", "ring", s, capacity=5))]
    rows = pa.table({"k": [1, 2], "v": [10, 20]}, schema=s)
    for t in tables:
        assert engine.write(t, rows, batch_id=7)
        assert not engine.write(t, rows, batch_id=7)
        assert t.has_batch(7) and not t.has_batch(8)
    keyed = tables[1]
    assert engine.write(keyed, delete=pa.table({"k": [1]}), batch_id=8)
    assert not engine.write(keyed, delete=pa.table({"k": [2]}), batch_id=8)
    engine.run_cycle()
    assert [t.size for t in tables] == [2, 1, 2, 2]


def test_schema_errors_for_keyed_tables_name_the_key_column():
    engine = Engine()
    s = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    t = engine.create(TableSpec("prices", "keyed", s, keys=["k"]))
    with pytest.raises(SchemaMismatchError, match=r"table 'prices': column 'k' has type string, expected int64"):
        engine.write(t, delete=pa.table({"k": ["1"]}))
    with pytest.raises(SchemaMismatchError, match="missing column 'k'"):
        engine.write(t, delete=pa.table({"v": [1]}))
    with pytest.raises(CatalogError, match="not in the schema"):
        engine.create(TableSpec("bad", "keyed", s, keys=["nope"]))
    with pytest.raises(ValueError, match="cannot be a key"):
        engine.create(TableSpec("bad2", "keyed", pa.schema([("l", pa.list_(pa.int64()))]), keys=["l"]))
    with pytest.raises(CatalogError, match="already exists") as err:
        engine.create(TableSpec("prices", "keyed", s, keys=["k"]))
    assert err.value.code == "ALREADY_EXISTS"
    with pytest.raises(TableMismatchError, match="'prices' is a keyed table, not append"):
        engine.create(TableSpec("prices", "append", s))
    assert engine.tables() == [t]
    assert t.pending_rows() == 0 and "prices" not in engine.run_cycle()


def test_derived_tables_update_after_their_parents_in_one_cycle():
    engine = Engine()
    s = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    src = engine.create(TableSpec("src", "keyed", s, keys=["k"]))
    big = src.where(lambda v: pa.compute.greater(v["v"], 10), name="big")
    bigger = big.where(lambda v: pa.compute.greater(v["v"], 100), name="bigger")
    order = []
    for t in (bigger, big, src):  # registered in reverse: the graph still runs parents first
        t.add_listener(lambda table, up, step: order.append((table.name, step, src.size, big.size, bigger.size)))
    engine.write(src, pa.table({"k": [1, 2, 3], "v": [5, 50, 500]}, schema=s))
    engine.run_cycle()
    assert [o[0] for o in order] == ["src", "big", "bigger"]
    assert order[-1][1:] == (1, 3, 2, 1)  # the last listener sees every table after the cycle
    # a modification moves a row out of one filter and into the other
    order.clear()
    engine.write(src, pa.table({"k": [1, 3], "v": [1000, 7]}, schema=s))
    ups = engine.run_cycle()
    assert ups["big"].added.keys().tolist() == [0] and ups["big"].removed.keys().tolist() == [2]
    assert ups["bigger"].added.keys().tolist() == [0] and ups["bigger"].removed.keys().tolist() == [2]
    assert big.to_arrow().to_pylist() == [{"k": 1, "v": 1000}, {"k": 2, "v": 50}]
    assert bigger.last_step == 2 and isinstance(bigger, WhereTable) and bigger.depth == 2
    with pytest.raises(TableInUseError, match="derived from it: 'bigger'"):
        engine.drop("big")


def test_a_failing_source_or_derived_table_is_reported_and_the_rest_updates():
    engine = Engine()
    s = pa.schema([("k", pa.int64())])
    a = engine.create(TableSpec("a", "append", s))
    b = engine.create(TableSpec("b", "append", s))

    def bad_predicate(values):
        raise ZeroDivisionError("predicate broke")

    engine.write(a, pa.table({"k": [1]}, schema=s))
    broken = a.where(lambda v: pa.compute.greater(v["k"], 0), name="broken")
    broken.predicate = bad_predicate
    engine.write(a, pa.table({"k": [2]}, schema=s))
    engine.write(b, pa.table({"k": [3]}, schema=s))
    ups = engine.run_cycle()
    assert set(ups) == {"a", "b"} and a.size == 2 and b.size == 1
    assert [e.table for e in engine.errors] == ["broken"] and isinstance(engine.errors[0].error, ZeroDivisionError)


def test_column_types_survive_storage_and_overwrites():
    import datetime
    import decimal
    s = pa.schema([
        ("i8", pa.int8()), ("u64", pa.uint64()), ("f32", pa.float32()), ("b", pa.bool_()),
        ("d32", pa.date32()), ("t64", pa.time64("us")), ("ts", pa.timestamp("ms", "America/New_York")),
        ("dur", pa.duration("ns")), ("dec", pa.decimal128(12, 3)), ("s", pa.string()), ("ls", pa.large_string()),
        ("bin", pa.binary()), ("lst", pa.list_(pa.int32())), ("st", pa.struct([("x", pa.int16()), ("y", pa.string())])),
        ("k", pa.int64()),
    ])
    rng = np.random.default_rng(11)

    def make(n, base):
        nul = rng.random(n) < 0.2
        return pa.table({
            "i8": pa.array(rng.integers(-128, 127, n), pa.int8(), mask=nul),
            "u64": pa.array(rng.integers(0, 2**63, n, dtype=np.uint64) * 2, pa.uint64(), mask=nul),
            "f32": pa.array(rng.random(n).astype(np.float32), mask=nul),
            "b": pa.array(rng.random(n) < 0.5, mask=nul),
            "d32": pa.array([datetime.date(2020, 1, 1 + i % 28) for i in range(n)], pa.date32(), mask=nul),
            "t64": pa.array(rng.integers(0, 86_400_000_000, n), pa.time64("us"), mask=nul),
            "ts": pa.array(rng.integers(0, 2**40, n), pa.timestamp("ms", "America/New_York"), mask=nul),
            "dur": pa.array(rng.integers(-10**12, 10**12, n), pa.duration("ns"), mask=nul),
            "dec": pa.array([decimal.Decimal(int(x)) / 1000 for x in rng.integers(-10**9, 10**9, n)],
                            pa.decimal128(12, 3), mask=nul),
            "s": pa.array([f"é{x}" * int(x % 4) for x in rng.integers(0, 100, n)], pa.string(), mask=nul),
            "ls": pa.array([f"L{x}" for x in rng.integers(0, 100, n)], pa.large_string(), mask=nul),
            "bin": pa.array([bytes([x % 256]) * (x % 5) for x in rng.integers(0, 1000, n)], pa.binary(), mask=nul),
            "lst": pa.array([None if x % 7 == 0 else [int(x), None] for x in rng.integers(0, 100, n)],
                            pa.list_(pa.int32())),
            "st": pa.array([None if x % 5 == 0 else {"x": int(x), "y": str(x)} for x in rng.integers(0, 99, n)],
                           s.field("st").type),
            "k": pa.array(np.arange(base, base + n)),
        }, schema=s)

    # a struct column has no wire mapping, so no table is made with one (the catalog refuses it);
    # it is stored by the column store, which gets every column, the struct included
    served = pa.schema([f for f in s if f.name != "st"])
    engine = Engine()
    t = engine.create(TableSpec("typed", "keyed", served, keys=["k"]))
    store = ColumnStore(s)
    model = {}
    for cycle in range(30):
        batch = make(int(rng.integers(1, 200)), int(rng.integers(0, 400)))
        written = batch.slice(1) if cycle % 3 == 0 else batch  # sliced input: buffers with an offset
        engine.write(t, written.drop_columns(["st"]))
        store.write(written["k"].to_numpy(), written)  # key k in slot k: a key written again is overwritten
        for row in written.to_pylist():
            model[row["k"]] = row
        engine.run_cycle()
        got = t.to_arrow()
        assert got.schema == served
        # keys never deleted: first-seen order
        assert got.to_pylist() == [{n: r[n] for n in served.names} for r in model.values()], f"cycle {cycle}"
        stored = store.gather(np.array(list(model), dtype=np.int64))
        assert stored.schema == s and stored.to_pylist() == list(model.values()), f"cycle {cycle}"
        keys = t.rowset.keys()
        pick = rng.permutation(keys)[:50]  # gathers in any order
        all_rows = got.to_pylist()
        assert t.gather(None, pick).to_pylist() == [all_rows[i] for i in t.rowset.find(pick).tolist()]


def test_table_properties_static_tables_and_snapshots():
    engine = Engine()
    assert engine.interval_ms == 100.0
    s = pa.schema([("k", pa.int64()), ("v", pa.string())])
    data = pa.table({"k": [1, 2, 3], "v": ["a", None, "c"]}, schema=s)
    st = engine.create(TableSpec("st", "static", data=data))
    app, keyed, blink, ring = (engine.create(TableSpec("a", "append", s)),
                               engine.create(TableSpec("kt", "keyed", s, keys=["k"])),
                               engine.create(TableSpec("b", "blink", s)),
                               engine.create(TableSpec("r", "ring", s, capacity=2)))
    assert engine.tables(hidden=True) == [st, app, keyed, blink, ring]
    assert engine.public_names() == ["st", "a", "kt", "b", "r"]
    assert not st.is_refreshing and all(t.is_refreshing for t in (app, keyed, blink, ring))
    assert st.to_arrow().equals(data) and st.rowset == RowSet.range(0, 2) and st.size == 3
    assert app.attributes == {"AddOnly": True, "AppendOnly": True}
    assert blink.attributes == {"BlinkTable": True}
    assert issubclass(SchemaMismatchError, ValueError)
    for t in (app, keyed, blink, ring):
        engine.write(t, data)
    assert engine.snapshot(app) == (0, s.empty_table())  # queued input is invisible until a cycle runs
    engine.run_cycle()
    engine.write(blink, data.slice(0, 1))
    engine.run_cycle()
    step, snap = engine.snapshot(engine.resolve("a"), columns=["v"])
    assert step == 2 and snap.column_names == ["v"] and snap["v"].to_pylist() == ["a", None, "c"]
    assert app.last_step == 1 and blink.last_step == 2 and st.last_step == 0
    assert blink.rowset == RowSet.range(0, 0) and blink.to_arrow().equals(data.slice(0, 1))
    assert ring.rowset == RowSet.range(1, 2) and ring.to_arrow().equals(data.slice(1))
    assert app.gather_column("v", RowSet.from_keys([2, 0])).to_pylist() == ["a", "c"]
    assert app.gather(["k"], np.array([2, 0])).column("k").to_pylist() == [3, 1]  # keys in the given order
    assert keyed.gather_with_keys(["v"]).to_pydict() == {"__row_key": [0, 1, 2], "v": ["a", None, "c"]}


def test_the_graph_thread_applies_input_on_its_interval_and_stops():
    engine = Engine(interval_ms=10)
    s = pa.schema([("k", pa.int64())])
    t = engine.create(TableSpec("a", "append", s))
    steps = []
    t.add_listener(lambda table, up, step: steps.append((step, len(up.added))))
    with engine:
        assert engine.running
        engine.write(t, pa.table({"k": [1, 2]}, schema=s), wait=False)  # queued: the thread's next cycle applies it
        deadline = time.monotonic() + 5
        while t.size < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert t.size == 2
        while engine.step < 5 and time.monotonic() < deadline:  # cycles keep running without input
            time.sleep(0.005)
        assert engine.step >= 5
    assert not engine.running
    stopped_at = engine.step
    engine.write(t, pa.table({"k": [3]}, schema=s), wait=False)
    time.sleep(0.05)
    assert engine.step == stopped_at and t.size == 2  # no cycles after stop()
    assert len(steps) == 1 and steps[0][1] == 2  # one update, one listener call for the change


def test_numbered_batch_ids_are_remembered_in_bounded_memory():
    ids = BatchIds(keep=100)
    for n in range(10_000):
        assert ("spark", "q1", n) not in ids
        ids.add(("spark", "q1", n))
        ids.add(("spark", "q2", n))
    assert len(ids) <= 2 * 2 * 100  # not 20,000
    # the recent ones exactly, the old ones as accepted (a query never replays them), scopes apart
    assert ("spark", "q1", 9_999) in ids and ("spark", "q1", 3) in ids and ("spark", "q1", 10_000) not in ids
    assert ("spark", "q3", 3) not in ids
    # numbers need not come in order while they are recent
    ids.add(("spark", "q1", 10_005))
    assert ("spark", "q1", 10_003) not in ids and ("spark", "q1", 10_005) in ids
    # other ids (and a bool last, which is not a batch number) are kept as they are
    ids.add("batch-a")
    ids.add(("flag", True))
    assert "batch-a" in ids and ("flag", True) in ids and ("flag", False) not in ids and "batch-b" not in ids
    engine = Engine()
    t = engine.create(TableSpec("a", "append", pa.schema([("v", pa.int64())])))
    memory = t.batch_memory()
    memory.keep = 8
    one = pa.table({"v": [1]})
    for n in range(100):
        assert engine.write(t, one, batch_id=("spark", "q", n))
    assert not engine.write(t, one, batch_id=("spark", "q", 99))
    assert not engine.write(t, one, batch_id=("spark", "q", 5))
    assert t.batch_memory() is memory and len(memory) <= 16
    engine.run_cycle()
    assert t.size == 100


def test_many_small_inputs_in_one_cycle_give_the_update_of_one_input():
    s = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    rng = np.random.default_rng(3)
    base = pa.table({"k": np.arange(50), "v": np.zeros(50, dtype=np.int64)}, schema=s)
    inputs = [pa.table({"k": rng.integers(0, 80, 4), "v": rng.integers(0, 9, 4)}, schema=s) for _ in range(300)]
    deletes = [pa.table({"k": pa.array([1, 2, 3], pa.int64())}), pa.table({"k": pa.array([4], pa.int64())})]
    results = []
    # 300 small upserts around two deletes, against the same rows as one upsert on each side of one delete
    for before, gone, after in ((inputs[:150], deletes, inputs[150:]),
                                ([pa.concat_tables(inputs[:150])], [pa.concat_tables(deletes)],
                                 [pa.concat_tables(inputs[150:])])):
        engine = Engine()
        t = engine.create(TableSpec("t", "keyed", s, keys=["k"]))
        engine.write(t, base)
        engine.run_cycle()
        seen = []
        t.add_listener(lambda tab, up, step, seen=seen: seen.append(
            (up.added.keys().tolist(), up.removed.keys().tolist(), up.modified.keys().tolist(),
             sorted(up.modified_columns), tab.prev_gather().to_pylist())))
        for p in before:
            engine.write(t, p)
        for d in gone:
            engine.write(t, delete=d)
        for p in after:
            engine.write(t, p)
        engine.run_cycle()
        results.append((seen, t.gather_with_keys().to_pylist()))
    assert results[0] == results[1]
    model = dict.fromkeys(range(50), 0)
    for p in inputs[:150]:
        model.update(zip(p["k"].to_pylist(), p["v"].to_pylist()))
    for k in (1, 2, 3, 4):
        model.pop(k, None)
    for p in inputs[150:]:
        model.update(zip(p["k"].to_pylist(), p["v"].to_pylist()))
    assert {r["k"]: r["v"] for r in results[0][1]} == model
    (added, removed, modified, _, prev), = results[0][0]
    assert removed == [1, 2, 3, 4] and added and modified and len(prev) == len(modified)
