"""A source table driven by scripted updates (any mix of removes, shifts, adds and modifies),
and a generator of random valid updates, for tests of everything downstream of the graph."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, UpdateSourceTable
from tickwire.server.engine.graph import ROW_KEY, RowSet, RowSetShiftData, TableUpdate, apply_update

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string()), ("c", pa.float64())])


class ScriptedTable(UpdateSourceTable):
    """Applies queued (update, values) pairs, written with `Engine.write(table, (update, values))`
    (`scripted_table` makes one); `values` holds the new values of the added and modified rows with
    their post-update keys in a first column `__row_key__`."""

    def __init__(self, graph, name: str, schema: pa.Schema = SCHEMA):
        super().__init__(graph, name, schema)
        self.state = pa.table({ROW_KEY: pa.array([], pa.int64()),
                               **{f.name: pa.array([], f.type) for f in schema}})

    def apply_pending(self, step, ops) -> Optional[TableUpdate]:
        if not ops:
            return None
        total = None
        prev = self.rowset
        before = self.state
        for update, values in ops:
            self.state = apply_update(self.state, update, values)
            total = update if total is None else total.coalesce(update, prev)
        keys = self.state.column(ROW_KEY).to_numpy()
        if keys.size:
            self.store.ensure(int(keys.max()) + 1)
            self.store.write(keys, self.state.drop_columns([ROW_KEY]))
        self.prev_rowset = prev
        self.rowset = RowSet.from_keys(keys)
        if total is not None and not total.modified.is_empty():  # previous values, as sources keep them
            mod = total.modified
            pre = total.shifted.unapply(mod).keys() if not total.shifted.is_empty() else mod.keys()
            at = np.searchsorted(before.column(ROW_KEY).to_numpy(), pre)
            self._prev = (mod.keys(), before.take(pa.array(at)).drop_columns([ROW_KEY]))
        return total


def scripted_table(engine: Engine, name: str, schema: pa.Schema = SCHEMA) -> ScriptedTable:
    """A new ScriptedTable of `engine`."""
    table, created = engine.get_or_create_source(ScriptedTable, name, schema)
    assert created, f"a table named {name!r} exists already"
    return table


def _moves(rng, kept: np.ndarray):
    """Order-preserving new keys for `kept` and the shifts that produce them."""
    if kept.size == 0 or rng.random() < 0.4:
        return kept, RowSetShiftData()
    gaps = np.maximum(rng.integers(-1, 4, kept.size), 1)
    new = np.cumsum(gaps) - 1 + int(rng.integers(0, 20))
    delta = new - kept
    cut = np.flatnonzero(np.diff(delta) != 0) + 1
    pieces, deltas = np.split(kept, cut), np.split(delta, cut)
    keep = [i for i, d in enumerate(deltas) if d[0] != 0]
    shifts = RowSetShiftData.build([pieces[i][0] for i in keep], [pieces[i][-1] for i in keep],
                                   [deltas[i][0] for i in keep])
    return new, shifts


def random_update(rng, prev_keys: np.ndarray, *, max_add: int = 25, span: int = 300, schema: pa.Schema = SCHEMA,
                  blink: bool = False):
    """(update, values, new keys): a random valid update from `prev_keys` and the values of its
    added and modified rows."""
    if blink:
        n = int(rng.integers(0, max_add))
        added = np.arange(n, dtype=np.int64)
        update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev_keys))
        return update, values_for(rng, added, schema), added
    gone = rng.random(prev_keys.size) < rng.choice([0.0, 0.05, 0.3])
    kept = prev_keys[~gone]
    new_kept, shifts = _moves(rng, kept)
    top = int(new_kept.max()) + span if new_kept.size else span
    free = np.setdiff1d(np.arange(0, top), new_kept)
    added = np.sort(rng.choice(free, min(free.size, int(rng.integers(0, max_add))), replace=False)).astype(np.int64)
    mod = new_kept[rng.random(new_kept.size) < rng.choice([0.0, 0.1, 0.4])]
    names = schema.names
    cols = {n for n in names if rng.random() < 0.5} or {names[0]} if mod.size else set()
    update = TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(prev_keys[gone]),
                         modified=RowSet.from_keys(mod), shifted=shifts, modified_columns=cols)
    new_keys = np.union1d(new_kept, added)
    update.validate(RowSet.from_keys(prev_keys), RowSet.from_keys(new_keys))
    changed = np.union1d(added, mod)
    return update, values_for(rng, changed, schema), new_keys


def values_for(rng, keys: np.ndarray, schema: pa.Schema = SCHEMA) -> pa.Table:
    n = keys.size
    cols = {ROW_KEY: pa.array(keys, pa.int64())}
    for f in schema:
        nulls = rng.random(n) < 0.1
        if pa.types.is_integer(f.type):
            cols[f.name] = pa.array(rng.integers(-10**6, 10**6, n), f.type, mask=nulls)
        elif pa.types.is_floating(f.type):
            cols[f.name] = pa.array(rng.normal(0, 100, n), f.type, mask=nulls)
        else:
            cols[f.name] = pa.array([f"v{x}" for x in rng.integers(0, 10**5, n).tolist()], f.type, mask=nulls)
    return pa.table(cols)
