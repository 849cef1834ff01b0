"""The building blocks of derived tables: the key map, sort-key words and the gapped order index,
against plain Python models."""
from __future__ import annotations

import math
import os

import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.engine import OperationError
from tickwire.server.engine.graph import KeyIndex, KeyMap, OrderIndex, SortKeys
from tickwire.server.engine.graph import keymap as keymap_module
from tickwire.server.engine.graph.order import NONE_HI, NONE_LO

SEEDS = [int(os.environ["TICKWIRE_SEED"])] if "TICKWIRE_SEED" in os.environ else [1, 2, 3]


# ----------------------------------------------------------------------------------------------
# KeyMap
# ----------------------------------------------------------------------------------------------

class CountingIndex(KeyIndex):
    """The hash table of a KeyMap in hash mode, counting the lookups that reach it."""

    lookups = 0

    def lookup(self, h, verify=None):
        CountingIndex.lookups += 1
        return super().lookup(h, verify)


@pytest.mark.parametrize("seed", SEEDS)
def test_key_map_matches_a_dict_in_dense_and_sparse_modes(seed, monkeypatch):
    monkeypatch.setattr(keymap_module, "KeyIndex", CountingIndex)
    rng = np.random.default_rng(seed)
    km, model = KeyMap(), {}
    modes = set()
    for step in range(300):
        spread = [10**3, 10**5, 10**12][step // 100]  # dense, then wider, then very sparse keys
        base = int(rng.integers(0, spread))
        keys = np.unique(base + rng.integers(0, spread, int(rng.integers(1, 60))))
        op = rng.random()
        if op < 0.6:
            vals = rng.integers(0, 10**9, keys.size)
            km.set(keys, vals)
            model.update(zip(keys.tolist(), vals.tolist()))
        elif op < 0.85:
            km.delete(keys)
            for k in keys.tolist():
                model.pop(k, None)
        elif model:
            old = np.array(sorted(model)[: int(rng.integers(1, 20))], dtype=np.int64)
            new = old + int(rng.integers(1, 5))
            km.remap(old, new)
            vals = [model.pop(k) for k in old.tolist()]
            model.update(zip(new.tolist(), vals))
        probe = np.concatenate((keys, np.array(list(model)[:50], dtype=np.int64)))
        before = CountingIndex.lookups
        assert km.get(probe).tolist() == [model.get(k, -1) for k in probe.tolist()], step
        modes.add(CountingIndex.lookups == before)  # True: read from the one array (direct mode)
        assert len(km) == len(model)
    ks, vs = km.items()
    assert ks.tolist() == sorted(model) and vs.tolist() == [model[k] for k in sorted(model)]
    assert modes == {True, False}  # both representations were exercised


# ----------------------------------------------------------------------------------------------
# sort-key words
# ----------------------------------------------------------------------------------------------

def _words_order(keys: SortKeys, table: pa.Table) -> list[int]:
    keys.needs_more_words(table)
    w = keys.encode(table, np.arange(table.num_rows, dtype=np.int64))
    return np.lexsort(w[::-1]).tolist()


def _py_key(v, desc):
    if v is None:
        k = (0,)
    elif isinstance(v, float) and math.isnan(v):
        k = (2,)
    elif isinstance(v, float):
        k = (1, v + 0.0)
    elif isinstance(v, (str, bytes)):
        k = (1, v.encode() if isinstance(v, str) else v)
    else:
        k = (1, v)
    return k


def _py_order(table: pa.Table, cols, desc) -> list[int]:
    rows = list(range(table.num_rows))
    data = {c: table.column(c).to_pylist() for c in cols}
    for c, d in reversed(list(zip(cols, desc))):
        rows = sorted(rows, key=lambda i: _py_key(data[c][i], d), reverse=d)
    return rows


@pytest.mark.parametrize("desc", [False, True])
def test_sort_words_order_every_type_like_python(desc):
    rng = np.random.default_rng(7)
    n = 400
    strings = ["", "a", "a\x00", "ab", "abcdefgh", "abcdefgh\x00", "abcdefghi", "abcdefgz", "b", "zz" * 20,
               "é", "Z", "a" * 70, "a" * 70 + "b"]
    table = pa.table({
        "i64": pa.array(rng.integers(-5, 5, n), pa.int64(), mask=rng.random(n) < 0.1),
        "i8": pa.array(rng.integers(-128, 127, n), pa.int8(), mask=rng.random(n) < 0.1),
        "u64": pa.array(rng.choice(np.array([0, 1, 2**64 - 1, 2**63], dtype=np.uint64), n), pa.uint64(),
                        mask=rng.random(n) < 0.1),
        "u16": pa.array(rng.integers(0, 3, n), pa.uint16(), mask=rng.random(n) < 0.1),
        "f64": pa.array(rng.choice([-np.inf, -1.5, -0.0, 0.0, 2.5, np.inf, np.nan, 1e300, -1e-300], n),
                        pa.float64(), mask=rng.random(n) < 0.1),
        "f32": pa.array(rng.choice([-1.0, 0.0, 1.0, np.nan], n).astype(np.float32), pa.float32(),
                        mask=rng.random(n) < 0.1),
        "b": pa.array(rng.random(n) < 0.5, pa.bool_(), mask=rng.random(n) < 0.1),
        "ts": pa.array(rng.integers(-3, 3, n), pa.timestamp("us"), mask=rng.random(n) < 0.1),
        "d32": pa.array(rng.integers(-3, 3, n).astype(np.int32), pa.date32(), mask=rng.random(n) < 0.1),
        "s": pa.array([strings[i] for i in rng.integers(0, len(strings), n)], pa.string(), mask=rng.random(n) < 0.1),
        "lb": pa.array([strings[i].encode() for i in rng.integers(0, len(strings), n)], pa.large_binary()),
        "dict": pa.array([strings[i] for i in rng.integers(0, 4, n)], pa.string()).dictionary_encode(),
    })
    for cols in (["i64"], ["i8"], ["u64"], ["u16"], ["f64"], ["f32"], ["b"], ["ts"], ["d32"], ["s"], ["lb"],
                 ["dict"], ["b", "f64"], ["s", "i64", "f32"], ["u16", "s", "ts"]):
        d = [desc] * len(cols) if len(cols) == 1 else [desc] + [not desc] * (len(cols) - 1)
        sk = SortKeys(table.schema, cols, d)
        got = _words_order(sk, table.select(cols))
        want = _py_order(table.select(cols), cols, d)
        assert got == want, cols


def test_sort_words_reject_unsortable_types_and_grow_for_long_strings():
    schema = pa.schema([("l", pa.list_(pa.int64())), ("s", pa.string())])
    with pytest.raises(OperationError, match="cannot sort on column 'l'"):
        SortKeys(schema, ["l"], [False])
    sk = SortKeys(schema, ["s"], [False])
    assert sk.nwords == 3  # one word of bytes, the length, the row key
    assert sk.needs_more_words(pa.table({"s": ["x" * 20]}))
    assert sk.nwords == 5 and not sk.needs_more_words(pa.table({"s": ["y" * 24]}))
    assert sk.needs_more_words(pa.table({"s": ["z" * 1000]})) and sk.nwords == 10  # capped at 64 bytes


# ----------------------------------------------------------------------------------------------
# OrderIndex
# ----------------------------------------------------------------------------------------------

def _check_against(idx: OrderIndex, model: dict) -> None:
    idx.check()
    ids = np.array(sorted(model), dtype=np.int64)
    keys = idx.key_of(ids)
    assert (keys >= 0).all() and len(idx) == len(model)
    by_key = ids[np.argsort(keys)].tolist()
    assert by_key == sorted(model, key=lambda i: (model[i], i))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("spacing", [2, 4])
@pytest.mark.parametrize("local", [False, True], ids=["search", "look-near-first"])
def test_order_index_keeps_order_under_random_inserts_deletes_and_moves(seed, spacing, local):
    rng = np.random.default_rng(seed)
    idx = OrderIndex(2, spacing)
    if local:  # the looks near a known slot that large indexes make before searching
        idx.local_first = 0
    model: dict[int, int] = {}
    next_id = 0
    total_moves = 0
    for step in range(250):
        ids = np.array(list(model), dtype=np.int64)
        if ids.size and rng.random() < 0.6:
            gone = rng.choice(ids, int(rng.integers(1, min(ids.size, 30) + 1)), replace=False)
            idx.delete(idx.key_of(gone))
            for i in gone.tolist():
                del model[i]
        m = int(rng.integers(0, 50))
        mode = int(rng.integers(0, 4))
        vals = [rng.integers(0, 4, m), rng.integers(0, 10**6, m), np.full(m, int(rng.integers(0, 4))),
                10**6 + step * 100 + np.arange(m)][mode]
        new = np.arange(next_id, next_id + m, dtype=np.int64)
        next_id += m
        before = dict(zip(model, idx.key_of(np.array(list(model), dtype=np.int64)).tolist()))
        keys, mo, mn, brk, kept = idx.insert([vals.astype(np.uint64), new.astype(np.uint64)])
        model.update(zip(new.tolist(), vals.tolist()))
        _check_against(idx, model)
        assert np.array_equal(idx.key_of(new), keys) and not kept.any()
        # the reported moves are exactly the elements whose key changed, in ascending order
        after = dict(zip(before, idx.key_of(np.array(list(before), dtype=np.int64)).tolist()))
        changed = sorted((before[i], after[i]) for i in before if before[i] != after[i])
        assert [tuple(x) for x in zip(mo.tolist(), mn.tolist())] == changed
        total_moves += mo.size
        # a run break sits exactly where an element that stayed lies between two moved ones
        stayed = np.array(sorted(k for i, k in before.items() if before[i] == after[i]), dtype=np.int64)
        if mo.size:
            between = np.searchsorted(stayed, mo[1:]) > np.searchsorted(stayed, mo[:-1])
            assert brk[0] and np.array_equal(brk[1:] & between, between)
    assert total_moves > 0  # crowded gaps did happen


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("nwords", [1, 2, 3])
def test_the_search_through_the_fence_finds_what_the_plain_search_finds(seed, nwords):
    """A large index searches its fence and then the slots between two samples (by lifting in
    fixed steps); on any index it gives the plain search's answer: queries tied with elements,
    between them, before the first, after the last, and after every element of a first word."""
    rng = np.random.default_rng(seed)
    idx = OrderIndex(nwords, 2)
    idx.local_first = 0   # a fence from the first slot, as an index of millions keeps
    for n in (1, 7, 300, 5000):
        ids = rng.permutation(n).astype(np.uint64) * 2 + 1   # distinct, odd
        words = [rng.integers(1, max(2, n // 20), n).astype(np.uint64)]
        words += [rng.integers(0, 50, n).astype(np.uint64) for _ in range(nwords - 2)]
        words = words + [ids] if nwords > 1 else [ids]
        order = np.lexsort(words[::-1])
        idx.build([w[order] for w in words])
        assert idx.F is not None
        m = 400
        q = [rng.integers(0, max(3, n // 20) + 2, m).astype(np.uint64)]
        if nwords == 1:
            q = [rng.integers(0, 2 * n + 2, m).astype(np.uint64) * 2]   # even: never an element's
        else:
            q += [rng.integers(0, 50, m).astype(np.uint64) for _ in range(nwords - 2)]
            q.append(rng.integers(0, 2 * n + 2, m).astype(np.uint64) * 2)   # even: never an element's
            top = rng.random(m) < 0.25   # after every element tied on the first word
            for w in q[1:]:
                w[top] = np.iinfo(np.uint64).max
        order = np.lexsort(q[::-1])
        q = [w[order] for w in q]
        fenced = idx._fenced_search(q)
        if fenced is None:   # no sample inside the region
            continue
        assert np.array_equal(fenced, idx._search(q))


def test_locate_finds_neighbours_and_the_ends():
    idx = OrderIndex(2, 4)
    vals = np.array([10, 20, 20, 30], dtype=np.uint64)
    keys = idx.build([vals, np.arange(4, dtype=np.uint64)])
    q = [np.array([5, 20, 20, 25, 40], dtype=np.uint64), np.array([9, 0, 9, 9, 9], dtype=np.uint64)]
    # (20, 0) is not present as a query (id 0 has value 10), so it sorts before (20, 1)
    pred, succ = idx.locate(q)
    assert pred.tolist() == [NONE_LO, keys[0], keys[2], keys[2], keys[3]]
    assert succ.tolist() == [keys[0], keys[1], keys[3], keys[3], NONE_HI]


def test_a_row_between_two_rows_goes_in_without_moving_anyone_and_prefer_keeps_a_key():
    idx = OrderIndex(2, 4)
    keys = idx.build([np.array([10, 20, 30], dtype=np.uint64), np.arange(3, dtype=np.uint64)])
    k, mo, mn, brk, kept = idx.insert([np.array([15, 25], dtype=np.uint64), np.array([3, 4], dtype=np.uint64)])
    assert mo.size == 0 and keys[0] < k[0] < keys[1] < k[1] < keys[2]
    # an element taken out and put back between the same neighbours can keep its key
    idx.delete(np.array([keys[1]]))
    k2, mo, _, _, kept = idx.insert([np.array([21], dtype=np.uint64), np.array([1], dtype=np.uint64)],
                                    prefer=np.array([keys[1]]))
    assert kept.tolist() == [True] and k2.tolist() == [keys[1]] and mo.size == 0
    idx.check()


def test_first_and_last_keys_and_lex_compare():
    idx = OrderIndex(2, 2)
    vals = np.arange(100, dtype=np.uint64)[::-1].copy()
    keys = idx.build([vals, np.arange(100, dtype=np.uint64)])
    idx.delete(np.sort(keys)[::3])
    all_keys = idx.keys()
    assert idx.first_keys(10).tolist() == all_keys[:10].tolist()
    assert idx.last_keys(7).tolist() == all_keys[-7:].tolist()
    assert idx.first_keys(1000).tolist() == all_keys.tolist()
    # elements compare word by word: the first word decides, the next ones break its ties
    idx = OrderIndex(2, 4)
    old = idx.build([np.array([1, 1], np.uint64), np.array([6, 9], np.uint64)])  # (1, 6) and (1, 9)
    new, moved, *_ = idx.insert([np.array([1, 2, 1], np.uint64), np.array([5, 0, 7], np.uint64)])
    # (1, 5) < (1, 6) < (1, 7) < (1, 9) < (2, 0)
    assert moved.size == 0 and new[0] < old[0] < new[2] < old[1] < new[1]
    idx.check()


@pytest.mark.parametrize("seed", SEEDS)
def test_a_members_index_re_lays_itself_when_its_arrays_outgrow_its_elements(seed, monkeypatch):
    # rows come at the end of their groups while the oldest go (a last_by of a ring table), and
    # the table shrinks and grows back: the arrays of an index of members must follow its elements
    from tickwire.server.engine.graph import order as order_module

    # the slots a new array adds beyond its elements' (a smaller slack would re-lay it at once)
    monkeypatch.setattr(order_module, "SPARSE_SLACK", 4096)
    monkeypatch.setattr(order_module, "SPARSE", 2)
    relays = []
    real = OrderIndex._relay

    def counting(self):
        relays.append(True)
        real(self)

    monkeypatch.setattr(OrderIndex, "_relay", counting)
    rng = np.random.default_rng(seed)
    idx = OrderIndex(2, budget=order_module.MEMBERS_BUDGET, members=True)
    assert idx.spacing == order_module.MEMBERS_MAX_SPACING
    model: dict[int, int] = {}  # id (the parent's row key, ever larger) -> group
    next_id = 0
    for step in range(300):
        live = 1500 if (step // 60) % 2 == 0 else 150
        m = int(rng.integers(1, 80))
        groups = rng.integers(0, 12, m)
        new = np.arange(next_id, next_id + m, dtype=np.int64)
        next_id += m
        hint = None
        if step % 3 and model:
            # the element before each new one, as a caller that knows it passes it: the last
            # element of its group, or of the nearest group before it
            ids = np.array(sorted(model, key=lambda i: (model[i], i)), dtype=np.int64)
            g_of = np.array([model[i] for i in ids.tolist()])
            at = np.searchsorted(g_of, groups, side="right") - 1
            hint = np.where(at >= 0, idx.key_of(ids[np.maximum(at, 0)]), -1)
        idx.insert([groups.astype(np.uint64), new.astype(np.uint64)], before=hint)
        model.update(zip(new.tolist(), groups.tolist()))
        _check_against(idx, model)
        if len(model) > live:
            oldest = np.array(sorted(model)[:len(model) - live], dtype=np.int64)
            # now and then the delete leaves the re-lay to the next insert (which then moves the
            # keys the caller passed it)
            lazy = step % 5 == 0
            monkeypatch.setattr(order_module, "SPARSE", 1000 if lazy else 2)
            idx.delete(idx.key_of(oldest))
            monkeypatch.setattr(order_module, "SPARSE", 2)
            for i in oldest.tolist():
                del model[i]
            _check_against(idx, model)
            if not lazy:
                assert idx.cap <= order_module.SPARSE * len(idx) * idx.spacing + order_module.SPARSE_SLACK
    assert any(relays)
    idx.delete(idx.key_of(np.array(list(model), dtype=np.int64)))
    assert len(idx) == 0 and idx.cap == 0  # an emptied index keeps no arrays


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_group_hints_hold_through_inserts_and_moves_and_are_checked_after_deletes_and_relays(seed, monkeypatch):
    """A members index's GroupHints (each group's first and last element): after inserts (new
    rows at either end or inside their groups, and the moves their re-spreads make) every
    non-empty group's hints hold without a search; after deletes and re-lays, a hint that no
    longer holds is found out and searched for; the members read with hints are always those read
    with searches."""
    from tickwire.server.engine.graph import order as order_module
    from tickwire.server.engine.graph.ops.join_keys import GroupHints, group_members

    monkeypatch.setattr(order_module, "SPARSE_SLACK", 512)
    rng = np.random.default_rng(seed)
    idx = OrderIndex(2, budget=order_module.MEMBERS_BUDGET, members=True)
    monkeypatch.setattr(idx, "max_spacing", 4)
    hints = GroupHints(idx)
    groups_n = 40
    count = np.zeros(groups_n, dtype=np.int64)
    model: dict[int, int] = {}
    every = np.arange(groups_n, dtype=np.int64)
    low, high = 1_000_000, 1_000_001   # ids come at both ends of the id range
    for step in range(250):
        m = int(rng.integers(1, 40))
        g = rng.integers(0, groups_n, m)
        front = rng.random(m) < 0.3
        ids = np.where(front, low - np.arange(m), high + np.arange(m))
        low, high = low - m, high + m
        np.add.at(count, g, 1)
        hints.insert([(g + 1).astype(np.uint64), ids.astype(np.uint64)], g, count)
        model.update(zip(ids.tolist(), g.tolist()))
        live = every[count[every] > 0]
        _f, _l, ok = hints.bounds(live)
        assert ok.all(), f"step {step}: hints of groups {live[~ok].tolist()} lost by an insert"
        if step % 4 == 3:
            gone = rng.choice(np.array(list(model), dtype=np.int64), min(len(model), int(rng.integers(1, 60))),
                              replace=False)
            idx.delete(idx.key_of(gone))
            for i in gone.tolist():
                count[model.pop(i)] -= 1
        want = group_members(idx, every)
        got_members = group_members(idx, every, hints)
        assert all(np.array_equal(a, b) for a, b in zip(got_members, want))
        _f, _l, ok = hints.bounds(every[count[every] > 0])
        assert ok.all()
    assert idx.layouts > 1   # some deletes re-laid the index
