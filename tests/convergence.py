"""Randomized convergence harness: seeded random traffic on source tables, served by a real
`TickwireServer` over gRPC to real clients, whose state must equal the expected slice of the
source after every step.

- `Traffic` makes random valid updates: appends, prepends, inserts in the middle (shifting the
  rows after them when the key gap is too small), removes (scattered or a block, sometimes
  closing the gap with a shift, sometimes everything), modifies of column subsets, a mix of all
  of them, and blink traffic (every cycle replaces the rows).
- `Source` is a `ScriptedTable` fed by a `Traffic`; each cycle it queues `per_cycle` updates
  (producer coalescing) and, after the cycle, records the table's row keys and values at that
  step (the oracle: `history[step]`).
- `Derived` is a table made from sources (the agg-* configurations: `agg_by` with and without
  key columns, `preserve_empty`, `where -> agg_by -> sort` chains, every aggregation kind dealt
  among them), served by name like a source. After each cycle it is recorded as a source is and
  checked: an aggregation must equal `agg_by` recomputed from scratch on the source's rows at
  that step (tests/agg_reference.py: groups compared by key, floats within a relative
  tolerance) and each group must keep its row key for life; a sort must be its parent sorted.
  A derived table need not change every cycle: a client then holds the message of its last
  change (`last_change`), and pydeephaven-ticking gets one update per change.
- The join-* configurations serve tables with several parents made from one or two sources
  fed in the same cycles: diamonds (natural_join / exact_join of a table's where with its own
  agg_by or last_by), joins of a table with filtered copies of itself (where_in, where_not_in,
  natural_join match="last"), joins of joins (aj / raj of a natural_join against the second
  source, every rule, stamps with ties, nulls and NaN), merges of a table with its own sorts,
  cross joins and a multi_join. Each is checked after every cycle against the same operation
  recomputed in plain Python (tests/test_graph_joins.py's references) from its parents' rows at
  that step: values exactly, rows in the order the operation defines (the left table's for
  natural_join, aj and where_in, with its row keys; the parts one after the other for merge;
  left rows then right rows in row-key order for join; by key for multi_join, each key keeping
  its row key).
- The updateby-* configurations serve update_by tables: every cumulative and exponential kind and
  rolling windows back and ahead, per bucket of an integer key, a string key or none, over a
  random-traffic source (rows inserted, removed and moved between buckets); time-based ones over a
  source whose stamps never go back (`RingTraffic`: appends, the oldest rows dropped, ties and
  null stamps) and over a sort of a random-traffic source. Each is checked after every cycle
  against update_by recomputed from scratch from its parent's rows at that step
  (tests/update_by_reference.py, Deephaven's definitions; floats within a relative 1e-9).
- Clients: `TickwireView` (tickwire's `BarrageClient`: full or viewport, columns, reverse,
  `set_view` mid-stream), `GrowingView` (a late full subscriber whose snapshot arrives in pieces:
  a consistent subset of the rows until the last piece, then the table), `RecordingView` (for
  subscriptions that do not see every step: `min_update_interval_ms`, slow readers; every
  message it applies is recorded and compared with the source at that message's `last_seq`) and
  `TickingView` (pydeephaven-ticking's `listen`, full subscriptions).
- `Harness` steps the update graph by hand (`graph.run_cycle()`), waits for every view to reach
  the step (`last_seq == graph.step`, or a derived table's last change; for pydeephaven-ticking,
  which does not show sequence numbers, one update per cycle, or per change) and compares. Any
  difference raises `Divergence` (an AssertionError) whose message starts
  `replay: seed=S step=N config=C`.

The configurations the tests run are in `CONFIGS`; replay one with

    .venv/bin/python -m tests.convergence CONFIG SEED [STEPS]

Step counts scale with the environment variable TICKWIRE_SOAK (default 1).
"""
from __future__ import annotations

import bisect
import collections
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tests import agg_reference
from tests import update_by_reference as ubref
from tests.interop import close_dh_session
from tests.scripted import scripted_table
from tests.soak import scaled, soak_factor
from tests.test_graph_joins import key_of, ref_as_of, ref_cross_join, ref_natural_join, ref_where_in
from tickwire.clients.client import BarrageClient, Subscription
from tickwire.clock import ManualClock
from tickwire.protocol import barrage
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine
from tickwire.server.engine import updateby as ub
from tickwire.server.engine.graph import RowSet, RowSetShiftData, TableUpdate
from tickwire.server.engine.graph.aggspec import Agg
from tickwire.server.engine.graph.table_update import ROW_KEY

__all__ = ["SCHEMA", "NAMES", "Divergence", "Shape", "SHAPES", "Traffic", "Source", "Derived", "Harness",
           "TickwireView", "GrowingView", "RecordingView", "TickingView", "CONFIGS", "soak_factor", "scaled",
           "expected_slice", "compare", "random_shape", "run_config", "AGG_SCHEMA", "AGGS", "aggregate", "sort_of"]

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64()), ("d", pa.int32()),
                    ("ts", pa.timestamp("ns", "UTC")), ("f", pa.bool_())])
NAMES = tuple(SCHEMA.names)
WAIT_S = 30.0  # longest wait for a client to reach a step (the machine may be busy)


class Divergence(AssertionError):
    """A client whose state differs from the source (or that did not reach a step in time)."""


# -- shapes and the expected slice ------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """What a client asks for: the whole table (`viewport` None) or position ranges (inclusive,
    sorted, disjoint), counted from the end when `reverse`, of `columns` (None: all, else in
    schema order)."""

    name: str
    viewport: Optional[tuple[tuple[int, int], ...]] = None
    reverse: bool = False
    columns: Optional[tuple[str, ...]] = None

    @property
    def names(self) -> list[str]:
        return list(self.columns) if self.columns is not None else list(NAMES)

    @property
    def is_full(self) -> bool:
        return self.viewport is None

    def positions(self, n: int) -> Optional[np.ndarray]:
        """The table positions (ascending) this shape shows in a table of n rows; None: all."""
        if self.viewport is None:
            return None
        r = np.asarray(self.viewport, dtype=np.int64).reshape(-1, 2)
        idx = np.arange(n, dtype=np.int64)
        counted = (n - 1 - idx) if self.reverse else idx  # the position as the viewport counts it
        inside = ((counted[:, None] >= r[:, 0]) & (counted[:, None] <= r[:, 1])).any(axis=1)
        return np.flatnonzero(inside)

    def describe(self) -> str:
        parts = [self.name]
        if self.viewport is not None:
            parts.append(f"viewport={list(self.viewport)}" + (" reverse" if self.reverse else ""))
        if self.columns is not None:
            parts.append(f"columns={list(self.columns)}")
        return " ".join(parts)


SHAPES = {
    "full": Shape("full"),
    "full_cols": Shape("full_cols", columns=("b", "c", "ts")),
    "header": Shape("header", viewport=((0, 9),)),
    "floating": Shape("floating", viewport=((20, 44),), columns=("b", "d", "f")),
    "footer": Shape("footer", viewport=((0, 14),), reverse=True),
    "reverse_floating": Shape("reverse_floating", viewport=((10, 30),), reverse=True, columns=("b",)),
    "swiss": Shape("swiss", viewport=((0, 2), (7, 9), (30, 31), (100, 140))),
    "past_end": Shape("past_end", viewport=((5000, 5010),), columns=("a", "f")),
}


def expected_slice(full: pa.Table, shape: Shape) -> pa.Table:
    """The rows and columns of `full` (the table at one step, in row-key order) that a client of
    `shape` holds, in table order. Computed from positions here, not by the server's code."""
    t = full if shape.columns is None else full.select(list(shape.columns))
    pos = shape.positions(full.num_rows)
    return t if pos is None else t.take(pa.array(pos, type=pa.int64()))


def _same(x, y) -> bool:
    """Equal values, NaN equal to NaN (also inside lists)."""
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
        return True
    return bool(x == y) and type(x) is type(y) or (x is None and y is None)


def _first_difference(g: pa.Array, e: pa.Array) -> int:
    """The first row where `g` and `e` differ (NaN equals NaN), -1 when none."""
    if pa.types.is_floating(g.type) or pa.types.is_integer(g.type) or pa.types.is_boolean(g.type) or \
            pa.types.is_string(g.type) or pa.types.is_timestamp(g.type):
        nulls = pc.xor(pc.is_null(g), pc.is_null(e))
        values = pc.fill_null(pc.not_equal(g, e), False)
        if pa.types.is_floating(g.type):
            values = pc.and_(values, pc.invert(pc.fill_null(pc.and_(pc.is_nan(g), pc.is_nan(e)), False)))
        bad = np.flatnonzero(pc.or_(nulls, values).to_numpy(zero_copy_only=False))
        return int(bad[0]) if bad.size else -1
    return next((i for i, (x, y) in enumerate(zip(g.to_pylist(), e.to_pylist())) if not _same(x, y)), -1)


def compare(got: pa.Table, exp: pa.Table) -> Optional[str]:
    """None when equal (NaN equals NaN), else what differs (columns, row count, or the first
    differing value)."""
    if got.column_names != exp.column_names:
        return f"columns {got.column_names}, expected {exp.column_names}"
    if got.num_rows != exp.num_rows:
        return f"{got.num_rows} rows, expected {exp.num_rows}"
    if got.equals(exp):
        return None
    for name in exp.column_names:
        g, e = got.column(name).combine_chunks(), exp.column(name).combine_chunks()
        if g.type != e.type:
            return f"column {name!r} has type {g.type}, expected {e.type}"
        if not g.equals(e):
            i = _first_difference(g, e)
            if i >= 0:
                return f"column {name!r} row {i}: {g[i].as_py()!r}, expected {e[i].as_py()!r}"
    return None if got.schema.equals(exp.schema) else f"schema {got.schema}, expected {exp.schema}"


# -- random traffic ---------------------------------------------------------------------------------------

def _meta(f: pa.Field, key: str, default: float = 0.0) -> float:
    return float(f.metadata[key.encode()]) if f.metadata and key.encode() in f.metadata else default


def random_values(rng: np.random.Generator, n: int, schema: pa.Schema = SCHEMA) -> pa.Table:
    """n rows of random values (about 10% nulls) of `schema`. A field's metadata may ask for few
    distinct values (`levels`: integers `low`..`low`+levels-1, or as many strings; group keys)
    or, for floats, a fraction of `special` values (NaN, infinities, -0.0)."""
    cols = {}
    for f in schema:
        mask = rng.random(n) < 0.1
        t = f.type
        levels = int(_meta(f, "levels"))
        if levels and pa.types.is_integer(t):
            arr = pa.array(int(_meta(f, "low")) + rng.integers(0, levels, n), t, mask=mask)
        elif levels and pa.types.is_string(t):
            names = pa.array([f"{f.name}{i}" for i in range(levels)], t)
            arr = pc.if_else(pa.array(mask), pa.nulls(n, t), names.take(pa.array(rng.integers(0, levels, n))))
        elif pa.types.is_floating(t) and _meta(f, "special"):
            x = rng.normal(0, 1e3, n)
            odd = rng.random(n) < _meta(f, "special")
            x[odd] = rng.choice(np.array([np.nan, np.inf, -np.inf, -0.0, 0.0]), int(odd.sum()))
            arr = pa.array(x, t, mask=mask)
        elif pa.types.is_boolean(t):
            arr = pa.array(rng.random(n) < 0.5, t, mask=mask)
        elif pa.types.is_integer(t):
            lim = 10**12 if t.bit_width == 64 else 2**30
            arr = pa.array(rng.integers(-lim, lim, n), t, mask=mask)
        elif pa.types.is_floating(t):
            arr = pa.array(rng.normal(0, 1e3, n), t, mask=mask)
        elif pa.types.is_timestamp(t):
            base = np.datetime64("2024-01-01T00:00:00", "ns").astype(np.int64)
            arr = pa.array(base + rng.integers(0, 10**15, n), t, mask=mask)
        elif pa.types.is_string(t):
            prefixes = pa.array(["", "v", "x" * 120, "é-"])
            head = prefixes.take(pa.array(rng.integers(0, len(prefixes), n)))
            tail = pc.cast(pa.array(rng.integers(0, 10**9, n)), pa.string())
            arr = pc.if_else(pa.array(mask), pa.nulls(n, t), pc.binary_join_element_wise(head, tail, ""))
        else:
            raise TypeError(f"no random values for {t}")
        cols[f.name] = arr
    return pa.table(cols)


class ValuePool:
    """Random rows made once; each update takes a slice at a random offset (cheap), so values
    rarely repeat and a modified row almost always gets values different from its old ones."""

    def __init__(self, rng: np.random.Generator, schema: pa.Schema = SCHEMA, size: int = 50_000):
        self.rng = rng
        self.rows = random_values(rng, size, schema).combine_chunks()

    def values(self, keys: np.ndarray) -> pa.Table:
        """Values for row keys `keys`, with the row-key column first."""
        n = keys.size
        start = int(self.rng.integers(0, self.rows.num_rows - n + 1))
        part = self.rows.slice(start, n)
        return part.add_column(0, ROW_KEY, pa.array(keys, pa.int64()))


