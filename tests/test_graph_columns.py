"""Column storage, row-wise equality, key hashing and the hash index, against Python models."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.engine.graph import ColumnStore, KeyIndex, equal_mask, hash_columns


def test_equal_mask_handles_nulls_nan_and_nested_types():
    a = pa.array([1.0, None, float("nan"), 2.0, None, -0.0])
    b = pa.array([1.0, None, float("nan"), 3.0, 4.0, 0.0])
    assert equal_mask(a, b).tolist() == [True, True, True, False, False, True]
    la = pa.array([[1, 2], None, [], [1, None], [3], [1, 2, 3]], pa.list_(pa.int64()))
    lb = pa.array([[1, 2], None, [], [1, None], None, [1, 2, 4]], pa.list_(pa.int64()))
    assert equal_mask(la, lb).tolist() == [True, True, True, True, False, False]
    # slices with offsets compare by their own rows
    assert equal_mask(la.slice(3), lb.slice(3)).tolist() == [True, False, False]
    st = pa.struct([("x", pa.int32()), ("y", pa.list_(pa.string()))])
    sa = pa.array([{"x": 1, "y": ["a"]}, {"x": 1, "y": ["a", None]}, None, {"x": 2, "y": None}], st)
    sb = pa.array([{"x": 1, "y": ["a"]}, {"x": 1, "y": ["a", "b"]}, None, {"x": 2, "y": []}], st)
    assert equal_mask(sa, sb).tolist() == [True, False, True, False]
    sa2 = pa.array(["x", "yy", None, ""], pa.string())
    assert equal_mask(sa2, pa.array(["x", "y", None, ""])).tolist() == [True, False, True, True]
    with pytest.raises(ValueError):
        equal_mask(pa.array([1]), pa.array([1, 2]))


@pytest.mark.parametrize("seed", range(5))
def test_hashes_depend_only_on_values(seed):
    rng = np.random.default_rng(seed)
    n = 500
    words = np.array(["", "a", "ab", "ba", "abc", "é", "\x00", "a\x00"], dtype=object)
    s = pa.array(words[rng.integers(0, words.size, n)].tolist(), mask=rng.random(n) < 0.1)
    i = pa.array(rng.integers(-3, 3, n), pa.int16(), mask=rng.random(n) < 0.1)
    f = pa.array(rng.choice([0.0, -0.0, 1.5, np.nan], n))
    b = pa.array(rng.integers(0, 3, n).astype(bytes).tolist(), pa.large_binary())
    h = hash_columns([s, i, f, b])
    # the same values in other buffers (sliced, rebuilt) hash the same
    off = 7
    h2 = hash_columns([pa.concat_arrays([s.slice(0, 3), s]).slice(3), i, f, b])
    assert np.array_equal(h, h2)
    assert np.array_equal(hash_columns([s.slice(off), i.slice(off), f.slice(off), b.slice(off)]), h[off:])
    # equal keys <=> equal hashes (no collisions among these few distinct keys)
    keys = list(zip(s.to_pylist(), i.to_pylist(), [("nan" if x != x else x + 0.0) for x in f.to_pylist()],
                    b.to_pylist()))
    by_key: dict = {}
    for k, hv in zip(keys, h.tolist()):
        by_key.setdefault(k, set()).add(hv)
    assert all(len(v) == 1 for v in by_key.values())
    assert len({next(iter(v)) for v in by_key.values()}) == len(by_key)


@pytest.mark.parametrize("seed", range(8))
def test_key_index_matches_a_dict_even_with_colliding_hashes(seed):
    rng = np.random.default_rng(seed)
    idx = KeyIndex(capacity=16)
    model: dict[int, int] = {}  # key -> row
    row_key_of = np.zeros(0, dtype=np.int64)  # row -> key, to verify candidates
    next_row = 0

    def hashes(keys):
        # a deliberately weak hash (many collisions) to exercise probing and verification
        return (keys % 97).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)

    for step in range(60):
        q = np.unique(rng.integers(0, 3000, int(rng.integers(1, 300))))

        def verify(qi, rows, q=q, row_key_of=row_key_of):
            return row_key_of[rows] == q[qi]

        rows, where = idx.lookup(hashes(q), verify)
        assert rows.tolist() == [model.get(k, -1) for k in q.tolist()], f"seed {seed} step {step}"
        if rng.random() < 0.6:
            new = q[rows < 0]
            r = np.arange(next_row, next_row + new.size, dtype=np.int64)
            next_row += new.size
            row_key_of = np.concatenate((row_key_of, new))
            idx.insert(hashes(new), r)
            model.update(zip(new.tolist(), r.tolist()))
        else:
            gone = rows >= 0
            idx.delete(where[gone])
            for k in q[gone].tolist():
                del model[k]
        assert len(idx) == len(model)
    assert idx.capacity >= 2 * len(idx)


def test_bytes_columns_compact_under_churn_and_keep_values(monkeypatch):
    schema = pa.schema([("s", pa.string()), ("b", pa.large_binary())])
    store = ColumnStore(schema, capacity=16)
    heaps = {type(column) for column in store.columns}  # the class of the byte heaps of both columns
    assert len(heaps) == 1
    monkeypatch.setattr(heaps.pop(), "min_garbage", 4096)  # compacted from 4 KiB of garbage (not 64 KiB)
    rng = np.random.default_rng(3)
    model_s = [None] * 1000
    model_b = [None] * 1000
    for _ in range(200):
        slots = rng.choice(1000, 300, replace=False)
        vals = [None if x % 11 == 0 else "v" * int(x % 50) + str(x) for x in rng.integers(0, 10**6, 300)]
        bins = [bytes([x % 256]) * int(x % 40) for x in rng.integers(0, 10**6, 300)]
        store.write(slots.astype(np.int64), pa.table({"s": pa.array(vals), "b": pa.array(bins, pa.large_binary())}))
        for sl, v, bv in zip(slots.tolist(), vals, bins):
            model_s[sl], model_b[sl] = v, bv
    heap = store.columns[0]
    assert heap.used < 4 * sum(len(v.encode()) for v in model_s if v)  # garbage was reclaimed
    got = store.gather(np.arange(1000, dtype=np.int64))
    assert got.column("s").to_pylist()[:1000] == model_s
    assert got.column("b").to_pylist() == [b if b is not None else None for b in model_b]


def test_a_small_string_column_that_churns_holds_a_few_times_its_live_bytes():
    """A ring's short symbols, rewritten for hours: the heap is compacted once its garbage passes
    its live bytes or 64 KiB, so it stays within a bound of its live bytes, not growing to a
    megabyte of garbage."""
    store = ColumnStore(pa.schema([("Sym", pa.string())]), capacity=2_000)
    rng = np.random.default_rng(5)
    heap = store.columns[0]
    peak = 0
    for i in range(5_000):  # 500,000 writes (1.7 MB) into 2,000 slots of 2 to 4 bytes each
        slots = (np.arange(100, dtype=np.int64) + 100 * i) % 2_000
        syms = np.char.add("S", rng.integers(0, 500, 100).astype(str))
        store.write(slots, pa.table({"Sym": pa.array(syms.tolist())}))
        peak = max(peak, heap.heap.size)
    live = int(heap.length.sum())
    assert live < 8_000
    assert peak <= 4 * (live + (1 << 16))
    want = store.gather(np.arange(2_000, dtype=np.int64)).column("Sym").to_pylist()
    assert all(isinstance(v, str) and v.startswith("S") for v in want)


def _appended(rng, start: int, n: int) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    x = pa.array(ids * 0.5, mask=rng.random(n) < 0.1)
    sym = pa.array([f"s{i % 13}" * (i % 9) for i in ids.tolist()], mask=rng.random(n) < 0.1)
    pair = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 2).astype(np.int32)), 2)
    return pa.table({"id": ids, "x": x, "sym": sym, "pair": pair, "nothing": pa.nulls(n)})


@pytest.mark.parametrize("seed", range(3))
def test_an_appending_store_doubles_ahead_and_holds_what_was_written(seed, monkeypatch):
    """Appends of random sizes through ensure_appending: each doubling is prepared on its own
    thread once the store is three quarters full and swapped in (by the append that needs it or
    the first after the copy is done) with the rows appended meanwhile, and so is the doubling of
    the strings' heap; every value reads back."""
    monkeypatch.setattr(ColumnStore, "ahead_from", 64)
    rng = np.random.default_rng(seed)
    parts = [_appended(rng, 0, 10)]
    store = ColumnStore(parts[0].schema, capacity=64)
    store.ensure_appending(10, 0)
    store.write(np.arange(10, dtype=np.int64), parts[0])
    used, swapped, started, heap_swapped, heap_started = 10, 0, 0, 0, 0
    while used < 20_000:
        n = int(rng.integers(1, 400))
        before, job = store.capacity, store._ahead
        heap_job = store.columns[2].heap_ahead
        store.ensure_appending(used + n, used)
        if heap_job is not None and store.columns[2].heap_ahead is not heap_job:
            heap_swapped += store.columns[2].heap is heap_job.copies[0]
        heap_started += store.columns[2].heap_ahead not in (None, heap_job)
        if job is not None and store._ahead is not job and store.capacity > before:
            copies = job.copies
            came_in = all(getattr(c, name) is new for (c, name, _old), new in zip(job.arrays, copies))
            swapped += came_in
        started += store._ahead is not None and store._ahead is not job
        part = _appended(rng, used, n)
        heap_job = store.columns[2].heap_ahead
        store.write(np.arange(used, used + n, dtype=np.int64), part)  # may need the heap's doubling
        if heap_job is not None and store.columns[2].heap_ahead is not heap_job:
            heap_swapped += store.columns[2].heap is heap_job.copies[0]
        parts.append(part)
        used += n
        assert store.capacity >= used
    # every doubling prepared came in (appends of up to 400 rows pass the small capacities in one step)
    assert started >= 5 and swapped == started - (store._ahead is not None)
    # the strings' heap too, from 64 KB: every prepared doubling came in
    assert heap_started >= 2 and heap_swapped == heap_started - (store.columns[2].heap_ahead is not None)
    want = pa.concat_tables(parts).combine_chunks()
    got = store.gather(np.arange(used, dtype=np.int64))
    assert got.equals(want)
    picks = rng.choice(used, 500)
    assert store.gather(picks).equals(want.take(pa.array(picks)))


