"""Writing a batch into a table by mode: what `Engine.write` does with a `Destination`, for the
in-process Spark sinks (`tickwire.server.adapters.spark.sinks`), the staged, committed writes of
producers in other processes (`tickwire.server.engine.staging`) and anyone else who writes by
mode, so all of them make the same tables, check schemas with the same messages and apply a
batch the same way.

Modes:
- "append": rows are appended (an append-only table; a ring table of the last `max_rows` rows
  when `max_rows` is given).
- "upsert" (needs `keys`): rows replace the row with the same key or are added; with
  `delete_column` (a boolean column, not part of the table), rows where it is true delete their
  key instead. Within a batch the last row of a key wins.
- "replace" (needs `keys`): the batch is the whole new table. It is compared with the table's
  current contents by key, in bulk: only keys that appeared are added, keys that disappeared
  removed, and keys whose values changed modified (with only the changed columns marked);
  unchanged rows are not touched. The writer must be the table's only writer.
- "blink": each batch replaces the previous one entirely (a blink table).

The table is created from the first batch's schema unless it exists; an existing table must be
of the mode's kind, with the same keys and columns.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.catalog import TableSpec, check_table
from tickwire.server.engine.errors import ModeError, TableMismatchError
from tickwire.server.engine.graph.column_store import equal_mask, hash_columns
from tickwire.server.engine.graph.keyindex import KeyIndex
from tickwire.server.engine.graph.sources import KeyedTable, SourceTable
from tickwire.server.engine.graph.tables import Table

__all__ = ["MODES", "ModeError", "Destination", "ReplaceState", "KeyHashes", "last_per_key", "diff_by_key",
           "prepare_ops"]

MODES = ("append", "upsert", "replace", "blink")


# ------------------------------------------------------------------------------------------------
# bulk helpers
# ------------------------------------------------------------------------------------------------

def _key_arrays(t: pa.Table, keys: Sequence[str]) -> list[pa.Array]:
    return [t.column(k).combine_chunks() for k in keys]


class KeyHashes:
    """The key hashes of a table's rows, sorted (`sorted`, with `order` mapping them back to rows);
    `unique` tells whether no two rows share a hash (then no two rows share a key)."""

    __slots__ = ("order", "sorted", "unique")

    def __init__(self, t: pa.Table, keys: Sequence[str]):
        h = hash_columns(_key_arrays(t, keys)) if t.num_rows else np.zeros(0, dtype=np.uint64)
        self.order = np.argsort(h, kind="stable")
        self.sorted = h[self.order]
        self.unique = not bool(np.any(self.sorted[1:] == self.sorted[:-1]))


def last_per_key(t: pa.Table, keys: Sequence[str], hashes: Optional[KeyHashes] = None) -> pa.Table:
    """The last row of each key, in the order of those last rows."""
    n = t.num_rows
    if n < 2:
        return t
    if (hashes or KeyHashes(t, keys)).unique:
        return t  # distinct hashes: distinct keys
    pos = pa.array(np.arange(n, dtype=np.int64))
    last = t.select(list(keys)).append_column("__tickwire_pos", pos).group_by(list(keys), use_threads=False) \
        .aggregate([("__tickwire_pos", "max")]).column("__tickwire_pos_max").to_numpy()
    return t.take(pa.array(np.sort(last)))


def _match(old: pa.Table, old_h: KeyHashes, new: pa.Table, new_h: KeyHashes, keys: Sequence[str]) -> np.ndarray:
    """For each row of `new` (one row per key), the row of `old` (one row per key) with the same
    key, or -1."""
    old_keys, new_keys = _key_arrays(old, keys), _key_arrays(new, keys)

    def same_key(qi: np.ndarray, rows: np.ndarray) -> np.ndarray:
        ok = np.ones(qi.size, dtype=bool)
        qa, ra = pa.array(qi, pa.int64()), pa.array(rows, pa.int64())
        for o, n in zip(old_keys, new_keys):
            ok &= equal_mask(o.take(ra), n.take(qa))
        return ok

    if old_h.unique:
        # one candidate per new row: a binary search in the sorted hashes, then the keys compared
        h_new = np.empty(new.num_rows, dtype=np.uint64)
        h_new[new_h.order] = new_h.sorted
        at = np.minimum(np.searchsorted(old_h.sorted, h_new), old_h.sorted.size - 1)
        hit = np.flatnonzero(old_h.sorted[at] == h_new)
        match = np.full(new.num_rows, -1, dtype=np.int64)
        rows = old_h.order[at[hit]]
        ok = same_key(hit, rows)
        match[hit[ok]] = rows[ok]
        return match
    # two old keys share a hash (vanishingly rare): a hash index that probes past collisions
    index = KeyIndex(capacity=2 * old.num_rows)
    h_old = np.empty(old.num_rows, dtype=np.uint64)
    h_old[old_h.order] = old_h.sorted
    index.insert(h_old, np.arange(old.num_rows, dtype=np.int64))
    h_new = np.empty(new.num_rows, dtype=np.uint64)
    h_new[new_h.order] = new_h.sorted
    return index.lookup(h_new, same_key)[0]


def _diff(old: pa.Table, old_h: Optional[KeyHashes], new: pa.Table,
          keys: Sequence[str]) -> tuple[pa.Table, pa.Table, pa.Table, KeyHashes]:
    """`diff_by_key`, also returning `new` with one row per key and its KeyHashes."""
    new_h = KeyHashes(new, keys)
    if not new_h.unique:
        new = last_per_key(new, keys, new_h)
        new_h = KeyHashes(new, keys)
    if old.num_rows == 0 or new.num_rows == 0:
        return old.select(list(keys)), new, new, new_h
    if old_h is None:
        old_h = KeyHashes(old, keys)
    match = _match(old, old_h, new, new_h, keys)
    found = match >= 0
    changed = ~found
    at = np.flatnonzero(found)
    if at.size:
        before = old.take(pa.array(match[at]))
        after = new.take(pa.array(at))
        differs = np.zeros(at.size, dtype=bool)
        for name in new.column_names:
            if name not in keys:
                differs |= ~equal_mask(before.column(name), after.column(name))
        changed[at[differs]] = True
    gone = np.ones(old.num_rows, dtype=bool)
    gone[match[found]] = False
    return old.filter(pa.array(gone)).select(list(keys)), new.filter(pa.array(changed)), new, new_h


def diff_by_key(old: pa.Table, new: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, pa.Table]:
    """(keys to remove, rows to upsert) that turn `old` (one row per key) into `new` (the last row
    of each key counts): the keys of `old` missing from `new`, and the rows of `new` whose key is
    new or whose values differ (nulls equal nulls, NaN equals NaN). Bulk work only: the keys'
    hashes sorted, one binary search per row, the candidate keys and then the values of the
    matched rows compared column by column."""
    removed, upserts, _new, _h = _diff(old, None, new, keys)
    return removed, upserts


class ReplaceState:
    """What a replace-mode table holds after the last batch queued into it (the engine keeps one
    per table, so a writer made anew after a failure continues from it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rows: Optional[pa.Table] = None
        self.hashes: Optional[KeyHashes] = None  # of `rows`, kept for the next batch's diff


# ------------------------------------------------------------------------------------------------
# the destination of a write by mode
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Destination:
    """Table `name` written in one of the `MODES` (see the module documentation): `keys` for
    upsert and replace, `delete_column` (a boolean column of the batches, not of the table) for
    upsert, `max_rows` (a ring table of the last rows) for append. Options that do not go together
    raise ModeError when it is made. `what` prefixes its messages ("tickwire sink into table 't'")."""

    name: str
    mode: str = "append"
    keys: Optional[tuple[str, ...]] = None
    delete_column: Optional[str] = None
    max_rows: Optional[int] = None
    what: Optional[str] = None

    def __post_init__(self) -> None:
        where = self.where
        mode = self.mode
        if mode not in MODES:
            raise ModeError(f"{where}: mode must be one of {MODES}, got {mode!r}")
        keys = self.keys
        keys = (keys,) if isinstance(keys, str) else (tuple(keys) if keys is not None else None)
        object.__setattr__(self, "keys", keys or None)
        if mode in ("upsert", "replace") and not keys:
            raise ModeError(f"{where}: mode {mode!r} needs keys=[...]")
        if mode in ("append", "blink") and keys:
            raise ModeError(f"{where}: mode {mode!r} takes no keys")
        if self.delete_column is not None and mode != "upsert":
            raise ModeError(f"{where}: delete_column applies to mode 'upsert' only")
        if self.delete_column is not None and self.delete_column in (keys or ()):  # upsert: keys are given
            raise ModeError(f"{where}: delete_column {self.delete_column!r} is a key")
        if self.max_rows is not None and mode != "append":
            raise ModeError(f"{where}: max_rows applies to mode 'append' only")
        if self.max_rows is not None:
            if int(self.max_rows) <= 0:
                raise ModeError(f"{where}: max_rows must be positive, got {self.max_rows}")
            object.__setattr__(self, "max_rows", int(self.max_rows))

    @property
    def where(self) -> str:
        return self.what or f"tickwire sink into table {self.name!r}"

    @property
    def kind(self) -> str:
        """The kind of table the mode writes."""
        if self.mode == "append":
            return "append" if self.max_rows is None else "ring"
        return "blink" if self.mode == "blink" else "keyed"

    @property
    def extra_schema(self) -> Optional[pa.Schema]:
        """The columns a batch carries beside the table's: the delete flag in upsert mode."""
        if self.delete_column is None:
            return None
        return pa.schema([pa.field(self.delete_column, pa.bool_())])

    def table_schema(self, batch_schema: pa.Schema) -> pa.Schema:
        """The table's columns of a batch's schema (without the delete column), which must be a
        boolean column when the destination has one."""
        if self.delete_column is not None:
            if self.delete_column not in batch_schema.names:
                raise ModeError(f"{self.where}: the batch has no delete column {self.delete_column!r}")
            t = batch_schema.field(self.delete_column).type
            if t != pa.bool_():
                raise ModeError(f"{self.where}: delete column {self.delete_column!r} must be boolean, not {t}")
        return pa.schema([f for f in batch_schema if f.name != self.delete_column])

    def check_keys(self, schema: pa.Schema) -> None:
        missing = [k for k in (self.keys or ()) if k not in schema.names]
        if missing:
            raise ModeError(f"{self.where}: key column {missing[0]!r} is not in the batch (columns: "
                            f"{', '.join(schema.names)})")

    def spec(self, schema: pa.Schema) -> TableSpec:
        """The table to make for batches of `schema` (the table's columns)."""
        self.check_keys(schema)
        kind = self.kind
        return TableSpec(self.name, kind, schema, keys=tuple(self.keys or ()) if kind == "keyed" else (),
                         capacity=self.max_rows if kind == "ring" else None)

    def check_existing(self, table: Table, schema: pa.Schema) -> None:
        """ModeError unless `table` is what this destination writes, with `schema`'s columns."""
        try:
            check_table(table, self.kind, schema, keys=self.keys or (), capacity=self.max_rows, mode=self.mode,
                        where=self.where)
        except TableMismatchError as exc:
            raise ModeError(str(exc), "FAILED_PRECONDITION") from None


def prepare_ops(dest: Destination, table: SourceTable, data: pa.Table, batch_id: Optional[Hashable],
                replace: Optional[ReplaceState], timing: Optional[dict[str, Any]] = None) -> Callable[[], bool]:
    """A batch's operations (data: the table's columns in its types, then the delete column in
    upsert mode) as `put()`, which queues them under `batch_id` on `table` (a source table of the
    destination's kind) and returns False for a batch id the table already has. Replace mode
    diffs against `replace` (the table's ReplaceState). `timing` gets "rows" and, in replace mode,
    "removed" and "upserted"."""
    timing = {} if timing is None else timing
    timing["rows"] = data.num_rows
    if dest.mode == "replace":
        assert isinstance(table, KeyedTable) and replace is not None  # replace mode: a keyed table and its state
        return _prepare_replace(dest, table, data, batch_id, replace, timing)
    if dest.mode == "upsert" and dest.delete_column is not None:
        assert isinstance(table, KeyedTable) and dest.keys is not None  # upsert mode: a keyed table
        keys = list(dest.keys)
        latest = last_per_key(data, keys)
        flag = pa.array(pc.fill_null(latest.column(dest.delete_column), False).to_numpy(zero_copy_only=False))
        ops = [("delete", latest.filter(flag).select(keys)),
               ("add", latest.filter(pc.invert(flag)).drop_columns([dest.delete_column]))]

        def put() -> bool:
            return table.queue_ops(ops, batch_id=batch_id)
        return put

    def put_rows() -> bool:
        return table.queue_rows(data, batch_id=batch_id)
    return put_rows


def _prepare_replace(dest: Destination, table: KeyedTable, data: pa.Table, batch_id: Optional[Hashable],
                     state: ReplaceState, timing: dict[str, Any]) -> Callable[[], bool]:
    assert dest.keys is not None  # replace mode has keys
    keys = list(dest.keys)
    result: dict[str, Any] = {}

    def diff(base: Optional[pa.Table], base_hashes: Optional[KeyHashes]) -> list[tuple[str, pa.Table]]:
        # a table that existed before any replace-mode writer wrote it: start from its contents
        current = base if base is not None else table.to_arrow()
        removed, upserts, new, new_h = _diff(current, base_hashes, data, keys)
        result["rows"], result["hashes"] = new, new_h
        timing["removed"], timing["upserted"] = removed.num_rows, upserts.num_rows
        return [("delete", removed), ("add", upserts)]

    base = state.rows
    ops = diff(base, state.hashes)

    def put() -> bool:
        nonlocal ops
        with state.lock:
            if table.has_batch(batch_id):
                return False
            if state.rows is not base:  # another batch got in first: diff again
                ops = diff(state.rows, state.hashes)
            accepted = table.queue_ops(ops, batch_id=batch_id)
            if accepted:
                state.rows, state.hashes = result["rows"], result["hashes"]
            return accepted

    return put