def shifts_between(kept: np.ndarray, moved: np.ndarray) -> RowSetShiftData:
    """The shifts taking the ascending keys `kept` to the ascending keys `moved` (same length)."""
    if kept.size == 0:
        return RowSetShiftData()
    delta = moved - kept
    if not delta.any():
        return RowSetShiftData()
    cut = np.flatnonzero(np.diff(delta) != 0) + 1
    first = np.concatenate(([0], cut))
    last = np.concatenate((cut - 1, [kept.size - 1]))
    return RowSetShiftData.build(kept[first], kept[last], delta[first])


KINDS = ("append", "prepend", "insert", "remove", "modify", "mixed")


class Traffic:
    """Random valid updates of one source table (see the module doc). `target` is the row count
    the traffic hovers around; `max_batch` the usual number of rows one update adds."""

    def __init__(self, rng: np.random.Generator, *, schema: pa.Schema = SCHEMA, target: int = 150,
                 max_batch: int = 25, blink: bool = False, mod_prob: float = 0.35,
                 mod_fracs: Sequence[float] = (0.02, 0.1, 0.5, 1.0)):
        self.rng = rng
        self.mod_prob = float(mod_prob)
        self.mod_fracs = tuple(mod_fracs)
        self.schema = schema
        self.target = int(target)
        self.max_batch = int(max_batch)
        self.blink = blink
        self.kinds: collections.Counter = collections.Counter()
        self.pool = ValuePool(rng, schema)

    def _batch(self) -> int:
        big = self.rng.random() < 0.05
        return int(self.rng.integers(1, (3 if big else 1) * self.max_batch + 1))

    def _kind(self, n: int) -> str:
        w = np.array([3.0, 1.5, 2.0, 2.0, 2.0, 2.0])  # KINDS order
        if n == 0:
            w[[3, 4]] = 0.0
        elif n > 2 * self.target:
            w[[0, 1, 2]] *= 0.2
            w[3] *= 4.0
        elif n < self.target // 2:
            w[[0, 1, 2]] *= 2.0
            w[3] *= 0.3
        return KINDS[int(self.rng.choice(len(KINDS), p=w / w.sum()))]

    def next(self, prev: np.ndarray) -> tuple[TableUpdate, pa.Table, np.ndarray]:
        """(update, values of its added and modified rows, row keys after it) from row keys `prev`."""
        rng = self.rng
        if self.blink:
            self.kinds["blink"] += 1
            k = int(rng.integers(0, self.max_batch + 1))
            added = np.arange(k, dtype=np.int64) + (int(rng.integers(0, 3)) if rng.random() < 0.3 else 0)
            update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev))
            update.validate(RowSet.from_keys(prev), RowSet.from_keys(added))
            return update, self.pool.values(added), added
        n = prev.size
        kind = self._kind(n)
        self.kinds[kind] += 1
        gone = np.zeros(n, dtype=bool)
        moved = prev.copy()  # new keys of the rows that stay (computed on all rows, then masked)
        added = np.empty(0, dtype=np.int64)
        if kind == "append":
            k = self._batch()
            start = int(prev[-1]) + 1 + int(rng.integers(0, 3)) if n else int(rng.integers(0, 5))
            added = start + np.cumsum(rng.integers(1, 3, k)) - 1
        elif kind == "prepend":
            k = self._batch()
            if n and prev[0] < k:  # no room below the first row: move every row up
                moved = prev + (k - int(prev[0]) + int(rng.integers(0, 4)))
            lo = int(moved[0]) if n else k + int(rng.integers(0, 4))
            added = np.sort(rng.choice(lo, k, replace=False)).astype(np.int64) if rng.random() < 0.5 \
                else np.arange(lo - k, lo, dtype=np.int64)
        elif kind == "insert":
            k = self._batch()
            p = int(rng.integers(0, n + 1))
            lo = int(prev[p - 1]) if p > 0 else -1
            hi = int(prev[p]) if p < n else lo + k + 1 + int(rng.integers(0, 4))
            if hi - lo - 1 < k:  # too small a gap: move the rows from position p on up
                delta = k - (hi - lo - 1) + int(rng.integers(0, 4))
                moved[p:] += delta
                hi += delta
            added = lo + 1 + np.sort(rng.choice(hi - lo - 1, k, replace=False)).astype(np.int64)
        elif kind == "remove":
            u = rng.random()
            if u < 0.03:
                gone[:] = True
            elif u < 0.5:
                a = int(rng.integers(0, n))
                b = min(n, a + int(rng.integers(1, max(2, n // 3) + 1)))
                gone[a:b] = True
                if rng.random() < 0.5:  # close the gap: the rows after the block move down
                    moved[b:] -= b - a
            else:
                gone = rng.random(n) < rng.choice([0.05, 0.2, 0.5])
            if rng.random() < 0.15 and not gone.all():  # compact everything that stays
                kept_n = int((~gone).sum())
                moved[~gone] = int(rng.integers(0, 3)) + np.arange(kept_n, dtype=np.int64) * int(rng.integers(1, 3))
        elif kind == "mixed":
            gone = rng.random(n) < rng.choice([0.0, 0.05, 0.3])
            kept_n = int((~gone).sum())
            if kept_n and rng.random() < 0.6:  # random order-preserving moves
                gaps = np.maximum(rng.integers(-1, 4, kept_n), 1)
                moved[~gone] = np.cumsum(gaps) - 1 + int(rng.integers(0, 20))
            top = int(moved[~gone].max()) + 300 if kept_n else 300
            free = np.setdiff1d(np.arange(top, dtype=np.int64), moved[~gone])
            added = np.sort(rng.choice(free, min(free.size, self._batch()), replace=False)).astype(np.int64)
        kept, new_kept = prev[~gone], moved[~gone]
        shifts = shifts_between(kept, new_kept)
        mod = np.empty(0, dtype=np.int64)
        if new_kept.size and (kind == "modify" or rng.random() < self.mod_prob):
            mod = new_kept[rng.random(new_kept.size) < rng.choice(self.mod_fracs)]
            if mod.size == 0:
                mod = new_kept[[int(rng.integers(0, new_kept.size))]]
        cols: set[str] = set()
        if mod.size:
            cols = {c for c in self.schema.names if rng.random() < 0.4} or {str(rng.choice(self.schema.names))}
        update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev[gone]),
                             modified=RowSet.from_keys(mod), shifted=shifts, modified_columns=cols)
        new_keys = np.union1d(new_kept, added).astype(np.int64)
        update.validate(RowSet.from_keys(prev), RowSet.from_keys(new_keys))
        return update, self.pool.values(np.union1d(added, mod).astype(np.int64)), new_keys


class Source:
    """A scripted source table, its traffic, and its contents at every recorded step."""

    def __init__(self, engine: Engine, name: str, rng: np.random.Generator, *, per_cycle: int = 1,
                 blink: bool = False, schema: pa.Schema = SCHEMA, **traffic):
        self.name = name
        self.engine = engine
        # the fields' metadata shapes the random values (random_values), not the table
        self.table = scripted_table(engine, name, pa.schema([f.remove_metadata() for f in schema]))
        if blink:
            self.table.attributes["BlinkTable"] = True
        self.blink = blink
        self.per_cycle = int(per_cycle)
        self.traffic = Traffic(rng, schema=schema, blink=blink, **traffic)
        self.keys = np.empty(0, dtype=np.int64)
        self.history: dict[int, tuple[np.ndarray, pa.Table]] = {}

    def feed(self, count: Optional[int] = None) -> None:
        """Queues `count` (default `per_cycle`) random updates for the next cycle."""
        for _ in range(self.per_cycle if count is None else count):
            update, values, self.keys = self.traffic.next(self.keys)
            self.engine.write(self.table, (update, values), wait=False)

    def record(self, step: int) -> None:
        keys = self.table.rowset.keys()
        if not np.array_equal(keys, self.keys):
            raise AssertionError(f"source {self.name!r} at step {step}: the table's row keys are not the traffic's")
        self.history[step] = (keys, self.table.gather())

    def at(self, step: int) -> tuple[np.ndarray, pa.Table]:
        try:
            return self.history[step]
        except KeyError:
            raise LookupError(f"no recorded state of {self.name!r} at step {step} "
                             f"(recorded: {min(self.history, default=None)}..{max(self.history, default=None)})") \
                from None

    def prune(self, keep_from: int) -> None:
        for s in [s for s in self.history if s < keep_from]:
            del self.history[s]

    @property
    def schema(self) -> pa.Schema:
        return self.table.schema

    def last_change(self, step: int) -> int:
        """The last step at or before `step` that changed the table (a source changes every cycle)."""
        return step

    def changes_between(self, first: int, last: int) -> int:
        """How many cycles after step `first` up to step `last` changed the table."""
        return last - first


Check = Callable[[int, np.ndarray, pa.Table], Optional[str]]


class Derived(Source):
    """A table derived from sources (an aggregation, a sort of one, ...), served by name to views
    as a source is. After each cycle its row keys and values are recorded as a source's, and
    `check(step, keys, values)` compares them with a recomputation from scratch on the sources'
    states at that step (a message, or None when right). It need not change every cycle: the
    steps that changed it (its listener hears them) tell which message a client holds at a step."""

    def __init__(self, table, made_at: int, check: Optional[Check] = None):
        self.name = table.name
        self.table = table
        self.check = check
        self.history = {}
        self.changed: list[int] = [made_at]  # its first state (made from the sources at that step), then its changes
        self.stats: collections.Counter = collections.Counter()  # what the runs went through (for the tests)
        table.add_listener(lambda _t, _u, step: self.changed.append(step))

    def feed(self, count: Optional[int] = None) -> None:
        raise TypeError(f"{self.name!r} is derived: it is fed by its sources")

    def record(self, step: int) -> None:
        self.history[step] = (self.table.rowset.keys(), self.table.gather())
        self.stats["empty_steps" if self.table.size == 0 else "steps_with_rows"] += 1

    def last_change(self, step: int) -> int:
        i = bisect.bisect_right(self.changed, step)
        return self.changed[i - 1] if i else -1

    def changes_between(self, first: int, last: int) -> int:
        return max(0, bisect.bisect_right(self.changed, last) - max(1, bisect.bisect_right(self.changed, first)))


# -- clients ----------------------------------------------------------------------------------------------

class ExactColumnsSubscription(Subscription):
    """tickwire's Subscription asking for exactly its columns. The stock client always adds the
    first column to a column subset (a workaround for Deephaven 42.x, which batches by the first
    column) and hides it, so the server would never see a subset without column 0."""

    def _request_bytes(self) -> bytes:
        if self._columns is None or self.snapshot_only or self._names is None:
            return super()._request_bytes()
        cols = np.array(sorted({self._names.index(c) for c in self._columns}), dtype=np.int64)
        vp = None if self.viewport is None else np.array(self.viewport, dtype=np.int64).reshape(-1, 2)
        return barrage.wrap(barrage.SubscriptionRequest(
            ticket=self.ticket, columns=cols, viewport=vp, reverse_viewport=self.reverse,
            options=barrage.SubscriptionOptions(min_update_interval_ms=self.interval)))


def subscribe(client: BarrageClient, table: str, shape: Shape, *, exact_columns: bool = False, **kw) -> Subscription:
    """A subscription of `shape` (through the client's own subscribe, or asking for exactly the
    shape's columns)."""
    vp = None if shape.viewport is None else list(shape.viewport)
    if not exact_columns or shape.columns is None:
        return client.subscribe(table, columns=shape.columns, viewport=vp, reverse=shape.reverse, **kw)
    sub = ExactColumnsSubscription(client, table, columns=shape.columns, viewport=vp, reverse=shape.reverse, **kw)
    client._subs.append(sub)  # closed with the client, as the client's own subscriptions are
    return sub


def read_state(sub) -> tuple[int, pa.Table, int, np.ndarray]:
    """(last_seq, table, table_size, held row keys) of a tickwire subscription, read with no
    message applied in between (retried if one was)."""
    for _ in range(1000):
        n0 = sub.update_count
        state = sub.state
        keys, size, seq = np.array(state.keys, dtype=np.int64), state.table_size, sub.last_seq
        table = sub.table  # under the subscription's lock: waits for a message being applied
        if sub.update_count == n0 and sub.state is state:
            return seq, table, size, keys
    raise RuntimeError("the subscription kept changing while it was read")


class View:
    """One client subscription checked by the harness."""

    kind = "view"

    def __init__(self, harness: "Harness", source: Source, shape: Shape):
        self.harness = harness
        self.source = source
        self.shape = shape
        self.checks = 0

    def label(self) -> str:
        exact = " exact-columns" if getattr(self, "exact_columns", False) and self.shape.columns is not None else ""
        return f"{self.kind}[{self.source.name}:{self.shape.describe()}{exact}]"

    def fail(self, step: int, what: str) -> Divergence:
        return self.harness.divergence(step, f"client={self.label()}: {what}")

    def verify(self, step: int) -> None:
        raise NotImplementedError

    def finish(self, step: int, timeout: float) -> None:
        """The last check of a run: the view must hold the source's final state."""
        self.verify(step)

    def oldest_needed(self) -> Optional[int]:
        """The oldest step whose recorded state this view may still need (None: only the current)."""
        return None

    def close(self) -> None:
        pass


class TickwireView(View):
    """A subscription of tickwire's BarrageClient that reaches every step. `find_server` also
    finds the server's side of it (`server_sub`, for tests that look at what the server did)."""

    kind = "tickwire"

    def __init__(self, harness, source, shape, *, client: Optional[BarrageClient] = None,
                 track_snapshots: bool = False, interval_ms: int = 0, find_server: bool = False,
                 exact_columns: bool = False):
        super().__init__(harness, source, shape)
        self.exact_columns = exact_columns
        self.client = client or harness.client
        self.snapshots = 0
        self.want_snapshots = 0
        self._lock = threading.Lock()
        self.server_sub = None
        before = harness.server.registry.subscriptions if find_server else None
        self.sub = subscribe(self.client, source.name, shape, exact_columns=exact_columns,
                             on_update=self._callback(track_snapshots), min_update_interval_ms=interval_ms)
        if find_server:
            self.server_sub = self._find_server_sub(before)

    def _callback(self, track_snapshots: bool):
        return self._count if track_snapshots else None

    def _find_server_sub(self, before: list):
        registry = self.harness.server.registry
        end = time.monotonic() + WAIT_S
        while True:
            new = [s for s in registry.subscriptions
                   if s.publisher.table is self.source.table and all(s is not b for b in before)]
            if new:
                return new[0]
            if time.monotonic() > end:
                raise self.fail(self.harness.graph.step, "the server never registered the subscription")
            time.sleep(0.002)

    def _count(self, update) -> None:
        if update.is_snapshot:
            with self._lock:
                self.snapshots += 1

    def change(self, shape: Shape) -> None:
        """A new viewport / columns / direction on the running subscription."""
        if self.shape.is_full != shape.is_full:
            raise ValueError("a view change keeps the subscription full or viewport")
        self.want_snapshots = max(self.want_snapshots, 1) + 1  # the first snapshot, then one per change
        if shape.is_full:
            self.sub.set_view(columns=shape.names)
        else:
            self.sub.set_view(viewport=list(shape.viewport), columns=shape.names, reverse=shape.reverse)
        self.shape = shape

    def _reached(self, step: int) -> bool:
        """Holds the message of the table's last change at or before `step` (a source's: `step`)."""
        with self._lock:
            snaps = self.snapshots
        return self.sub.update_count > 0 and self.sub.last_seq >= self.source.last_change(step) and \
            snaps >= self.want_snapshots

    def _wait(self, step: int, timeout: float, pred=None) -> None:
        sub = self.sub
        if not sub.wait_for(pred or (lambda s: self._reached(step)), timeout):
            raise self.fail(step, f"did not reach step {step} within {timeout:.0f} s (last_seq={sub.last_seq}, "
                                  f"snapshots={self.snapshots}/{self.want_snapshots}, error={sub.error})")

    def verify(self, step: int, *, expected_step: Optional[int] = None, timeout: float = WAIT_S) -> None:
        self._wait(step, timeout)
        seq, got, size, held = read_state(self.sub)
        lo = self.source.last_change(step)
        if not lo <= seq <= step:  # a table that did not change at `step` sent nothing for it
            raise self.fail(step, f"last_seq {seq}, expected {step}" if lo == step else
                            f"last_seq {seq}, expected {lo}..{step} (the table's last change was at step {lo})")
        keys, full = self.source.at(step if expected_step is None else expected_step)
        self.compare_state(step, got, size, held, keys, full)

    def compare_state(self, step, got: pa.Table, table_size: int, held_keys, keys, full: pa.Table,
                      shape: Optional[Shape] = None) -> None:
        shape = shape or self.shape
        what = compare(got, expected_slice(full, shape))
        if what is not None:
            raise self.fail(step, what)
        if table_size != full.num_rows:
            raise self.fail(step, f"table_size {table_size}, expected {full.num_rows}")
        if shape.is_full and not np.array_equal(held_keys, keys):
            m = min(held_keys.size, keys.size)
            bad = np.flatnonzero(held_keys[:m] != keys[:m])
            raise self.fail(step, f"row keys differ ({held_keys.size} held, {keys.size} in the table; first "
                                  f"difference at position {int(bad[0]) if bad.size else m})")
        self.checks += 1

    def close(self) -> None:
        self.sub.close()


class GrowingView(TickwireView):
    """A full subscription that joins a large table, whose snapshot the server sends in pieces
    across cycles. While the server says it is still growing, the client must hold a subset of
    the table's rows with their values at the step (and the table's size); once the server has
    sent the last piece, the whole table exactly, as any full subscription."""

    kind = "tickwire-growing"

    def __init__(self, harness, source, shape, *, limit: int = 400, exact_columns: bool = False):
        super().__init__(harness, source, shape, find_server=True, exact_columns=exact_columns)
        self.partial_steps = 0
        self.limit = limit
        self.grown = False

    def verify(self, step: int, *, expected_step: Optional[int] = None, timeout: float = WAIT_S) -> None:
        keys, full = self.source.at(step if expected_step is None else expected_step)
        self._wait(step, timeout, lambda s: s.last_seq >= step)
        if not self.grown and self.server_sub.growing:
            seq, got, size, held = read_state(self.sub)
            if seq != step:
                raise self.fail(step, f"last_seq {seq}, expected {step}")
            self._check_partial(step, got, size, held, keys, full)
            return
        self.grown = True
        if not self.sub.wait_for(lambda s: s.last_seq >= step and len(s.state) >= keys.size, timeout):
            raise self.fail(step, f"holds {len(self.sub.state)} of {keys.size} rows after the last piece was sent")
        super().verify(step, expected_step=expected_step, timeout=timeout)

    def _check_partial(self, step, got, size, held, keys, full) -> None:
        if size != full.num_rows:
            raise self.fail(step, f"partial snapshot: table_size {size}, expected {full.num_rows}")
        pos = np.searchsorted(keys, held)
        inside = pos < keys.size
        inside[inside] = keys[pos[inside]] == held[inside]
        if not inside.all():
            raise self.fail(step, f"partial snapshot holds rows the table does not have: "
                                  f"{held[~inside][:5].tolist()}")
        exp = full.select(self.shape.names).take(pa.array(pos, type=pa.int64()))
        what = compare(got, exp)
        if what is not None:
            raise self.fail(step, f"partial snapshot ({held.size} of {keys.size} rows): {what}")
        self.partial_steps += 1
        if self.partial_steps > self.limit:
            raise self.fail(step, f"the snapshot is still incomplete after {self.limit} steps")
        self.checks += 1


@dataclass
class Record:
    first_seq: int
    last_seq: int
    is_snapshot: bool
    table: pa.Table
    table_size: int
    keys: Optional[np.ndarray]
    shape: Shape


class RecordingView(TickwireView):
    """A tickwire subscription that need not see every step: `min_update_interval_ms`, or a slow
    reader (while `gate` is clear its update callback waits, so the client stops reading and the
    server must coalesce what it misses). Every message it applies is recorded with the state it
    produced; `verify` compares each with the source at the message's last_seq and checks that
    the messages' sequence ranges follow one another without a gap or an overlap."""

    kind = "recording"

    def __init__(self, harness, source, shape, *, interval_ms: int = 0, client=None,
                 gate: Optional[threading.Event] = None, find_server: bool = False, exact_columns: bool = False):
        self._ready = threading.Event()
        self._closing = False
        self.gate = gate
        self.records: collections.deque[Record] = collections.deque()
        self.messages = 0
        self.spans: list[int] = []
        self.next_first: Optional[int] = None
        self.last_checked: Optional[int] = None
        self.recorded_seq: Optional[int] = None
        self._arrived = threading.Condition()
        self.msg_shape = shape  # the shape of the messages being received (changes with each snapshot)
        self.pending_shapes: collections.deque[Shape] = collections.deque()
        super().__init__(harness, source, shape, client=client, interval_ms=interval_ms, find_server=find_server,
                         exact_columns=exact_columns)
        self._ready.set()

    def _callback(self, track_snapshots: bool):
        return self._record

    def _record(self, update) -> None:
        self._ready.wait()  # the first message may arrive before subscribe() has returned
        state = self.sub.state  # this is the thread that applies messages: the state is still this one
        with self._arrived:
            if update.is_snapshot and self.recorded_seq is not None:  # the answer to a view change
                if not self.pending_shapes:
                    self.records.append(None)  # reported by verify: a snapshot nobody asked for
                    self._arrived.notify_all()
                    return
                self.msg_shape = self.pending_shapes.popleft()
            shape = self.msg_shape
        # not sub.table: that shows the columns of the latest set_view, which may be newer than this message
        table = state.table(shape.names)
        rec = Record(update.first_seq, update.last_seq, update.is_snapshot, table, state.table_size,
                     np.array(state.keys, dtype=np.int64) if shape.is_full else None, shape)
        with self._arrived:
            self.records.append(rec)
            self.recorded_seq = rec.last_seq
            self._arrived.notify_all()
        while self.gate is not None and not self._closing and not self.gate.wait(0.05):
            pass

    def oldest_needed(self) -> Optional[int]:
        return self.last_checked if self.last_checked is not None else 0

    @property
    def changing(self) -> bool:
        """A view change not answered yet."""
        with self._arrived:
            return bool(self.pending_shapes)

    def change(self, shape: Shape) -> None:
        """A view change; its snapshot tells which messages are in the new shape. One at a time."""
        with self._arrived:
            if self.pending_shapes:
                raise ValueError("the previous view change is not answered yet")
            self.pending_shapes.append(shape)
        super().change(shape)

    def _wait_recorded(self, pred, timeout: float) -> bool:
        # not sub.wait_for: that waits for the update callbacks, which a stalled reader is inside
        end = time.monotonic() + timeout
        with self._arrived:
            while not pred():
                left = end - time.monotonic()
                if left <= 0 or self.sub.error is not None or self.sub.closed:
                    return pred()
                self._arrived.wait(min(left, 0.5))
            return True

    def verify(self, step: int, *, final: bool = False, timeout: float = WAIT_S) -> None:
        if not self._wait_recorded(lambda: self.recorded_seq is not None, timeout):
            raise self.fail(step, f"no snapshot within {timeout:.0f} s (error={self.sub.error})")
        if final and not self._wait_recorded(lambda: self.recorded_seq >= step, timeout):
            raise self.fail(step, f"did not catch up with step {step} within {timeout:.0f} s "
                                  f"(last message at seq {self.recorded_seq}, error={self.sub.error})")
        if self.sub.error is not None:
            raise self.fail(step, f"subscription failed: {self.sub.error}")
        while True:
            with self._arrived:
                if not self.records:
                    break
                rec = self.records.popleft()
            if rec is None:
                raise self.fail(step, "a snapshot arrived that no view change asked for")
            self._check(rec, step)
        if final and self.last_checked != step:
            raise self.fail(step, f"last message at seq {self.last_checked}, expected {step}")

    def finish(self, step: int, timeout: float) -> None:
        self.verify(step, final=True, timeout=timeout)

    def _check(self, rec: Record, step: int) -> None:
        self.messages += 1
        where = f"message {self.messages} (seq {rec.first_seq}..{rec.last_seq})"
        if rec.last_seq > step:
            raise self.fail(step, f"{where} is ahead of the graph")
        if not rec.is_snapshot:
            if self.next_first is None or rec.first_seq != self.next_first:
                raise self.fail(step, f"{where} does not follow the previous message (expected first_seq "
                                      f"{self.next_first})")
            self.spans.append(rec.last_seq - rec.first_seq + 1)
        self.next_first = rec.last_seq + 1
        keys, full = self.source.at(rec.last_seq)
        try:
            self.compare_state(rec.last_seq, rec.table, rec.table_size, rec.keys, keys, full, rec.shape)
        except Divergence as exc:
            raise self.fail(rec.last_seq, f"{where}: {exc.detail}") from None
        self.last_checked = rec.last_seq

    def close(self) -> None:
        self._closing = True
        super().close()


def ticking_table(update, schema: pa.Schema = SCHEMA) -> pa.Table:
    """The whole client-side table after a pydeephaven-ticking update (`schema`: the table's)."""
    cur = update.update.current
    names = cur.schema.names if hasattr(cur.schema, "names") else [f.name for f in cur.schema]
    rows = cur.get_row_sequence()
    if rows.empty:  # get_chunk fails on an empty row sequence (IndexError in pydeephaven-ticking 42.7)
        return pa.table({n: pa.array([], schema.field(n).type) for n in names})
    return pa.table({n: cur.get_column_by_name(n, True).get_chunk(rows) for n in names})


class TickingView(View):
    """A full subscription of pydeephaven-ticking (Deephaven's C++ Barrage client). It shows no
    sequence numbers: it is at step s once it has applied 1 + (s - s0) updates (a snapshot at the
    step s0 it subscribed at, then one update per cycle: every cycle changes every source; a
    derived table, one per cycle that changed it)."""

    kind = "pydeephaven-ticking"

    def __init__(self, harness, source):
        from pydeephaven_ticking.table_listener import listen

        super().__init__(harness, source, SHAPES["full"])
        self.cond = threading.Condition()
        self.count = 0
        self.latest: Optional[pa.Table] = None
        self.errors: list[BaseException] = []
        self.start_step = harness.graph.step
        self.handle = listen(harness.session().open_table(source.name), self._on_update, self._on_error)
        self.handle.start()

    def _on_update(self, update) -> None:
        t = ticking_table(update, self.source.schema)
        with self.cond:
            self.latest = t
            self.count += 1
            self.cond.notify_all()

    def _on_error(self, error) -> None:
        with self.cond:
            self.errors.append(error)
            self.cond.notify_all()

    def verify(self, step: int, *, expected_step: Optional[int] = None, timeout: float = WAIT_S) -> None:
        want = 1 + self.source.changes_between(self.start_step, step)
        with self.cond:
            ok = self.cond.wait_for(lambda: self.count >= want or self.errors, timeout)
            count, latest, errors = self.count, self.latest, list(self.errors)
        if errors:
            raise self.fail(step, f"listener error: {errors[0]!r}")
        if not ok:
            raise self.fail(step, f"did not reach step {step} within {timeout:.0f} s ({count} of {want} updates)")
        if count != want:
            raise self.fail(step, f"{count} updates, expected {want}")
        _keys, full = self.source.at(step if expected_step is None else expected_step)
        what = compare(latest, full)
        if what is not None:
            raise self.fail(step, what)
        self.checks += 1

    def close(self) -> None:
        self.handle.stop()


# -- the harness ------------------------------------------------------------------------------------------

class Harness:
    """One configuration run: an update graph stepped by hand, its sources, a server on a free
    port, and the views checked after every step."""

    def __init__(self, config: str, seed: int, *, tick_s: Optional[float] = None):
        self.config = config
        self.seed = int(seed)
        self.rng = np.random.default_rng([self.seed, 1])  # the harness's own choices (views, changes)
        # the publishers' update intervals count cycles: the clock moves only when the harness
        # runs one (by `tick_s`; start and tick are binary fractions, so the sums are exact)
        self.clock = ManualClock(start=1024.0) if tick_s is not None else None
        self.graph = Engine(interval_ms=3_600_000, clock=self.clock)  # never started: the harness runs the cycles
        self.sources: dict[str, Source] = {}
        self.derived: dict[str, Derived] = {}  # tables made from the sources, checked and recorded after them
        self.views: list[View] = []
        self.server: Optional[TickwireServer] = None
        self.client: Optional[BarrageClient] = None
        self._session = None
        self._clients: list[BarrageClient] = []
        self.steps = 0  # cycles run after start()
        self.checks = 0
        self.tick_s = tick_s
        self.before_cycle: list[Callable[["Harness"], None]] = []
        self.stats: dict = {}
        self.planned: Optional[int] = None  # the steps asked of the run (for the replay line)

    # set-up
    def source(self, name: str, **kw) -> Source:
        src = Source(self.graph, name, np.random.default_rng([self.seed, 100 + len(self.sources)]), **kw)
        self.sources[name] = src
        return src

    def derive(self, table, check: Optional[Check] = None) -> Derived:
        """Records (and, with `check`, checks) a table derived from the sources after every cycle,
        from now on; views of it are made as of a source."""
        d = Derived(table, self.graph.step, check)
        self.derived[table.name] = d
        return d

    def warm(self, cycles: int = 3) -> None:
        """Cycles before anyone subscribes."""
        for _ in range(cycles):
            self._cycle()

    def start(self) -> "Harness":
        self._record(self.graph.step)
        self.server = TickwireServer(self.graph, port=0, start_engine=False).start()
        self.client = self.new_client()
        return self

    def new_client(self) -> BarrageClient:
        """Another connection (its own gRPC channel)."""
        c = BarrageClient(self.server.target)
        self._clients.append(c)
        return c

    def session(self):
        if self._session is None:
            from pydeephaven import Session
            self._session = Session(host=self.server.host, port=self.server.port)
        return self._session

    def add(self, view: View) -> View:
        self.views.append(view)
        return view

    def remove(self, view: View) -> None:
        self.views.remove(view)
        view.close()

    def close(self) -> None:
        views, self.views = self.views, []
        for v in views:
            try:
                v.close()
            except Exception:  # noqa: BLE001 - closing everything else matters more
                pass
        if self._session is not None:
            close_dh_session(self._session)
        for c in self._clients:
            c.close()
        if self.server is not None:
            self.server.stop()

    def __enter__(self) -> "Harness":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # running
    def divergence(self, step: int, detail: str) -> Divergence:
        steps = self.planned if self.planned is not None else "STEPS"
        exc = Divergence(f"replay: seed={self.seed} step={step} config={self.config}\n  {detail}\n"
                         f"  (rerun: .venv/bin/python -m tests.convergence {self.config} {self.seed} {steps})")
        exc.detail = detail
        return exc

    def _cycle(self) -> int:
        for src in self.sources.values():
            src.feed()
        with self.graph.reading():  # a message built in the background meanwhile sees the new time with this cycle
            if self.clock is not None and self.tick_s is not None:
                self.clock.advance(self.tick_s)
            self.graph.run_cycle()
            step = self.graph.step
        if self.graph.errors:
            raise self.divergence(step, f"the update graph reported {self.graph.errors[-1]!r}")
        self._record(step)
        return step

    def _record(self, step: int) -> None:
        for src in self.sources.values():
            src.record(step)
        for d in self.derived.values():  # after the sources (and parents): the checks recompute from their states
            d.record(step)
            what = d.check(step, *d.at(step)) if d.check is not None else None
            if what is not None:
                raise self.divergence(step, f"table {d.name!r}: {what}")

    def verify(self, step: Optional[int] = None) -> None:
        step = self.graph.step if step is None else step
        for v in list(self.views):
            v.verify(step)
            self.checks += 1
        needed = [n for n in (v.oldest_needed() for v in self.views) if n is not None]
        keep = min(needed + [step - 2])
        for src in [*self.sources.values(), *self.derived.values()]:
            src.prune(keep)

    def step(self) -> int:
        for fn in self.before_cycle:
            fn(self)
        step = self._cycle()
        self.steps += 1
        self.verify(step)
        return step

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.step()

    def finish(self, timeout: float = 120.0) -> None:
        """One more cycle after every pending interval has passed; then every view, including
        those that do not see every step, must hold the source's final state. A view change still
        in flight is answered first: its snapshot, queued after the clock's jump, would restart
        that subscriber's interval, and no later cycle would send what the last one held back."""
        def answering(v) -> bool:  # a change the client will read (a closed gate reads nothing)
            gate = getattr(v, "gate", None)
            return getattr(v, "changing", False) and (gate is None or gate.is_set())

        end = time.monotonic() + timeout
        while any(answering(v) for v in self.views) and time.monotonic() < end:
            time.sleep(0.01)
        if self.clock is not None:
            self.clock.advance(64.0)
        step = self._cycle()
        self.steps += 1
        for v in list(self.views):
            v.finish(step, timeout)
            self.checks += 1

    def summary(self) -> dict:
        kinds = collections.Counter()
        for src in self.sources.values():
            kinds.update(src.traffic.kinds)
        tables = {d.name: {"changes": len(d.changed) - 1, **d.stats} for d in self.derived.values()}
        return {"config": self.config, "seed": self.seed, "steps": self.steps, "checks": self.checks,
                "updates": dict(kinds), **({"tables": tables} if tables else {}), **self.stats}


# -- configurations ---------------------------------------------------------------------------------------

def random_shape(rng: np.random.Generator, *, full: bool = False, size_hint: int = 150) -> Shape:
    """A random shape: full (when `full`) or a random viewport of one or several disjoint ranges,
    forward or reverse; all columns or a random subset (in schema order)."""
    cols = None
    if rng.random() < 0.5:
        cols = tuple(n for n in NAMES if rng.random() < 0.5) or (str(rng.choice(NAMES)),)
    if full:
        return Shape("full*", columns=cols)
    nranges = int(rng.choice([1, 1, 2, 3, 5]))
    top = int(rng.integers(2 * nranges + 5, 2 * size_hint + 10))
    bounds = np.sort(rng.choice(top, 2 * nranges, replace=False))
    ranges = tuple((int(a), int(b)) for a, b in bounds.reshape(-1, 2))
    if rng.random() < 0.15:
        ranges = ((0, int(rng.integers(0, 3))),)  # a tiny header (or footer)
    return Shape("vp*", viewport=ranges, reverse=bool(rng.random() < 0.4), columns=cols)


ALL_SHAPES = ("full", "full_cols", "header", "floating", "footer", "reverse_floating", "swiss", "past_end")


EXACT = {"full_cols", "reverse_floating"}  # column subsets asked for exactly (the others through the client's own)


def _add_shapes(h: Harness, src: Source, names: Sequence[str]) -> list[View]:
    return [h.add(TickwireView(h, src, SHAPES[n], exact_columns=n in EXACT)) for n in names]


def config_shapes(h: Harness, steps: int, *, per_cycle: int = 1) -> None:
    """Every client shape on one table: full, full with columns, header, floating, footer
    (reverse), reverse floating, swiss, past the end; `per_cycle` updates per cycle."""
    src = h.source("t", per_cycle=per_cycle, target=150 if per_cycle == 1 else 250)
    h.warm(3)
    h.start()
    _add_shapes(h, src, ALL_SHAPES)
    h.verify()
    h.run(steps)
    h.finish()


def config_long_run(h: Harness, steps: int) -> None:
    """One long sequence whose target size drifts (empty, tiny, medium, large) every 300 steps, to
    a full and a footer (reverse viewport) client."""
    src = h.source("t", per_cycle=1, target=150)
    h.warm(3)
    h.start()
    _add_shapes(h, src, ("full", "footer"))
    h.verify()
    targets = (0, 20, 150, 600, 40)

    def drift(h: Harness) -> None:
        if h.steps % 300 == 299:
            src.traffic.target = int(h.rng.choice(targets))

    h.before_cycle.append(drift)
    h.run(steps)
    h.finish()


def config_view_changes(h: Harness, steps: int) -> None:
    """Viewport subscriptions that change viewport, columns and direction mid-stream, a full
    subscription that changes columns, and clients that come and go. A change is made either
    after the last step was delivered (and checked before the next cycle) or just before a cycle
    (the new snapshot races the cycle's update)."""
    src = h.source("t", per_cycle=1, target=150)
    h.warm(3)
    h.start()
    rng = h.rng
    movers = [h.add(TickwireView(h, src, SHAPES[n], track_snapshots=True, exact_columns=n == "swiss"))
              for n in ("header", "swiss", "footer")]
    full = h.add(TickwireView(h, src, SHAPES["full"], track_snapshots=True, exact_columns=True))
    h.verify()
    churn: list[View] = []
    h.stats["view_changes"] = 0

    def change(h: Harness) -> None:
        for v in movers:
            if rng.random() < 0.25:
                v.change(random_shape(rng, size_hint=src.traffic.target))
                h.stats["view_changes"] += 1
                if rng.random() < 0.5:
                    v.verify(h.graph.step)  # answered before the next cycle
        if rng.random() < 0.08:
            full.change(random_shape(rng, full=True))
            h.stats["view_changes"] += 1
        if rng.random() < 0.1:  # a late joiner, subscribing just before a cycle
            churn.append(h.add(TickwireView(h, src, random_shape(rng, full=bool(rng.random() < 0.3)),
                                            exact_columns=bool(rng.random() < 0.5))))
        if churn and rng.random() < 0.08:
            h.remove(churn.pop(int(rng.integers(0, len(churn)))))
        while len(churn) > 3:
            h.remove(churn.pop(0))

    h.before_cycle.append(change)
    h.run(steps)
    h.finish()


def config_blink(h: Harness, steps: int, *, per_cycle: int = 1, ticking: bool = True) -> None:
    """Blink traffic (every cycle replaces the rows) to tickwire full and (forward) viewport
    clients and to pydeephaven-ticking."""
    src = h.source("b", per_cycle=per_cycle, blink=True, max_batch=60)
    h.warm(2)
    h.start()
    _add_shapes(h, src, ("full", "full_cols", "header", "floating", "swiss"))
    if ticking:
        h.add(TickingView(h, src))
    h.verify()
    h.run(steps)
    h.finish()


def config_ticking(h: Harness, steps: int) -> None:
    """pydeephaven-ticking full subscriptions to two tables, one updated once per cycle and one
    ten times per cycle (producer coalescing), next to tickwire full subscriptions."""
    one = h.source("t1", per_cycle=1, target=150)
    ten = h.source("t10", per_cycle=10, target=250)
    h.warm(3)
    h.start()
    for src in (one, ten):
        h.add(TickingView(h, src))
        h.add(TickwireView(h, src, SHAPES["full"]))
    h.verify()
    h.run(steps)
    h.finish()


INTERVAL_MS = 78  # with a clock tick of 1/128 s: 10 ticks (78.125 ms) reach it, 9 do not
INTERVAL_TICK_S = 1.0 / 128


def config_interval(h: Harness, steps: int) -> None:
    """Subscription coalescing: min_update_interval_ms with a clock that moves 1/128 s per cycle,
    so that exactly ten cycles fold into each message; two of these clients also change their
    view now and then (so a view change meets up to ten cycles of pending changes); a client at
    the default interval on the same table gets every step."""
    src = h.source("t", per_cycle=1, target=150)
    h.warm(3)
    h.start()
    h.add(TickwireView(h, src, SHAPES["header"]))
    rec = [h.add(RecordingView(h, src, SHAPES[n], interval_ms=INTERVAL_MS, exact_columns=n in EXACT))
           for n in ("full", "full_cols", "header", "footer", "swiss")]
    changers = [rec[1], rec[2]]
    h.stats["view_changes"] = 0

    def change(h: Harness) -> None:
        for v in changers:
            if not v.changing and h.rng.random() < 0.04:
                v.change(random_shape(h.rng, full=v.shape.is_full, size_hint=src.traffic.target))
                h.stats["view_changes"] += 1

    h.before_cycle.append(change)
    h.verify()
    h.run(steps)
    h.finish()
    steady = [v for v in rec if v not in changers]
    h.stats["cycles_per_message"] = {v.label(): sorted(collections.Counter(v.spans[:-1]).items()) for v in steady}
    for v in steady:
        odd = [s for s in v.spans[:-1] if s != 10]
        if odd:
            raise h.divergence(h.graph.step, f"client={v.label()}: messages spanning {odd[:10]} cycles, "
                                             f"expected 10 (min_update_interval_ms={INTERVAL_MS})")


def config_slow_reader(h: Harness, steps: int) -> None:
    """Clients that stop reading for 400 of every 450 steps on a table with large updates (enough
    to fill gRPC's buffers, after which the server must coalesce what they miss: its outbox
    holds at most two messages), then read again and must converge; the viewport one asks for a
    new window while it is not reading. A client on the same table reading at full speed sees
    every step."""
    src = h.source("w", per_cycle=1, target=1200, max_batch=250, mod_prob=0.9, mod_fracs=(0.5, 1.0))
    h.warm(8)
    h.start()
    h.add(TickwireView(h, src, SHAPES["full"]))
    h.verify()  # its subscription is registered: the slow ones below find their own server side, not this one
    gate = threading.Event()
    gate.set()
    slow = [h.add(RecordingView(h, src, shape, client=h.new_client(), gate=gate, find_server=True))
            for shape in (SHAPES["full"], Shape("wide", viewport=((100, 899),), reverse=True))]

    def pace(h: Harness) -> None:
        phase = h.steps % 450
        if phase == 0:
            gate.clear()
        elif phase == 380 and not slow[1].changing:  # a new window asked for while not reading
            slow[1].change(random_shape(h.rng, size_hint=1000))
        elif phase == 400:
            gate.set()

    h.before_cycle.append(pace)
    h.verify()
    h.run(steps)
    gate.set()
    h.finish()
    h.stats["slow"] = {v.label(): {"messages": v.messages, "server_coalesced_cycles": v.server_sub.coalesced}
                       for v in slow}


def config_growing(h: Harness, steps: int) -> None:
    """Late joiners (full, all columns or a subset) to a table of several hundred rows, whose
    snapshots arrive in pieces of 300 cells (50 rows of all six columns), one per cycle, with the
    cycle's changes to the rows already delivered in between."""
    src = h.source("g", per_cycle=1, target=700, max_batch=100)
    h.start()  # while the table is empty: these first clients get their snapshot whole
    reg = h.server.registry
    reg.min_piece_cells = reg.max_piece_cells = reg.piece_cells = 50 * len(NAMES)
    _add_shapes(h, src, ("full", "footer"))
    h.verify()
    rng = h.rng
    joiners: list[GrowingView] = []
    h.stats["partial_steps"] = 0

    def join(h: Harness) -> None:
        if h.steps % 30 == 10:
            shape = random_shape(rng, full=True)
            joiners.append(h.add(GrowingView(h, src, shape, exact_columns=bool(rng.random() < 0.5))))
        while len(joiners) > 2:
            old = joiners.pop(0)
            h.stats["partial_steps"] += old.partial_steps
            h.remove(old)

    h.before_cycle.append(join)
    h.run(steps)
    h.finish()
    h.stats["partial_steps"] += sum(v.partial_steps for v in joiners)


# -- aggregations ---------------------------------------------------------------------------------------------

def _field(name: str, t: pa.DataType, **hints: float) -> pa.Field:
    return pa.field(name, t, metadata={k: str(v) for k, v in hints.items()} or None)


# a source whose values repeat (group keys k and g, small integers q and w), with NaN and infinities in x
AGG_SCHEMA = pa.schema([_field("k", pa.int32(), levels=8), _field("g", pa.string(), levels=6),
                        _field("q", pa.int64(), levels=41, low=-20), _field("x", pa.float64(), special=0.03),
                        _field("w", pa.int32(), levels=10), _field("ts", pa.timestamp("ns", "UTC")),
                        _field("f", pa.bool_())])

# every kind of agg_by over AGG_SCHEMA's columns
AGGS = [
    Agg("count", name="N"), Agg("count_where", name="CwX", where=pc.field("x") > pc.scalar(0.0)),  # null, NaN: no
    Agg("sum", "q", "SumQ"), Agg("sum", "x", "SumX"), Agg("sum", "f", "SumF"), Agg("abs_sum", "x", "AbsX"),
    Agg("avg", "x", "AvgX"), Agg("avg", "q", "AvgQ"), Agg("var", "x", "VarX"), Agg("std", "q", "StdQ"),
    Agg("weighted_avg", "x", "WavgX", other="w"), Agg("weighted_sum", "q", "WsumQ", other="w"),
    Agg("weighted_sum", "x", "WsumX", other="q"),
    Agg("min", "x", "MinX"), Agg("max", "x", "MaxX"), Agg("min", "g", "MinG"), Agg("max", "ts", "MaxT"),
    Agg("min", "q", "MinQ"), Agg("max", "w", "MaxW"),
    Agg("first", "x", "FirstX"), Agg("last", "g", "LastG"), Agg("first", "ts", "FirstT"), Agg("last", "f", "LastF"),
    Agg("first_row_key", name="FirstKey"), Agg("last_row_key", name="LastKey"),
    Agg("median", "x", "MedX", average_evenly_divided=True), Agg("median", "q", "MedQ"),
    Agg("percentile", "x", "P90X", percentile=0.9),
    Agg("percentile", "q", "P25Q", percentile=0.25, average_evenly_divided=True),
    Agg("count_distinct", "q", "CdQ"), Agg("count_distinct", "g", "CdG", include_nulls=True),
    Agg("distinct", "w", "DW"), Agg("unique", "k", "UK"), Agg("unique", "g", "UG", include_nulls=True),
    Agg("sorted_first", "x", "SfX", other="ts"), Agg("sorted_last", "g", "SlG", other="q"),
    Agg("group", "w", "GW"), Agg("partition", name="Part"),
    # the forms formula aggregations read (Deephaven's vector functions: tickwire.server.services.agg_formula)
    Agg("median", "q", "WMedQ", wide=True), Agg("median", "x", "WMedX", wide=True),
    Agg("var", "x", "WVarX", wide=True), Agg("avg", "q", "WAvgQ", wide=True), Agg("sum", "f", "WSumF", wide=True),
]
AGG_KINDS = frozenset(a.kind for a in AGGS)
# pydeephaven-ticking 42.7 cannot read a list column holding a null or empty list (get_chunk raises
# IndexError, against a real Deephaven as well), as distinct and group make: its tables have none
LIST_KINDS = frozenset({"distinct", "group"})


def deal_aggs(rng: np.random.Generator, tables: Sequence[tuple[Sequence[str], bool, Sequence[str]]]) -> list[list[Agg]]:
    """AGGS dealt at random among tables, each given as (key columns, list-valued kinds allowed,
    outputs it must have): each aggregation goes to one table that can take it (it reads none of
    that table's key columns), count to every one, so that every kind runs in each configuration
    while no table is wider than it needs to be (a message's cost grows with its columns)."""
    out: list[list[Agg]] = [[] for _ in tables]
    for a in AGGS:
        ok = [i for i, (keys, lists, must) in enumerate(tables) if a.column not in keys and a.other not in keys
              and (lists or a.kind not in LIST_KINDS)]
        assert ok, f"no table can take {a}"
        mine = {int(rng.choice(ok))}
        mine |= {i for i in ok if a.kind == "count" or a.out in tables[i][2]}
        for i in sorted(mine):
            out[i].append(a)
    return out


def _agg_check(src: Source, node, keys: Sequence[str], aggs: Sequence[Agg], where: Optional[pc.Expression],
               stats: collections.Counter) -> Check:
    """The check of an aggregation of `src` (through `where` when set): its rows are the
    aggregation of the source's rows at the step, recomputed from scratch (tests/agg_reference.py),
    and each group keeps the row key it was first given, also after emptying and coming back."""
    homes: dict = {}
    present: set = set()

    def check(step: int, row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
        skeys, full = src.at(step)
        rows = full.append_column(agg_reference.KEY, pa.array(skeys, pa.int64()))
        if where is not None:
            rows = rows.filter(where)
        got = values.to_pylist()
        now, known = set(), set(homes)
        for r, rk in zip(got, row_keys.tolist()):
            g = tuple(agg_reference.key_norm(r[k]) for k in keys)
            if homes.setdefault(g, rk) != rk:
                return f"group {g} is at row key {rk}, it was at {homes[g]}"
            now.add(g)
        stats["groups_gone"] += len(present - now)
        stats["groups_back"] += len((now - present) & known)
        present.clear()
        present.update(now)
        stats["max_groups"] = max(stats["max_groups"], len(now))
        if node.preserve_empty and keys:
            stats["empty_groups"] += sum(1 for r in got if r.get("N") == 0)
        return agg_reference.check_rows(got, rows.to_pylist(), keys, aggs, src.schema,
                                        preserve_empty=node.preserve_empty)
    return check


def _sort_check(parent: Source, columns: Sequence[str], descending: Sequence[bool]) -> Check:
    """The check of a sort of a derived table: the parent's rows at the step (checked before it)
    ordered by `columns` (nulls first, NaN last, as tests/test_graph_ops.py's reference), ties in
    the parent's row order (a source's or a derived table's)."""
    def check(step: int, _row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
        rows = parent.at(step)[1].to_pylist()  # in the parent's row order
        for c, d in reversed(list(zip(columns, descending))):  # stable, also when reversed
            rows = sorted(rows, key=lambda r: agg_reference.sort_key(r[c]), reverse=d)
        got = values.to_pylist()
        if len(got) != len(rows):
            return f"{len(got)} rows, the parent has {len(rows)}"
        for i, (g, w) in enumerate(zip(got, rows)):
            bad = [c for c in g if not _same(g[c], w[c])]
            if bad:
                return f"row {i}: {bad[0]} is {g[bad[0]]!r}, expected {w[bad[0]]!r} (sorted by {list(columns)})"
        return None
    return check


def aggregate(h: Harness, src: Source, name: str, aggs: Sequence[Agg], keys: Sequence[str], *,
              parent=None, where: Optional[pc.Expression] = None, preserve_empty: bool = False) -> Derived:
    """agg_by of `src` (or of `parent`, a where of it by `where`), served as `name`, checked after
    every cycle against a recomputation from the source's rows."""
    node = (parent if parent is not None else src.table).agg_by(list(aggs), list(keys), name=name,
                                                                preserve_empty=preserve_empty)
    stats: collections.Counter = collections.Counter()
    d = h.derive(node, _agg_check(src, node, keys, aggs, where, stats))
    d.stats = stats
    return d


def sort_of(h: Harness, d: Derived, name: str, columns: Sequence[str], descending: Sequence[bool]) -> Derived:
    return h.derive(d.table.sort(list(columns), list(descending), name=name), _sort_check(d, columns, descending))


def columns_of(d: Derived, *names: str) -> tuple[str, ...]:
    """`names` in the order of `d`'s columns (as a shape lists them)."""
    return tuple(c for c in d.schema.names if c in names)


def _agg_views(h: Harness, d: Derived, shapes: Sequence[Shape], *, ticking: bool = False) -> None:
    for shape in shapes:
        h.add(TickwireView(h, d, shape, exact_columns=shape.columns is not None))
    if ticking:
        h.add(TickingView(h, d))


AGG_SHAPES = {
    "full": Shape("full"),
    "header": Shape("header", viewport=((0, 3),)),
    "footer": Shape("footer", viewport=((0, 2),), reverse=True),
    "swiss": Shape("swiss", viewport=((0, 0), (3, 5), (9, 30))),
    "floating": Shape("floating", viewport=((5, 20),)),
}


def config_agg_keyed(h: Harness, steps: int) -> None:
    """Aggregations of a random-traffic source served by name: every kind by one key column (9
    groups, null among them), a random selection by two key columns keeping emptied groups
    (preserve_empty), and one with no key columns; to tickwire full, column-subset and viewport
    clients and to pydeephaven-ticking. After every cycle each aggregation must equal the
    aggregation recomputed from scratch on the source's rows, and each client the table."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    h.warm(3)
    k_aggs, kg_aggs, total_aggs = deal_aggs(h.rng, [(["k"], True, ()), (["k", "g"], False, ()), ([], False, ())])
    by_k = aggregate(h, src, "by_k", k_aggs, ["k"])
    by_kg = aggregate(h, src, "by_k_g", kg_aggs, ["k", "g"], preserve_empty=True)
    total = aggregate(h, src, "total", total_aggs, [])
    h.start()
    _agg_views(h, by_k, [AGG_SHAPES["full"], AGG_SHAPES["footer"],
                         Shape("cols", columns=columns_of(by_k, "k", "SumX", "MedQ", "GW", "DW"))])
    _agg_views(h, by_kg, [AGG_SHAPES["swiss"],
                          Shape("cols", viewport=((2, 12),), reverse=True,
                                columns=columns_of(by_kg, "g", "N", "SumX"))],
               ticking=True)
    _agg_views(h, total, [AGG_SHAPES["full"]], ticking=True)
    h.verify()
    h.run(steps)
    h.finish()


def config_agg_chain(h: Harness, steps: int) -> None:
    """Chains through aggregations: where -> agg_by -> sort (descending by the key), agg_by
    keeping emptied groups (with the list-valued kinds) -> sort by aggregated values (rows move
    as the values change), and where -> agg_by with no keys (its row comes and goes as the where
    empties and fills: the source's size drifts, to empty and back, every 50 steps); three
    updates per cycle (producer coalescing). Each aggregation
    must equal its recomputation from scratch on the source's rows, each sort its parent
    sorted, each client the table it subscribed to."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=3, target=80)
    h.warm(3)
    high = pc.field("q") > pc.scalar(12)
    w = src.table.where(high, name="s_high")
    g_aggs, q_aggs, total_aggs = deal_aggs(h.rng, [(["g"], False, ()), (["q"], True, ("AvgX",)), ([], False, ())])
    by_g = aggregate(h, src, "high_by_g", g_aggs, ["g"], parent=w, where=high)
    by_g_sorted = sort_of(h, by_g, "high_by_g_sorted", ["g"], [True])
    by_q = aggregate(h, src, "by_q", q_aggs, ["q"], preserve_empty=True)
    by_q_sorted = sort_of(h, by_q, "by_q_sorted", ["N", "AvgX"], [True, False])
    high_total = aggregate(h, src, "high_total", total_aggs, [], parent=w, where=high)
    h.start()
    _agg_views(h, by_g_sorted, [AGG_SHAPES["header"]], ticking=True)
    _agg_views(h, by_q, [AGG_SHAPES["swiss"]])
    _agg_views(h, by_q_sorted, [AGG_SHAPES["full"], AGG_SHAPES["footer"],
                                Shape("cols", viewport=((5, 20),), columns=columns_of(by_q_sorted, "q", "N"))])
    _agg_views(h, high_total, [], ticking=True)
    h.verify()
    targets = (80, 0, 10, 250)  # in turn, 50 steps each

    def drift(h: Harness) -> None:
        if h.steps % 50 == 49:
            src.traffic.target = targets[(h.steps // 50 + 1) % len(targets)]

    h.before_cycle.append(drift)
    h.run(steps)
    h.finish()


# -- tables with several parents (joins, merges) -----------------------------------------------------------

# a second source whose columns are named apart from AGG_SCHEMA's (so that joins add them), with
# keys and stamps of the same values as the first's: rk as k, rq as q, rw as w
RIGHT_SCHEMA = pa.schema([_field("rk", pa.int32(), levels=8), _field("rq", pa.int64(), levels=41, low=-20),
                          _field("rw", pa.int32(), levels=10), _field("rx", pa.float64(), special=0.05),
                          _field("rts", pa.timestamp("ns", "UTC"))])

JOIN_SHAPES = {
    "full": Shape("full"),
    "header": Shape("header", viewport=((0, 9),)),
    "footer": Shape("footer", viewport=((0, 14),), reverse=True),
    "swiss": Shape("swiss", viewport=((0, 2), (7, 9), (30, 31), (60, 140))),
}


def _pairs(specs: Sequence[str]) -> list[tuple[str, str]]:
    """"New=Old" / "Name" column pairs as the reference functions take them."""
    return [(s.split("=")[0], s.split("=")[-1]) for s in specs]


def _pylist(t: pa.Table) -> list[dict]:
    """The rows of `t` as dicts, timestamps as their int64 nanoseconds (exact, and much faster to
    make than timezone-aware timestamp objects; the types are checked on the schemas)."""
    cols = [pc.cast(c, pa.int64()) if pa.types.is_timestamp(c.type) else c for c in t.columns]
    return pa.table(cols, names=t.column_names).to_pylist()


_ROWS: dict = {}  # (id of a recorded table, step) -> (table, its rows): the checks of one step share them


def _rows_at(t: Source, step: int) -> list[dict]:
    """A recorded table's rows at `step` as dicts, in row-key order, each with its row key in
    ROW_KEY (not to be changed: the checks of the step share them)."""
    hit = _ROWS.get((id(t), step))
    if hit is not None and hit[0] is t:
        return hit[1]
    if any(s != step for _i, s in _ROWS):
        _ROWS.clear()
    keys, values = t.at(step)
    rows = _pylist(values.append_column(ROW_KEY, pa.array(keys, pa.int64())))
    _ROWS[(id(t), step)] = (t, rows)
    return rows


def _diff_rows(got: list[dict], want: list[dict], what: str) -> Optional[str]:
    """None when the rows `got` (a table's, without row keys) are `want` (whose ROW_KEY, if any,
    is left out) in order and value (NaN equal to NaN, -0.0 to 0.0: a join copies values, no
    tolerance), else the first difference. Types are the tables' schemas' (`_expect_schema`)."""
    if len(got) != len(want):
        return f"{len(got)} rows, {what} has {len(want)}"
    if got and list(got[0]) != [c for c in want[0] if c != ROW_KEY]:
        return f"columns {list(got[0])}, {what} has {[c for c in want[0] if c != ROW_KEY]}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.items() <= w.items():  # the common case, without a Python loop over the values
            continue
        bad = next((c for c in g if not _same(g[c], w[c])), None)
        if bad is not None:
            return f"row {i}: {bad} is {g[bad]!r}, {what} has {w[bad]!r}"
    return None


def _expect_schema(node, left: pa.Schema, right: pa.Schema, joins: Sequence[tuple[str, str]]) -> None:
    """A join's columns: the left table's, then `joins` (new name, right column) of the right's types."""
    want = pa.schema([*left, *(right.field(c).with_name(n) for n, c in joins)])
    if not node.schema.equals(want):
        raise AssertionError(f"table {node.name!r} has the columns {node.schema}, expected {want}")


def _left_rows_check(left: Source, right: Source, ref: Callable[[list[dict], list[dict]], list[dict]], what: str,
                     stats: collections.Counter, matched: Optional[str] = None) -> Check:
    """The check of a join whose rows are the left table's (natural_join, exact_join, aj, raj,
    where_in): the rows and row keys `ref(left rows, right rows)` gives from the parents' recorded
    states at the step, in the left table's order, values exactly. Counts the rows, the left's,
    and those whose added column `matched` is not null (evidence that the run found right rows)."""
    def check(step: int, row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
        lrows = _rows_at(left, step)
        want = ref(lrows, _rows_at(right, step))
        want_keys = np.array([r[ROW_KEY] for r in want], dtype=np.int64)
        if not np.array_equal(row_keys, want_keys):
            m = min(row_keys.size, want_keys.size)
            bad = np.flatnonzero(row_keys[:m] != want_keys[:m])
            return (f"row keys differ from {what}'s ({row_keys.size} rows, {want_keys.size} expected; first "
                    f"difference at position {int(bad[0]) if bad.size else m})")
        stats["rows"] += values.num_rows
        stats["left_rows"] += len(lrows)
        if matched is not None:
            stats["matched"] += values.num_rows - values.column(matched).null_count
        return _diff_rows(_pylist(values), want, what)
    return check


def _derive_checked(h: Harness, node, check_of: Callable[[collections.Counter], Check]) -> Derived:
    stats: collections.Counter = collections.Counter()
    d = h.derive(node, check_of(stats))
    d.stats = stats
    return d


def natural_join_of(h: Harness, left: Source, right: Source, name: str, on: Sequence[str], joins: Sequence[str],
                    match: str = "error", exact: bool = False) -> Derived:
    """natural_join (or exact_join) of two recorded tables, checked against ref_natural_join."""
    node = left.table.exact_join(right.table, list(on), list(joins), name=name) if exact else \
        left.table.natural_join(right.table, list(on), list(joins), name=name, match=match)
    on_p, joins_p = _pairs(on), _pairs(joins)
    _expect_schema(node, left.schema, right.schema, joins_p)
    return _derive_checked(h, node, lambda stats: _left_rows_check(
        left, right, lambda lr, rr: ref_natural_join(lr, rr, on_p, joins_p, match),
        "exact_join" if exact else f"natural_join(match={match!r})", stats, joins_p[0][0]))


def where_in_of(h: Harness, left: Source, right: Source, name: str, on: Sequence[str],
                inverted: bool = False) -> Derived:
    """where_in (or where_not_in) of two recorded tables, checked against ref_where_in."""
    node = left.table.where_in(right.table, list(on), name=name, inverted=inverted)
    on_p = _pairs(on)
    _expect_schema(node, left.schema, right.schema, [])
    return _derive_checked(h, node, lambda stats: _left_rows_check(
        left, right, lambda lr, rr: ref_where_in(lr, rr, on_p, inverted),
        "where_not_in" if inverted else "where_in", stats))


def as_of_of(h: Harness, left: Source, right: Source, name: str, on: Sequence[str], stamp: str, rule: str,
             joins: Sequence[str]) -> Derived:
    """aj (rules > and >=) or raj (< and <=) of two recorded tables on exact-match columns `on`
    and `stamp` ("Left=Right"), checked against ref_as_of."""
    op = left.table.aj if rule in (">=", ">") else left.table.raj
    node = op(right.table, [*on, stamp], list(joins), name=name, rule=rule)
    on_p, joins_p = _pairs(on), _pairs(joins)
    st = _pairs([stamp])[0]
    # as Deephaven: the right match columns named apart (exact-match columns, then the stamp) come
    # first under their own names, unless the added columns rename them
    renamed = {c for n, c in joins_p if n != c}
    front = [c for c in dict.fromkeys([b for a, b in on_p if a != b] + ([st[1]] if st[0] != st[1] else []))
             if c not in renamed]
    joins_p = [(c, c) for c in front] + [(n, c) for n, c in joins_p if not (n == c and c in front)]
    _expect_schema(node, left.schema, right.schema, joins_p)
    return _derive_checked(h, node, lambda stats: _left_rows_check(
        left, right, lambda lr, rr: ref_as_of(lr, rr, on_p, st, rule, joins_p),
        f"{'aj' if rule[0] == '>' else 'raj'}({rule})", stats, joins_p[-1][0]))


def cross_join_of(h: Harness, left: Source, right: Source, name: str, on: Sequence[str], joins: Sequence[str],
                  reserve_bits: int = 10) -> Derived:
    """join (cross join), checked against ref_cross_join: each left row (in order) once for each
    right row of its key (in row-key order); its row keys ascend with that order (the recorded
    values are in row-key order)."""
    node = left.table.join(right.table, list(on), list(joins), name=name, reserve_bits=reserve_bits)
    on_p, joins_p = _pairs(on), _pairs(joins)
    _expect_schema(node, left.schema, right.schema, joins_p)

    def check_of(stats: collections.Counter) -> Check:
        def check(step: int, _row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
            stats["max_rows"] = max(stats["max_rows"], values.num_rows)
            stats["max_bits"] = max(stats["max_bits"], int(node.bits))
            want = ref_cross_join(_rows_at(left, step), _rows_at(right, step), on_p, joins_p)
            return _diff_rows(_pylist(values), want, "the cross join")
        return check
    return _derive_checked(h, node, check_of)


def merge_of(h: Harness, parts: Sequence[Source], name: str) -> Derived:
    """merge, checked: each part's rows in its own order, the parts one after the other."""
    node = parts[0].table.merge([p.table for p in parts[1:]], name=name)
    _expect_schema(node, parts[0].schema, parts[0].schema, [])

    def check_of(stats: collections.Counter) -> Check:
        def check(step: int, _row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
            stats["max_rows"] = max(stats["max_rows"], values.num_rows)
            want = [r for p in parts for r in _rows_at(p, step)]
            return _diff_rows(_pylist(values), want, "the parts one after the other")
        return check
    return _derive_checked(h, node, check_of)


def multi_join_of(h: Harness, inputs: Sequence[tuple[Source, Sequence[str], Sequence[str]]], name: str) -> Derived:
    """multi_join of recorded tables with unique keys: one row per key of any input, with each
    input's columns of its row of that key (nulls without one); a key keeps its row key for life."""
    node = inputs[0][0].table.multi_join([(t.table, list(on), list(joins)) for t, on, joins in inputs], name=name)
    keys = [a for a, _b in _pairs(inputs[0][1])]
    first = inputs[0][0].schema
    want = pa.schema([*(first.field(b).with_name(a) for a, b in _pairs(inputs[0][1])),
                      *(t.schema.field(c).with_name(n) for t, _on, joins in inputs for n, c in _pairs(joins))])
    if not node.schema.equals(want):
        raise AssertionError(f"table {name!r} has the columns {node.schema}, expected {want}")
    homes: dict = {}

    def check_of(stats: collections.Counter) -> Check:
        def check(step: int, row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
            want: dict = {}
            for t, on, joins in inputs:
                own = [b for _a, b in _pairs(on)]
                for r in _rows_at(t, step):
                    row = want.setdefault(key_of(r, own), {**dict(zip(keys, (r[c] for c in own))),
                                                           **{n: None for n in values.column_names if n not in keys}})
                    for new, col in _pairs(joins):
                        row[new] = r[col]
            got: dict = {}
            for rk, r in zip(row_keys.tolist(), _pylist(values)):
                g = key_of(r, keys)
                if homes.setdefault(g, rk) != rk:
                    return f"key {g} is at row key {rk}, it was at {homes[g]}"
                if g in got:
                    return f"two rows of key {g}"
                got[g] = r
            if set(got) != set(want):
                return f"keys differ: extra {sorted(set(got) - set(want), key=repr)[:5]}, " \
                       f"missing {sorted(set(want) - set(got), key=repr)[:5]}"
            stats["max_rows"] = max(stats["max_rows"], len(got))
            stats["partial_rows"] += sum(1 for r in got.values() if any(v is None for v in r.values()))
            for g, w in want.items():
                what = _diff_rows([got[g]], [w], f"key {g}: the inputs' rows")
                if what is not None:
                    return what
            return None
        return check
    return _derive_checked(h, node, check_of)


def where_of(h: Harness, parent: Source, name: str, predicate: pc.Expression) -> Derived:
    """A where of a recorded table, checked: the parent's rows (and row keys) that pass."""
    def check_of(stats: collections.Counter) -> Check:
        def check(step: int, row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
            keys, full = parent.at(step)
            want = full.append_column(ROW_KEY, pa.array(keys, pa.int64())).filter(predicate)
            stats["rows"] += values.num_rows
            if not np.array_equal(row_keys, want.column(ROW_KEY).to_numpy()):
                return f"row keys differ from the parent's that pass ({row_keys.size} rows, {want.num_rows} expected)"
            return compare(values, want.drop_columns([ROW_KEY]))
        return check
    return _derive_checked(h, parent.table.where(predicate, name=name), check_of)


def last_by_of(h: Harness, parent: Source, name: str, keys: Sequence[str]) -> Derived:
    """last_by of a recorded table, checked: per key, the parent's row with the largest row key."""
    def check(step: int, _row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
        want = {key_of(r, keys): r for r in _rows_at(parent, step)}
        got = {key_of(r, keys): r for r in _pylist(values)}
        if len(got) != values.num_rows or set(got) != set(want):
            return f"{values.num_rows} rows of keys {sorted(got, key=repr)[:5]}..., expected {len(want)}"
        for g, w in want.items():
            what = _diff_rows([got[g]], [w], f"key {g}: the parent's last row")
            if what is not None:
                return what
        return None
    return h.derive(parent.table.last_by(list(keys), name=name), check)


def _evidence(h: Harness, steps: int, conditions: dict[str, bool]) -> None:
    """Fails a run of at least 100 steps that did not go through what it is for."""
    missed = [what for what, ok in conditions.items() if not ok]
    if steps >= 100 and missed:
        raise h.divergence(h.graph.step, f"the run never exercised: {', '.join(missed)}; "
                                         f"tables {h.summary()['tables']}")


def _join_views(h: Harness, d: Derived, shapes: Sequence[str], *, ticking: bool = False) -> None:
    _agg_views(h, d, [JOIN_SHAPES[s] for s in shapes], ticking=ticking)


def _drift(src: Source, targets: Sequence[int], every: int = 50) -> Callable[[Harness], None]:
    """A before-cycle hook moving the source's target size through `targets` (to empty and back)."""
    first = src.traffic.target

    def drift(h: Harness) -> None:
        if h.steps % every == every - 1:
            src.traffic.target = ([first, *targets])[(h.steps // every + 1) % (len(targets) + 1)]
    return drift


def config_join_diamond(h: Harness, steps: int) -> None:
    """Diamonds: a where of a source joined (natural_join, match="error") with an agg_by of the
    same source by a low-cardinality key, and the source exact_joined with its own last_by; each
    side changes in the same cycle as the other; the source's size drifts (to empty and back, and
    to 150 rows) every 50 steps. Every table is checked after every cycle against
    its recomputation from its parents' rows at that step (the joins with the reference of
    tests/test_graph_joins.py), and every client against the table."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    h.warm(3)
    pos = where_of(h, src, "s_pos", pc.field("q") > pc.scalar(0))
    by_k = aggregate(h, src, "by_k", [Agg("count", name="N"), Agg("sum", "x", "SumX"), Agg("last", "g", "LastG"),
                                      Agg("max", "ts", "MaxT")], ["k"])
    last_g = last_by_of(h, src, "last_by_g", ["g"])
    diamond = natural_join_of(h, pos, by_k, "diamond", ["k"], ["N", "SumX", "LastG", "MaxT"])
    exact = natural_join_of(h, src, last_g, "exact_last", ["g"], ["LQ=q", "LX=x", "LTs=ts"], exact=True)
    h.start()
    _join_views(h, diamond, ["full"], ticking=True)
    _join_views(h, exact, ["footer"])
    h.verify()
    h.before_cycle.append(_drift(src, (0, 10, 150)))
    h.run(steps)
    h.finish()
    _evidence(h, steps, {"diamond matches": diamond.stats["matched"] > 0,
                         "exact_join matches": exact.stats["matched"] > 0})


def config_join_self(h: Harness, steps: int) -> None:
    """A table joined with filtered copies of itself: where_in and where_not_in against a where of
    it on a key of 41 values, where_in on a float key (NaN, infinities, -0.0 among the keys), and
    natural_join with match="last" against a where of it on two keys (several right rows per key:
    the one with the highest row key). Two updates per cycle."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=2, target=80)
    h.warm(3)
    w0 = where_of(h, src, "s_w0", pc.field("w") == pc.scalar(0))
    w3 = where_of(h, src, "s_w3", pc.field("w") < pc.scalar(3))
    flagged = where_of(h, src, "s_f", pc.field("f") == pc.scalar(True))
    inside = where_in_of(h, src, w0, "in_w0", ["q"])
    outside = where_in_of(h, src, w0, "not_in_w0", ["q"], inverted=True)
    in_x = where_in_of(h, src, w3, "in_x", ["x"])
    last = natural_join_of(h, src, flagged, "last_f", ["k", "g"], ["FQ=q", "FX=x", "FTs=ts"], match="last")
    h.start()
    _join_views(h, inside, ["full"])
    _join_views(h, in_x, ["footer"])
    _join_views(h, last, ["swiss"], ticking=True)
    h.verify()
    h.run(steps)
    h.finish()
    _evidence(h, steps, {
        "where_in keeping some rows and dropping others":
            0 < inside.stats["rows"] < inside.stats["left_rows"] and 0 < outside.stats["rows"],
        "where_in on floats beyond the filter's own rows": in_x.stats["rows"] > w3.stats["rows"],
        "natural_join matches": 0 < last.stats["matched"] < last.stats["rows"]})


def config_join_chain(h: Harness, steps: int) -> None:
    """Joins of joins over two sources fed in the same cycles: a source natural_joined with its own
    last_by, that join as-of joined (aj >=, a stamp of ten values: ties take the last right row)
    with the second source, that aj reverse-as-of joined (raj <=, ties take the first) and the
    first join aj'ed strictly (>) on a float stamp (null first, NaN last) and raj'ed strictly (<)
    on a timestamp; the right stamps are named apart, so each join adds them."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    right = h.source("r", schema=RIGHT_SCHEMA, per_cycle=1, target=30)
    h.warm(3)
    last_k = last_by_of(h, src, "s_last_k", ["k"])
    nj = natural_join_of(h, src, last_k, "nj", ["k"], ["LW=w", "LTs=ts"])
    aj_w = as_of_of(h, nj, right, "aj_w", ["k=rk"], "w=rw", ">=", ["RX=rx", "RTs=rts"])
    raj_q = as_of_of(h, aj_w, right, "raj_q", ["k=rk"], "q=rq", "<=", ["R2K=rk", "R2X=rx"])
    aj_x = as_of_of(h, nj, right, "aj_x", [], "x=rx", ">", ["RK=rk", "RQ=rq"])
    raj_ts = as_of_of(h, nj, right, "raj_ts", ["w=rw"], "LTs=rts", "<", ["R4Q=rq"])
    h.start()
    _join_views(h, aj_w, ["full"])  # aj_x and raj_ts are checked, not served (each client costs a step ~10 ms)
    _join_views(h, raj_q, ["footer"], ticking=True)
    h.verify()
    h.run(steps)
    h.finish()
    _evidence(h, steps, {f"{d.name} matches": 0 < d.stats["matched"] < d.stats["rows"]
                         for d in (aj_w, raj_q, aj_x, raj_ts)})


def config_join_merge(h: Harness, steps: int) -> None:
    """Merges of a table with its own sorts (every part changes in each cycle; a sort's row keys
    live near 2**62): the source then its sort by a float column, and a sort by two columns then
    the source then a where of it."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    h.warm(3)
    by_x = h.derive(src.table.sort(["x"], name="s_by_x"), _sort_check(src, ["x"], [False]))
    by_gq = h.derive(src.table.sort(["g", "q"], [True, False], name="s_by_gq"),
                     _sort_check(src, ["g", "q"], [True, False]))
    flagged = where_of(h, src, "s_f", pc.field("f") == pc.scalar(True))
    m1 = merge_of(h, [src, by_x], "merge_sorted")
    m3 = merge_of(h, [by_gq, src, flagged], "merge3")
    h.start()
    _join_views(h, m1, ["full", "swiss"], ticking=True)
    _join_views(h, m3, ["footer"])
    h.verify()
    h.run(steps)
    h.finish()


def config_join_cross(h: Harness, steps: int) -> None:
    """Cross joins and a multi_join over two sources fed in the same cycles: the first source
    joined with a where of the second on a key of eight values, a where of the second joined with
    every row of a where of the first (reserved bits widened from 1 as groups grow), and a
    multi_join of an agg_by of each source by that key (keys that only one side has). The second
    source's size drifts, to empty and back, every 50 steps."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=60)
    right = h.source("r", schema=RIGHT_SCHEMA, per_cycle=1, target=40)
    h.warm(3)
    r3 = where_of(h, right, "r_w3", pc.field("rw") < pc.scalar(3))
    s0 = where_of(h, src, "s_w0", pc.field("w") == pc.scalar(0))
    cross = cross_join_of(h, src, r3, "cross", ["k=rk"], ["RQ=rq", "RX=rx"])
    every = cross_join_of(h, r3, s0, "cross_all", [], ["SQ=q", "STs=ts"], reserve_bits=1)
    s_by_k = aggregate(h, src, "s_by_k", [Agg("count", name="N"), Agg("sum", "x", "SumX")], ["k"])
    r_by_k = aggregate(h, right, "r_by_k", [Agg("count", name="RN"), Agg("max", "rts", "RMaxT")], ["rk"])
    multi = multi_join_of(h, [(s_by_k, ["k"], ["N", "SumX"]), (r_by_k, ["k=rk"], ["RN", "RMaxT"])], "multi")
    h.start()
    _join_views(h, cross, ["full"], ticking=True)
    _join_views(h, every, ["footer"])
    _join_views(h, multi, ["header"])
    h.verify()
    h.before_cycle.append(_drift(right, (0, 10)))  # no right rows: cross joins without rows, keys of one side
    h.run(steps)
    h.finish()
    _evidence(h, steps, {"cross join rows": cross.stats["max_rows"] > 0 and every.stats["max_rows"] > 0,
                         "reserved bits widened": every.stats["max_bits"] > 1,
                         "multi_join keys of one side only": multi.stats["partial_rows"] > 0})


# -- update_by ----------------------------------------------------------------------------------------------

def tickwire_update_by_op(op: ubref.Op):
    """tickwire's operation (tickwire.server.engine.updateby) for a reference operation."""
    cols = [f"{o}={i}" for o, i in op.pairs]
    k = op.kind
    if k == "delta":
        return ub.delta(cols, op.delta)
    if k in ubref.CUMULATIVE:
        return {"cum_sum": ub.cum_sum, "cum_prod": ub.cum_prod, "cum_min": ub.cum_min, "cum_max": ub.cum_max,
                "forward_fill": ub.forward_fill}[k](cols)
    if k in ubref.EXPONENTIAL:
        fn = {"ema": "ema", "ems": "ems", "em_min": "emmin", "em_max": "emmax", "em_std": "emstd"}[k]
        if op.time_col is None:
            return getattr(ub, f"{fn}_tick")(op.ticks, cols)
        return getattr(ub, f"{fn}_time")(op.time_col, op.decay, cols)
    if op.time_col is None:
        return getattr(ub, f"{k}_tick")(cols, op.rev, op.fwd)
    return getattr(ub, f"{k}_time")(op.time_col, cols, op.rev, op.fwd)


def update_by_of(h: Harness, parent: Source, name: str, ops: Sequence[ubref.Op], by: Sequence[str] = ()) -> Derived:
    """update_by of a recorded table, checked after every cycle: the parent's rows, row keys and
    columns, and each output column as tests/update_by_reference.py recomputes it from scratch
    from the parent's rows at the step (floats within a relative 1e-9)."""
    node = parent.table.update_by([tickwire_update_by_op(o) for o in ops], by=list(by), name=name)
    outs = [n for o in ops for n, _c in o.pairs]
    # em_std of equal values cancels to 0; a scan composes its roundings in another order than the
    # reference's loop, leaving a few ulps of the values (relative to the input's magnitude)
    cancels = {n: c for o in ops if o.kind == "em_std" for n, c in o.pairs}
    if node.schema.names != [*parent.schema.names, *outs]:
        raise AssertionError(f"table {name!r} has the columns {node.schema.names}")

    def check_of(stats: collections.Counter) -> Check:
        def check(step: int, row_keys: np.ndarray, values: pa.Table) -> Optional[str]:
            keys, full = parent.at(step)
            if not np.array_equal(row_keys, keys):
                return f"row keys differ from the parent's ({row_keys.size} rows, {keys.size} in the parent)"
            what = compare(values.select(full.column_names), full)
            if what is not None:
                return f"the parent's columns: {what}"
            want = ubref.update_by(_pylist(full), ops, by)
            stats["rows"] += len(keys)
            for n in outs:
                col = values.column(n)
                got = (pc.cast(col, pa.int64()) if pa.types.is_timestamp(col.type) else col).to_pylist()
                exp = want[n]
                if got == exp:
                    stats["values"] += sum(v is not None for v in got)
                    continue
                tol = 0.0
                if n in cancels:
                    x = np.asarray(pc.cast(full.column(cancels[n]), pa.float64()).fill_null(0).to_numpy(),
                                   dtype=np.float64)
                    x = x[np.isfinite(x)]
                    tol = 1e-12 * float(np.abs(x).max()) if x.size else 0.0
                for i, (g, e) in enumerate(zip(got, exp)):
                    if not ubref.close(g, e, tol):
                        return f"column {n} row {i} (row key {int(keys[i])}): {g!r}, expected {e!r}"
                stats["values"] += sum(v is not None for v in got)
            return None
        return check
    return _derive_checked(h, node, check_of)


class RingTraffic(Traffic):
    """Traffic whose rows' stamps (column `stamp`) never go back in row order, so that time-based
    update_by operations may read them: each update appends rows at the end (stamps moving on,
    ties and nulls among them), removes the oldest rows beyond `target` (a ring) and sometimes
    scattered rows, sometimes closes the gaps with a shift, and modifies any column but the stamp."""

    def __init__(self, rng: np.random.Generator, *, stamp: str = "ts", **kw):
        super().__init__(rng, **kw)
        self.stamp = stamp
        self.clock = int(np.datetime64("2024-01-01T00:00:00", "ns").astype(np.int64))

    def next(self, prev: np.ndarray) -> tuple[TableUpdate, pa.Table, np.ndarray]:
        rng = self.rng
        n = prev.size
        gone = np.zeros(n, dtype=bool)
        if n > self.target:
            gone[:n - self.target + int(rng.integers(0, self.max_batch + 1))] = True
            self.kinds["ring"] += 1
        if n and rng.random() < 0.2:
            gone |= rng.random(n) < 0.1
            self.kinds["remove"] += 1
        kept = prev[~gone]
        new_kept = kept
        if kept.size and rng.random() < 0.15:
            new_kept = int(rng.integers(0, 3)) + np.arange(kept.size, dtype=np.int64) * int(rng.integers(1, 3))
            self.kinds["compact"] += 1
        k = self._batch()
        start = int(new_kept[-1]) + 1 + int(rng.integers(0, 3)) if new_kept.size else int(rng.integers(0, 5))
        added = start + np.cumsum(rng.integers(1, 3, k)) - 1
        self.kinds["append"] += 1
        mod = np.empty(0, dtype=np.int64)
        cols: set[str] = set()
        if new_kept.size and rng.random() < self.mod_prob:
            mod = new_kept[rng.random(new_kept.size) < rng.choice(self.mod_fracs)]
            if mod.size == 0:
                mod = new_kept[[int(rng.integers(0, new_kept.size))]]
            names = [c for c in self.schema.names if c != self.stamp]
            cols = {c for c in names if rng.random() < 0.4} or {str(rng.choice(names))}
            self.kinds["modify"] += 1
        update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev[gone]),
                             modified=RowSet.from_keys(mod), shifted=shifts_between(kept, new_kept),
                             modified_columns=cols)
        new_keys = np.union1d(new_kept, added).astype(np.int64)
        update.validate(RowSet.from_keys(prev), RowSet.from_keys(new_keys))
        values = self.pool.values(np.union1d(added, mod).astype(np.int64))
        steps = np.where(rng.random(k) < 0.2, 0, rng.integers(1, 3 * 10**9, k))  # ties, and up to 3 s
        stamps = self.clock + np.cumsum(steps)
        self.clock = int(stamps[-1])
        col = values.column(self.stamp).combine_chunks()
        stamp = pa.array(stamps, col.type, mask=rng.random(k) < 0.1)
        values = values.set_column(values.column_names.index(self.stamp), self.stamp,
                                   pa.concat_arrays([col.slice(0, mod.size), stamp]))  # the added rows come last
        return update, values, new_keys


def _op(kind: str, *pairs: str, **kw) -> ubref.Op:
    return ubref.Op(kind, tuple(tuple(p.split("=")) for p in pairs), **kw)  # type: ignore[misc]


# per bucket of a random-traffic source: every cumulative and exponential kind, rolling windows back and ahead
UB_BUCKET_OPS = [
    _op("cum_sum", "CsQ=q", "CsX=x"), _op("cum_prod", "CpW=w", "CpX=x"), _op("cum_min", "CminQ=q", "CminX=x"),
    _op("cum_max", "CmaxW=w", "CmaxX=x"), _op("forward_fill", "FfG=g", "FfX=x", "FfTs=ts"),
    _op("delta", "DQ=q", "DX=x"), _op("delta", "DvW=w", delta="value_dominates"),
    _op("delta", "DzX=x", delta="zero_dominates"),
    _op("ema", "EmaX=x", "EmaQ=q", ticks=5), _op("ems", "EmsX=x", ticks=3), _op("em_min", "EminX=x", ticks=4),
    _op("em_max", "EmaxQ=q", ticks=4), _op("em_std", "EstdX=x", "EstdW=w", ticks=6),
    _op("rolling_sum", "RsQ=q", "RsX=x", rev=3), _op("rolling_avg", "RaX=x", rev=5, fwd=2),
    _op("rolling_min", "RminQ=q", rev=4, fwd=1), _op("rolling_max", "RmaxW=w", rev=2, fwd=3),
    _op("rolling_count", "RcX=x", rev=6), _op("rolling_std", "RstdX=x", "RstdQ=q", rev=4, fwd=2),
]
# over the whole table: longer windows, one reaching only ahead (rev 0)
UB_TABLE_OPS = [
    _op("cum_sum", "CsX=x"), _op("ema", "EmaX=x", ticks=10), _op("em_std", "EstdQ=q", ticks=3),
    _op("rolling_sum", "RsQ=q", rev=10, fwd=5), _op("rolling_avg", "RaQ=q", rev=0, fwd=3),
    _op("rolling_max", "RmaxQ=q", rev=1), _op("rolling_count", "RcW=w", rev=8, fwd=8),
]
UB_STRING_KEY_OPS = [
    _op("cum_max", "CmaxQ=q"), _op("forward_fill", "FfK=k"), _op("ema", "EmaW=w", ticks=2),
    _op("rolling_std", "RstdX=x", rev=3, fwd=3), _op("rolling_min", "RminW=w", rev=5),
]


def config_updateby_buckets(h: Harness, steps: int) -> None:
    """update_by of a random-traffic source (rows inserted in the middle of buckets, removed,
    moved by shifts, modified, moved to another bucket by a change of their key): every
    cumulative and exponential kind over ticks and rolling windows back and ahead, by an integer
    key (null a bucket), with no key, and by a string key. Each is checked after every cycle
    against its recomputation from scratch from the source's rows (tests/update_by_reference.py)."""
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    h.warm(3)
    by_k = update_by_of(h, src, "ub_k", UB_BUCKET_OPS, ["k"])
    whole = update_by_of(h, src, "ub_all", UB_TABLE_OPS)
    by_g = update_by_of(h, src, "ub_g", UB_STRING_KEY_OPS, ["g"])
    h.start()
    _join_views(h, by_k, ["full"])
    _join_views(h, whole, ["footer"])
    _join_views(h, by_g, ["swiss"], ticking=True)
    h.verify()
    h.before_cycle.append(_drift(src, (0, 10, 150)))
    h.run(steps)
    h.finish()
    _evidence(h, steps, {f"{d.name} values": d.stats["values"] > 0 for d in (by_k, whole, by_g)})


SECOND = 10**9
# over the stamps of a ring source (a row about every 1.5 s, ties and nulls among them)
UB_TIME_OPS = [
    _op("ema", "EmaX=x", "EmaQ=q", time_col="ts", decay=5 * SECOND),
    _op("ems", "EmsX=x", time_col="ts", decay=3 * SECOND), _op("em_min", "EminQ=q", time_col="ts", decay=4 * SECOND),
    _op("em_max", "EmaxX=x", time_col="ts", decay=4 * SECOND),
    _op("em_std", "EstdX=x", time_col="ts", decay=8 * SECOND),
    _op("rolling_sum", "RsQ=q", "RsX=x", time_col="ts", rev=10 * SECOND),
    _op("rolling_avg", "RaX=x", time_col="ts", rev=6 * SECOND, fwd=3 * SECOND),
    _op("rolling_min", "RminQ=q", time_col="ts", rev=5 * SECOND, fwd=5 * SECOND),
    _op("rolling_max", "RmaxW=w", time_col="ts", rev=0, fwd=4 * SECOND),
    _op("rolling_count", "RcX=x", time_col="ts", rev=7 * SECOND),
    _op("rolling_std", "RstdX=x", time_col="ts", rev=10 * SECOND, fwd=2 * SECOND),
    _op("cum_sum", "CsQ=q"), _op("rolling_avg", "RaQ=q", rev=3, fwd=1),
]
DAY = 86_400 * SECOND
# over a sort of a random-traffic source by its key and stamp (stamps over ~11 days)
UB_SORTED_OPS = [
    _op("ema", "EmaX=x", time_col="ts", decay=DAY), _op("em_std", "EstdQ=q", time_col="ts", decay=2 * DAY),
    _op("rolling_sum", "RsQ=q", time_col="ts", rev=2 * DAY, fwd=DAY),
    _op("rolling_count", "RcX=x", time_col="ts", rev=3 * DAY),
    _op("rolling_max", "RmaxQ=q", time_col="ts", rev=DAY, fwd=DAY),
    _op("cum_min", "CminX=x"), _op("delta", "DQ=q"), _op("rolling_std", "RstdX=x", rev=3, fwd=2),
]


def config_updateby_time(h: Harness, steps: int) -> None:
    """Time-based update_by: over a ring source whose stamps never go back (appends at the end,
    the oldest rows dropped, rows removed and moved, modifies of every column but the stamp), by
    a key and over the whole table, with tick-based operations beside them; and by a key over a
    sort of a random-traffic source by that key and its stamp (the update_by's parent moves its
    rows as rows are inserted and removed in the middle). Each checked after every cycle against
    its recomputation from scratch from its parent's rows (tests/update_by_reference.py)."""
    ring = h.source("r", schema=AGG_SCHEMA, per_cycle=1, target=80)
    ring.traffic = RingTraffic(ring.traffic.rng, schema=AGG_SCHEMA, target=80, max_batch=8)
    src = h.source("s", schema=AGG_SCHEMA, per_cycle=1, target=80)
    h.warm(3)
    by_k = update_by_of(h, ring, "ubt_k", UB_TIME_OPS, ["k"])
    whole = update_by_of(h, ring, "ubt_all", UB_TIME_OPS[:7])
    by_kt = h.derive(src.table.sort(["k", "ts"], name="s_by_k_ts"), _sort_check(src, ["k", "ts"], [False, False]))
    sorted_k = update_by_of(h, by_kt, "ubt_sorted", UB_SORTED_OPS, ["k"])
    h.start()
    _join_views(h, by_k, ["full"])
    _join_views(h, whole, ["header"])
    _join_views(h, sorted_k, ["footer"], ticking=True)
    h.verify()
    h.run(steps)
    h.finish()
    _evidence(h, steps, {f"{d.name} values": d.stats["values"] > 0 for d in (by_k, whole, sorted_k)})


@dataclass
class Config:
    name: str
    run: Callable[[Harness, int], None]
    tick_s: Optional[float] = None


CONFIGS: dict[str, Config] = {c.name: c for c in [
    Config("shapes-p1", lambda h, n: config_shapes(h, n, per_cycle=1)),
    Config("shapes-p10", lambda h, n: config_shapes(h, n, per_cycle=10)),
    Config("long-run", config_long_run),
    Config("view-changes", config_view_changes),
    Config("blink-p1", lambda h, n: config_blink(h, n, per_cycle=1)),
    Config("blink-p10", lambda h, n: config_blink(h, n, per_cycle=10, ticking=False)),
    Config("ticking", config_ticking),
    Config("interval", config_interval, tick_s=INTERVAL_TICK_S),
    Config("slow-reader", config_slow_reader),
    Config("growing", config_growing),
    Config("agg-keyed", config_agg_keyed),
    Config("agg-chain", config_agg_chain),
    Config("join-diamond", config_join_diamond),
    Config("join-self", config_join_self),
    Config("join-chain", config_join_chain),
    Config("join-merge", config_join_merge),
    Config("join-cross", config_join_cross),
    Config("updateby-buckets", config_updateby_buckets),
    Config("updateby-time", config_updateby_time),
]}


def run_config(name: str, seed: int, steps: int) -> Harness:
    """Runs one configuration for `steps` steps (raises Divergence); returns the closed harness."""
    cfg = CONFIGS[name]
    h = Harness(name, seed, tick_s=cfg.tick_s)
    h.planned = steps
    with h:
        try:
            cfg.run(h, steps)
        except Divergence:
            raise
        except Exception as exc:  # anything else that breaks a run is reported with its replay line too
            raise h.divergence(h.graph.step, f"{type(exc).__name__}: {exc}") from exc
    return h


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2 or argv[0] not in CONFIGS:
        print(f"usage: python -m tests.convergence CONFIG SEED [STEPS]\n  configs: {', '.join(CONFIGS)}")
        return 2
    steps = int(argv[2]) if len(argv) > 2 else 200
    t0 = time.perf_counter()
    h = run_config(argv[0], int(argv[1]), steps)
    print(f"{h.summary()} in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