def test_a_store_with_a_column_of_objects_doubles_in_place():
    """A column kept as Python objects (decimals) is not copied on another thread: no doubling is
    prepared, and the plain one keeps the values."""
    import decimal

    schema = pa.schema([("id", pa.int64()), ("d", pa.decimal128(10, 2))])
    store = ColumnStore(schema, capacity=ColumnStore.ahead_from)
    n = ColumnStore.ahead_from
    data = pa.table({"id": np.arange(n, dtype=np.int64), "d": pa.array([decimal.Decimal(i % 100) for i in range(n)],
                                                                         type=pa.decimal128(10, 2))})
    store.ensure_appending(n, 0)
    store.write(np.arange(n, dtype=np.int64), data)
    store.ensure_appending(n + 1, n)
    assert store._ahead is None and store.capacity == 2 * n
    assert store.gather(np.arange(n, dtype=np.int64)).equals(data)


def test_a_doubling_prepared_before_a_compaction_is_not_used():
    """A byte column compacted while a doubling is under way (its slots' starts may move): the
    prepared copies are dropped and the plain doubling keeps the values."""
    rng = np.random.default_rng(7)
    first, second, more = _appended(rng, 0, 40), _appended(rng, 40, 8), _appended(rng, 48, 50)
    store = ColumnStore(first.schema, capacity=64)
    store.ahead_from = 64
    store.ensure_appending(40, 0)
    store.write(np.arange(40, dtype=np.int64), first)
    assert store._ahead is None
    store.ensure_appending(48, 40)  # three quarters full: the doubling is prepared
    job = store._ahead
    assert job is not None
    store.write(np.arange(40, 48, dtype=np.int64), second)
    job.thread.join()
    store.columns[2].compactions += 1  # as a compaction that moved the bytes leaves it
    store.ensure_appending(98, 48)  # fits the prepared 128 slots: only the check keeps them out
    store.write(np.arange(48, 98, dtype=np.int64), more)
    assert store.capacity >= 98
    assert not any(getattr(c, name) is new for (c, name, _old), new in zip(job.arrays, job.copies))
    want = pa.concat_tables([first, second, more]).combine_chunks()
    assert store.gather(np.arange(98, dtype=np.int64)).equals(want)


def test_a_write_that_outgrows_the_heap_takes_its_prepared_doubling():
    """The append that starts the heap's doubling writes more bytes than the heap has left: the
    write waits for the prepared heap and appends to it (no second, plain doubling)."""
    schema = pa.schema([("s", pa.string())])
    store = ColumnStore(schema, capacity=64)
    store.ahead_from = 64
    col = store.columns[0]
    first = pa.table({"s": ["x" * 1000] * 50})  # 50,000 of the heap's 65,536 bytes: over three quarters
    store.ensure_appending(50, 0)
    store.write(np.arange(50, dtype=np.int64), first)
    assert col.heap_ahead is None and col.heap.size == 1 << 16
    second = pa.table({"s": ["y" * 1000] * 30})  # 30,000 more: past the heap's end
    store.ensure_appending(80, 50)
    job = col.heap_ahead
    assert job is not None and job.kept == 50_000
    store.write(np.arange(50, 80, dtype=np.int64), second)
    assert col.heap_ahead is None and col.heap is job.copies[0] and col.heap.size == 1 << 17
    assert store.gather(np.arange(80, dtype=np.int64)).equals(pa.concat_tables([first, second]).combine_chunks())
