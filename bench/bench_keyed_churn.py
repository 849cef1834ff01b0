"""Keyed tables that churn keys: is memory proportional to the live rows, not to every key seen?

Three processes, each building one keyed table (`k` int64 key, a double and a string column) and
reporting the memory it holds once built:

- fresh: the table's --live rows (100,000) written at once;
- churned: the same --live rows, then --ops (10,000,000) new keys inserted and as many live keys
  deleted, --per-cycle (10,000) of each per cycle, ending with --live live rows;
- restarted: the churned table's data directory (a durable table, checkpointed at the end)
  opened by a new process.

With --derived, each process also holds tables derived from it that keep state per group, the
groups being orders of four keys (`g` = k // 4): `agg_by` (count, sum, min, max, first), `last_by`
and `head_by` (2); the churn then deletes the oldest keys (orders fill in the order they came), so
groups come and go, and the memory compared is the whole engine's. Without reuse of emptied groups
each derived table would keep a group per order ever seen.

Memory is Python's traced memory (tracemalloc: the numpy arrays of the columns and indexes and
Python objects) plus Arrow's allocated bytes, after a GC, and the resident set size. Printed:
churned / fresh and restarted / fresh for both (target <= 1.5), and the key space (row keys
handed out) of each. Without reuse of deleted rows' keys the churned table would hold a slot per
key ever inserted (101x the live rows here).
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(keys: np.ndarray) -> pa.Table:
    return pa.table({"k": keys, "v": keys * 0.5, "s": pa.array(keys.astype(str))}, schema=SCHEMA)


def rss_mb() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def measure(table, derived: list) -> dict:
    gc.collect()
    traced, _peak = tracemalloc.get_traced_memory()
    out = {"traced_mb": traced / 2**20, "arrow_mb": pa.total_allocated_bytes() / 2**20, "rss_mb": rss_mb(),
           "rows": len(table.rowset), "key_space": int(table.next_key)}
    for d in derived[1:]:
        out[f"{d.name}_groups"] = int(d._ngroups)
    return out


def derive(table) -> list:
    """The derived tables of --derived, over `table`, grouped by g = k // 4."""
    import pyarrow.compute as pc

    from tickwire.server.engine.graph.ops import Agg

    g = table.select({"k": pc.field("k"), "v": pc.field("v"), "s": pc.field("s"),
                      "g": pc.divide(pc.field("k"), pc.scalar(4))}, name="with_g")   # integer division
    return [g, g.agg_by([Agg("count", name="n"), Agg("sum", "v", "sv"), Agg("min", "v", "lo"),
                         Agg("max", "v", "hi"), Agg("first", "s", "fs")], ["g"], name="agg"),
            g.last_by(["g"], name="last"), g._derive("head_by", "head", 2, ["g"])]


def child(mode: str, live: int, ops: int, per_cycle: int, data_dir: str, reuse: bool = True,
          derived: bool = False) -> dict:
    from tickwire.server.engine import Engine, TableSpec
    from tickwire.server.engine.graph import group_ids, sources
    from tickwire.server.engine.graph.ops import last_by
    from tickwire.server.engine.storage import Durability

    if not reuse:  # the comparison: deleted rows' keys (and emptied groups' ids) never taken again
        sources._REUSE_MIN = 1 << 62
        last_by._REUSE_MIN = 1 << 62
        group_ids.REUSE_MIN = 1 << 62

    tracemalloc.start()
    engine = Engine(interval_ms=3_600_000)
    # all three durable: the journal's and the storage's own memory weigh on each alike
    found = engine.open_storage(data_dir + ("-fresh" if mode == "fresh" else ""),
                                Durability(checkpoint_cycles=10**9, fsync="off"))
    if mode == "restarted":
        table = next(t for t in found if t.name == "t")
        kept = derive(table) if derived else []
        out = measure(table, kept)
        engine.close_storage()
        return out
    table, _ = engine.get_or_create(TableSpec("t", "keyed", SCHEMA, keys=("k",)))
    held = np.arange(live, dtype=np.int64)
    if mode == "fresh" and derived:   # the churned table's live keys (the oldest deleted)
        held = held + (ops // per_cycle) * per_cycle
    engine.write(table, rows(held), wait=False)
    engine.run_cycle()
    kept = derive(table) if derived else []
    t0 = time.perf_counter()
    if mode == "churned":
        rng = np.random.default_rng(1)
        nxt = live
        for c in range(ops // per_cycle):
            # random live keys, or with --derived the oldest (orders fill in the order they came)
            pick = rng.choice(held.size, per_cycle, replace=False) if not derived else \
                (np.arange(per_cycle) + c * per_cycle) % held.size
            gone = held[pick]
            new = np.arange(nxt, nxt + per_cycle, dtype=np.int64)
            nxt += per_cycle
            engine.write(table, delete=pa.table({"k": gone}), wait=False)
            engine.write(table, rows(new), wait=False)
            engine.run_cycle()
            held[pick] = new
        engine.storage.checkpoint(table)
        engine.storage.wait_checkpoints()
    out = measure(table, kept)
    out["seconds"] = time.perf_counter() - t0
    engine.close_storage()
    return out


def run_child(mode: str, args, data_dir: str) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--live", str(args.live), "--ops", str(args.ops),
           "--per-cycle", str(args.per_cycle), "--data-dir", data_dir] + (["--no-reuse"] if args.no_reuse else []) \
        + (["--derived"] if args.derived else [])
    res = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--live", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=10_000_000, help="keys inserted (and as many deleted)")
    ap.add_argument("--per-cycle", type=int, default=10_000)
    ap.add_argument("--child", choices=("fresh", "churned", "restarted"))
    ap.add_argument("--data-dir")
    ap.add_argument("--quick", action="store_true", help="1,000,000 inserts and deletes instead of --ops")
    ap.add_argument("--no-reuse", action="store_true", help="never reuse deleted rows' keys (what it was without)")
    ap.add_argument("--derived", action="store_true", help="also agg_by, last_by and head_by of orders of 4 keys")
    args = ap.parse_args()
    if args.quick:
        args.ops = min(args.ops, 1_000_000)
    if args.child:
        print(json.dumps(child(args.child, args.live, args.ops, args.per_cycle, args.data_dir, not args.no_reuse,
                               args.derived)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        res = {m: run_child(m, args, str(Path(tmp) / "data")) for m in ("fresh", "churned", "restarted")}
    for m, r in res.items():
        extra = f", built in {r['seconds']:.1f} s" if "seconds" in r else ""
        groups = "".join(f", {k[:-7]} {v:,} groups" for k, v in r.items() if k.endswith("_groups"))
        print(f"{m:>9}: {r['rows']:,} rows, key space {r['key_space']:,}{groups}; traced {r['traced_mb']:.1f} MB + "
              f"Arrow {r['arrow_mb']:.1f} MB, RSS {r['rss_mb']:.0f} MB{extra}")
    f = res["fresh"]
    for m in ("churned", "restarted"):
        r = res[m]
        held = (r["traced_mb"] + r["arrow_mb"]) / (f["traced_mb"] + f["arrow_mb"])
        print(f"{m} / fresh after {args.ops:,} inserts and deletes: held memory {held:.2f}, "
              f"RSS {r['rss_mb'] / f['rss_mb']:.2f} (target <= 1.5)")


if __name__ == "__main__":
    main()
