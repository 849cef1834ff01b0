"""Durable tables (issue 15): restart time and the cost of the journal.

1. Recovery of a keyed table of 10M rows (int64 key + 3 numeric columns; 1M with --quick) from a
   Parquet checkpoint plus 1M rows of journal after it (100 cycles of 10k upserts, half of them
   existing keys; 100k with --quick): seconds and rows/s, split into checkpoint read, restoring
   it into the table, journal scan + decode, and replay through the table. Reference, measured
   in the same run: building the same 10M-row table from an in-memory Arrow table through the
   engine (engine.write in 1M-row writes, one cycle each, no data directory); prints the ratio.
2. The cost of journaling: cycle time (write + run_cycle) for 10k-row appends, run back to back
   and then paced at 100k rows/s (10 cycles a second), with no data directory, then with a data
   directory and fsync per cycle, every 100 ms and off; prints the ratios of median cycle times
   (target <= 1.2 with fsync per cycle; a mean is dominated by the append store's capacity
   doublings), the journal's work per cycle (encoding, write, fsync: storage.stats fsync_seconds /
   fsyncs) and the journal's write rate.

The data directory is under /work/tmp-bench-storage (the real disk; /tmp may be tmpfs), or
--dir; it is deleted at the end.
"""
from __future__ import annotations

import argparse
import gc
import os
import resource
import shutil
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Durability, Engine, TableSpec
from tickwire.server.engine.storage import store as store_mod

SCHEMA = pa.schema([("k", pa.int64()), ("px", pa.float64()), ("qty", pa.int64()), ("w", pa.float64())])
CHUNK = 1_000_000


def rows(keys: np.ndarray, rng: np.random.Generator) -> pa.Table:
    n = keys.size
    return pa.table({"k": keys, "px": rng.random(n), "qty": rng.integers(0, 1000, n), "w": rng.random(n)},
                    schema=SCHEMA)


def new_engine() -> Engine:
    return Engine(interval_ms=3_600_000)  # cycles are run here


def fill(engine, table, data: pa.Table) -> float:
    """Writes `data` into `table` in 1M-row writes, one cycle each; seconds."""
    t0 = time.perf_counter()
    for start in range(0, data.num_rows, CHUNK):
        engine.write(table, data.slice(start, CHUNK), wait=False)
        engine.run_cycle()
    return time.perf_counter() - t0


@contextmanager
def timed(parts: dict, name: str, owner, attr: str, inside: str | None = None):
    """Accumulates the seconds spent in `owner.attr` into parts[name] while the block runs (with
    `inside`, only the calls made while parts[inside + " active"] is set)."""
    orig = getattr(owner, attr)
    is_static = isinstance(owner, type) and isinstance(owner.__dict__.get(attr), staticmethod)
    is_class = isinstance(owner, type) and isinstance(owner.__dict__.get(attr), classmethod)
    raw = owner.__dict__[attr] if isinstance(owner, type) else orig

    def wrapper(*a, **kw):
        if inside is not None and not parts.get(inside + " active"):
            return orig(*a, **kw)
        if name.endswith(" active"):
            parts[name] = True
        t0 = time.perf_counter()
        try:
            return orig(*a, **kw)
        finally:
            key = name[:-len(" active")] if name.endswith(" active") else name
            if name.endswith(" active"):
                parts[name] = False
            parts[key] = parts.get(key, 0.0) + time.perf_counter() - t0

    setattr(owner, attr, staticmethod(wrapper) if is_static else
            classmethod(lambda cls, *a, **kw: wrapper(*a, **kw)) if is_class else wrapper)
    try:
        yield
    finally:
        setattr(owner, attr, raw)


