"""Joins: does a cycle of natural_join or aj cost what the change costs, not the table?

A keyed left table of 10,000,000 rows (1,000,000 with --quick) and one of 10,000 rows, their `Sym`
spread over 100,000 keys, are each joined to two right tables of those 100,000 keys: a keyed table
of prices (one row per key) by natural_join, and an append table of quotes (three stamps per key)
by aj on (Sym, Ts). Three kinds of traffic, each in its own phase:

- left update: each cycle changes 1,000 left rows — 400 existing rows get new values (a new stamp;
  a quarter of them move to another key), 300 new rows arrive and 300 rows are deleted;
- right update: each cycle 10 keys get a new price and 10 keys a new quote (at a stamp among the
  left rows' stamps, so some of their left rows match it). A right key has about 100 left rows on
  the large table and 0.1 on the small one, so the large table reports about 1,000 rows modified
  per join and the small one about 1. The right phase also runs on a third, *dense* left table of
  10,000 rows whose `Sym` take only 100 keys (as many rows per key as the large table), where the
  same 10-key change touches as many left rows as on the large table: that ratio is the one that
  compares equal changes on tables of different sizes;
- newest: as the right update, but the new quotes come as a live feed's do, each stamped after
  every left row, so that no left row's aj match changes: what aj costs then is what finding that
  out costs.

The per-cycle cost of a join is the time it spends following its parents' updates
(`cycle_seconds`, median over the measured cycles after warm-up); the two left tables live in one
process and their cycles alternate, so the machine's drift weighs on both alike. Prints both costs
and their ratio for each join and phase (target <= 1.2), and the build time of each join.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import time
from typing import Callable

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Table

KEYS = 100_000          # distinct Sym on the right
QUOTES_PER_KEY = 3
STAMPS = 1_000_000      # stamps are drawn from [0, STAMPS)
LEFT = pa.schema([("id", pa.int64()), ("Sym", pa.int64()), ("Ts", pa.int64()), ("Qty", pa.int64())])
PRICES = pa.schema([("Sym", pa.int64()), ("Px", pa.float64())])
QUOTES = pa.schema([("Sym", pa.int64()), ("QuoteTs", pa.int64()), ("Bid", pa.float64())])
JOINS = ("natural_join", "aj")
PHASES = ("left", "right", "newest")


def left_rows(ids: np.ndarray, rng: np.random.Generator, keys: int = KEYS) -> pa.Table:
    n = ids.size
    return pa.table({"id": ids, "Sym": rng.integers(0, keys, n), "Ts": rng.integers(0, STAMPS, n),
                     "Qty": rng.integers(0, 1000, n)}, schema=LEFT)


def quotes(syms: np.ndarray, rng: np.random.Generator) -> pa.Table:
    return pa.table({"Sym": syms, "QuoteTs": rng.integers(0, STAMPS, syms.size),
                     "Bid": rng.random(syms.size) * 100}, schema=QUOTES)


class Setup:
    def __init__(self, table_rows: int, seed: int, left_keys: int = KEYS):
        self.left_keys = left_keys  # the left rows' Sym are drawn from [0, left_keys)
        self.rng = rng = np.random.default_rng(seed)
        self.engine = engine = Engine()  # stepped here with run_cycle()
        self.left = left = engine.create(TableSpec("left", "keyed", LEFT, keys=("id",)))
        self.prices = engine.create(TableSpec("prices", "keyed", PRICES, keys=("Sym",)))
        self.quotes = engine.create(TableSpec("quotes", "append", QUOTES))
        syms = np.arange(KEYS, dtype=np.int64)
        engine.write(self.prices, pa.table({"Sym": syms, "Px": rng.random(KEYS) * 100}, schema=PRICES), wait=False)
        engine.write(self.quotes, quotes(np.repeat(syms, QUOTES_PER_KEY), rng), wait=False)
        # each id's Sym, kept here: the table's row keys are not its ids once deleted keys are reused
        self.sym = np.zeros(table_rows, dtype=np.int64)
        chunk = 1_000_000
        for start in range(0, table_rows, chunk):
            ids = np.arange(start, min(table_rows, start + chunk), dtype=np.int64)
            rows = left_rows(ids, rng, left_keys)
            self.sym[ids] = rows["Sym"].to_numpy()
            engine.write(left, rows, wait=False)
            engine.run_cycle()
        self.live = np.arange(table_rows, dtype=np.int64)
        self.next_id = table_rows
        self.newest = 0   # the last stamp past STAMPS given to a quote of the "newest" phase
        self.build: dict[str, float] = {}
        t0 = time.perf_counter()
        nj = left.natural_join(self.prices, ["Sym"], ["Px"], name="nj")
        self.build["natural_join"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        aj = left.aj(self.quotes, ["Sym", "Ts=QuoteTs"], ["Bid"], name="aj")
        self.build["aj"] = time.perf_counter() - t0
        self.joins = {"natural_join": nj, "aj": aj}
        self.stats: dict[tuple[str, str], list[float]] = {(j, p): [] for j in JOINS for p in PHASES}
        self.modified: dict[tuple[str, str], list[int]] = {(j, p): [] for j in JOINS for p in PHASES}
        self._last_mod: dict[str, int] = {}
        for j, t in self.joins.items():
            t.add_listener(self._counter(j))

    def _counter(self, join: str) -> Callable[[Table, TableUpdate, int], None]:
        def on_update(table: Table, update: TableUpdate, step: int) -> None:
            self._last_mod[join] = len(update.modified)
        return on_update

    def left_change(self) -> None:
        rng = self.rng
        pick = rng.choice(self.live.size, 700, replace=False)
        changed, gone = self.live[pick[:400]], self.live[pick[400:]]
        new = np.arange(self.next_id, self.next_id + 300, dtype=np.int64)
        self.next_id += 300
        upd = left_rows(changed, rng, self.left_keys)
        keep_sym = rng.random(400) < 0.75  # three quarters keep their key
        upd = upd.set_column(1, "Sym", pa.array(np.where(keep_sym, self.sym[changed], upd["Sym"].to_numpy())))
        added = left_rows(new, rng, self.left_keys)
        if self.next_id > self.sym.size:
            self.sym = np.concatenate((self.sym, np.zeros(self.sym.size, dtype=np.int64)))
        self.sym[changed] = upd["Sym"].to_numpy()
        self.sym[new] = added["Sym"].to_numpy()
        with self.engine.writes(wait=False) as w:
            w.write(self.left, pa.concat_tables([upd, added]))
            w.write(self.left, delete=pa.table({"id": gone}))
        mask = np.ones(self.live.size, dtype=bool)
        mask[pick[400:]] = False
        self.live = np.concatenate((self.live[mask], new))

    def right_change(self, newest: bool = False) -> None:
        rng = self.rng
        syms = rng.choice(self.left_keys, 10, replace=False).astype(np.int64)
        q = quotes(rng.choice(self.left_keys, 10, replace=False).astype(np.int64), rng)
        if newest:   # as a live feed's quotes come: after every left row's stamp
            self.newest += 1
            q = q.set_column(1, "QuoteTs", pa.array(np.full(10, STAMPS + self.newest, dtype=np.int64)))
        with self.engine.writes(wait=False) as w:
            w.write(self.prices, pa.table({"Sym": syms, "Px": rng.random(10) * 100}, schema=PRICES))
            w.write(self.quotes, q)

    def cycle(self, phase: str, record: bool) -> None:
        if phase == "left":
            self.left_change()
        else:
            self.right_change(newest=phase == "newest")
        before = {j: len(t.cycle_seconds) for j, t in self.joins.items()}
        self._last_mod = {}
        self.engine.run_cycle()
        if record:
            for j, t in self.joins.items():
                if len(t.cycle_seconds) > before[j]:
                    self.stats[j, phase].append(t.cycle_seconds[-1])
                    self.modified[j, phase].append(self._last_mod.get(j, 0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a left table of 1M rows instead of 10M")
    ap.add_argument("--cycles", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    args = ap.parse_args()
    big_rows = 1_000_000 if args.quick else 10_000_000
    t0 = time.perf_counter()
    big = Setup(big_rows, 1)
    small = Setup(10_000, 2)
    # the same rows per key as the large table, so a 10-key right change touches as many left rows
    dense = Setup(10_000, 3, left_keys=max(10, KEYS * 10_000 // big_rows))
    print(f"set up in {time.perf_counter() - t0:.1f} s; build on {big_rows:,} left rows: "
          f"natural_join {big.build['natural_join']:.2f} s, aj {big.build['aj']:.2f} s "
          f"(on 10,000: {small.build['natural_join'] * 1e3:.1f} ms, {small.build['aj'] * 1e3:.1f} ms)")
    for phase in PHASES:
        for i in range(args.warmup + args.cycles):
            for s in ((small, big, dense) if phase != "left" else (small, big)):
                s.cycle(phase, record=i >= args.warmup)
    for phase in PHASES:
        for j in JOINS:
            if phase == "newest" and j != "aj":
                continue   # its prices change as in the right phase
            sm = statistics.median(small.stats[j, phase])
            bg = statistics.median(big.stats[j, phase])
            mods = (statistics.median(big.modified[j, phase]), statistics.median(small.modified[j, phase]))
            print(f"{j} {phase} update: big {bg * 1e3:.2f} ms, small {sm * 1e3:.2f} ms, ratio {bg / sm:.2f} "
                  f"(target <= 1.2; {big_rows:,} vs 10,000 left rows, median rows modified {mods[0]:,.0f} vs "
                  f"{mods[1]:,.0f})")
            if phase != "left":
                dn = statistics.median(dense.stats[j, phase])
                dm = statistics.median(dense.modified[j, phase])
                print(f"{j} {phase} update, the same rows per key ({dense.left_keys:,} keys on 10,000 rows): "
                      f"big {bg * 1e3:.2f} ms, small {dn * 1e3:.2f} ms, ratio {bg / dn:.2f} (target <= 1.2; "
                      f"median rows modified {mods[0]:,.0f} vs {dm:,.0f})")
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