def recovery(base: Path, total: int, journal_rows: int, cycles: int, rng, profile: bool) -> None:
    data = rows(np.arange(total, dtype=np.int64), rng)

    # reference: the same table built from memory through the engine, no data directory
    engine = new_engine()
    ref_table, _ = engine.get_or_create(TableSpec("k", "keyed", SCHEMA, keys=("k",)))
    ref = fill(engine, ref_table, data)
    assert ref_table.size == total
    del engine, ref_table
    gc.collect()

    # the durable table: 10M rows, a forced checkpoint, then 1M rows of upserts in the journal
    path = base / "recovery"
    engine = new_engine()
    engine.open_storage(path, Durability(fsync="cycle", checkpoint_cycles=1_000_000, checkpoint_bytes=1 << 40))
    table, _ = engine.get_or_create(TableSpec("k", "keyed", SCHEMA, keys=("k",)))
    build = fill(engine, table, data)
    del data
    storage = engine.storage
    t0 = time.perf_counter()
    with engine.reading():
        storage.checkpoint(table, engine.step + 1)
        held = time.perf_counter() - t0  # no cycle runs while the rows are taken
    storage.wait_checkpoints(600)
    ckpt_wall = time.perf_counter() - t0
    assert storage.stats["checkpoints"] == 1, storage.stats
    per = journal_rows // cycles
    next_new = total
    for _ in range(cycles):
        existing = rng.choice(total, per // 2, replace=False).astype(np.int64)
        new = np.arange(next_new, next_new + per - per // 2, dtype=np.int64)
        next_new += new.size
        engine.write(table, rows(np.concatenate((existing, new)), rng), wait=False)
        engine.run_cycle()
    with engine.reading():
        want_size, want_keys_tail = table.size, table.rowset.keys()[-5:].tolist()
    engine.close_storage()
    del engine, table, storage
    gc.collect()
    ckpt_files = list((path / "default" / "k" / "checkpoints").glob("*.parquet"))
    journals = list((path / "default" / "k" / "intraday").glob("*/*/*.twj"))
    ckpt_mb = sum(p.stat().st_size for p in ckpt_files) / 1e6
    journal_mb = sum(p.stat().st_size for p in journals) / 1e6

    # recovery, timed: a fresh engine and open_storage; where its time goes
    from tickwire.server.engine.graph import sources
    from tickwire.server.engine.graph.keyindex import KeyIndex
    from tickwire.server.engine.graph.row_set import RowSet

    parts: dict = {}
    engine = new_engine()
    r = "restore into the table"
    with timed(parts, "checkpoint read (pq.read_table)", store_mod.pq, "read_table"), \
            timed(parts, r + " active", sources.SourceTable, "restore"), \
            timed(parts, "  duplicate checks (sort)", sources, "has_duplicates", inside=r), \
            timed(parts, "  key hashes", sources, "hash_columns", inside=r), \
            timed(parts, "  key index insert", KeyIndex, "insert", inside=r), \
            timed(parts, "  rowset from keys", RowSet, "from_keys", inside=r), \
            timed(parts, "  column store write", _store_class(), "write", inside=r), \
            timed(parts, "journal scan (crc, records)", store_mod, "scan"), \
            timed(parts, "journal decode (IPC)", store_mod, "decode_data"), \
            timed(parts, "journal split into ops", store_mod, "_split_ops"), \
            timed(parts, "journal replay (apply_pending)", store_mod.Storage, "_replay"):
        if profile:
            import cProfile
            import pstats
            prof = cProfile.Profile()
            t0 = time.perf_counter()
            prof.enable()
            found = engine.open_storage(path)
            prof.disable()
            rec = time.perf_counter() - t0
        else:
            t0 = time.perf_counter()
            found = engine.open_storage(path)
            rec = time.perf_counter() - t0
    (table,) = found
    with engine.reading():
        assert table.size == want_size and table.rowset.keys()[-5:].tolist() == want_keys_tail
    stats = engine.storage.stats
    engine.close_storage()
    recovered = stats["recovered_rows"]
    print(f"recovery of a {total:,}-row keyed table (checkpoint {ckpt_mb:.0f} MB Parquet + {journal_rows:,} rows "
          f"of journal in {cycles} records, {journal_mb:.0f} MB): {rec:.2f} s, {recovered / rec / 1e6:.2f} M rows/s "
          f"({recovered:,} rows read back)")
    print(f"  reference: building the same {total:,}-row table from memory through the engine: {ref:.2f} s; "
          f"ratio recovery/reference {rec / ref:.2f}")
    print(f"  building it with a data directory (fsync per cycle, 1M-row cycles): {build:.2f} s; "
          f"forced checkpoint written in {ckpt_wall:.2f} s, of which the graph's lock was held "
          f"{held * 1e3:.0f} ms to take its rows")
    top = [k for k in parts if not k.startswith(" ") and not k.endswith(" active")]
    inside = sum(parts[k] for k in top if k != "journal split into ops")  # split runs inside the replay
    for k in sorted(top, key=lambda k: -parts[k]):
        print(f"  {k:34s} {parts[k]:6.2f} s  {parts[k] / rec:5.1%}")
        if k == r:
            subs = [j for j in parts if j.startswith("  ")]
            for j in sorted(subs, key=lambda j: -parts[j]):
                print(f"  {j:34s} {parts[j]:6.2f} s  {parts[j] / rec:5.1%}")
    print(f"  {'other':34s} {rec - inside:6.2f} s  {(rec - inside) / rec:5.1%}")
    if profile:
        print("  top costs (cProfile, tottime):")
        st = pstats.Stats(prof)
        st.sort_stats("tottime")
        width = st.total_tt
        for func, (_cc, _nc, tt, _ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:12]:
            fname, line, name = func
            print(f"    {tt:6.2f} s ({tt / width:5.1%}) {Path(fname).name}:{line} {name}")
    del engine, table, found
    gc.collect()


def _store_class():
    from tickwire.server.engine.graph.column_store import ColumnStore
    return ColumnStore


def journal_cost(base: Path, cycles: int, batch: int, pace: int, rng) -> None:
    data = pa.table({"k": np.arange(batch, dtype=np.int64), "px": rng.random(batch),
                     "qty": rng.integers(0, 1000, batch), "w": rng.random(batch)}, schema=SCHEMA)
    parts: dict = {}

    def run(durability):
        os.sync()  # the previous run's dirty pages are on disk: its writeback does not slow this one
        time.sleep(0.5)
        engine = new_engine()
        if durability is not None:
            engine.open_storage(base / f"journal-{durability.fsync}", durability)
        table, _ = engine.get_or_create(TableSpec("a", "append", SCHEMA))
        for _ in range(20):  # warm up
            engine.write(table, data, wait=False)
            engine.run_cycle()
        storage = engine.storage
        if storage is not None:
            storage.stats.update(records=0, bytes=0, fsyncs=0, fsync_seconds=0.0)
        parts.clear()
        times = []
        t_start = time.perf_counter()
        for _ in range(cycles):
            t0 = time.perf_counter()
            engine.write(table, data, wait=False)
            engine.run_cycle()
            times.append(time.perf_counter() - t0)
        wall = time.perf_counter() - t_start
        stats = dict(storage.stats) if storage is not None else None
        spent = dict(parts)
        paced = []
        period = batch / 100_000  # 100k rows/s: one cycle every `period` s, as the engine's cycle thread would run
        next_at = time.perf_counter()
        for _ in range(pace):
            next_at += period
            time.sleep(max(0.0, next_at - time.perf_counter()))
            t0 = time.perf_counter()
            engine.write(table, data, wait=False)
            engine.run_cycle()
            paced.append(time.perf_counter() - t0)
        engine.close_storage()
        return np.array(times), wall, stats, spent, np.array(paced)

    def ms(x) -> str:
        return f"{x * 1e3:6.3f} ms"

    plain, plain_wall, _, _, plain_paced = run(None)
    p_med, p_paced = np.median(plain), np.median(plain_paced)
    print(f"journal cost: {cycles} cycles of {batch:,}-row appends (4 columns, {data.nbytes / 1e6:.2f} MB) back to "
          f"back, then {pace} at 100k rows/s ({100_000 // batch} cycles a second); cycle = write + run_cycle; "
          f"medians (a mean is dominated by the append store's capacity doublings, the same in every run)")
    print(f"  no data directory:  back to back median {ms(p_med)} (p90 {ms(np.percentile(plain, 90))}, "
          f"{cycles * batch / plain_wall / 1e6:.1f} M rows/s); at 100k rows/s median {ms(p_paced)}")
    for mode in ("cycle", "interval", "off"):
        d = Durability(fsync=mode, fsync_interval_ms=100, checkpoint_cycles=1_000_000, checkpoint_bytes=1 << 40)
        with timed(parts, "record", store_mod.Storage, "record"), \
                timed(parts, "encode", store_mod._TableFiles, "record_bytes"), \
                timed(parts, "write", store_mod._TableFiles, "append"):
            times, wall, st, spent, paced = run(d)
        med = np.median(times)
        label = {"cycle": "fsync per cycle", "interval": "fsync every 100 ms", "off": "fsync off"}[mode]
        print(f"  {label + ':':19s} back to back median {ms(med)} (p90 {ms(np.percentile(times, 90))}), "
              f"ratio {med / p_med:.2f}{' (target <= 1.2)' if mode == 'cycle' else ''}; at 100k rows/s median "
              f"{ms(np.median(paced))}, ratio {np.median(paced) / p_paced:.2f}")
        line = (f"      journal work a cycle {ms(spent['record'] / cycles)}: encoding {ms(spent['encode'] / cycles)}, "
                f"write {ms(spent['write'] / cycles)}")
        if st["fsyncs"]:
            line += (f", fsync {ms(st['fsync_seconds'] / cycles)} (each {ms(st['fsync_seconds'] / st['fsyncs'])} "
                     f"x {st['fsyncs']}{', in the background thread' if mode == 'interval' else ''})")
        line += (f"; {st['bytes'] / cycles / 1e6:.2f} MB a cycle, written at {st['bytes'] / wall / 1e6:.0f} MB/s "
                 f"back to back ({st['bytes'] / cycles * 100_000 / batch / 1e6:.1f} MB/s at 100k rows/s)")
        print(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--profile", action="store_true", help="cProfile the recovery and print its top costs")
    ap.add_argument("--part", choices=("all", "recovery", "journal"), default="all")
    ap.add_argument("--dir", default="/work/tmp-bench-storage",
                    help="data directory on the disk to measure (deleted at the end)")
    args = ap.parse_args()
    rng = np.random.default_rng(15)
    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    try:
        if args.part in ("all", "recovery"):
            if args.quick:
                recovery(base, 1_000_000, 100_000, 100, rng, args.profile)
            else:
                recovery(base, 10_000_000, 1_000_000, 100, rng, args.profile)
        if args.part in ("all", "journal"):
            journal_cost(base, 200 if args.quick else 1000, 10_000, 10 if args.quick else 50, rng)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
