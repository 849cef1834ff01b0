"""multi_join: one row per distinct key of several tables, with each table's columns for that key.

Every input names its key columns (`on`: output name -> its own column) and the columns it adds.
The key groups of all inputs share one `KeySpace`; a group's row key is its group id (first seen
first, input by input), so rows never shift: a key that leaves every input is removed and comes back
under the same row key. Each input's added columns are kept per group (the values of its one row
with that key, nulls without one), rewritten only for the groups its update touched; an input with
two rows of one key fails the table, as in Deephaven.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.column_store import ColumnStore, equal_mask
from tickwire.server.engine.graph.ops.base import _EMPTY, _Op, _unregistered_on_error
from tickwire.server.engine.graph.ops.join_keys import JoinSide, KeySpace, java_type, unknown_columns
from tickwire.server.engine.graph.ops.natural_join import take_two
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["MultiJoinTable"]

#: one input: (table, key pairs (output name, input column), added pairs (output name, input column) or None)
Input = tuple[Table, Sequence[tuple[str, str]], Optional[Sequence[tuple[str, str]]]]


class _Part:
    """One input: its side, added columns and values per group."""

    def __init__(self, space: KeySpace, table: Table, on: Sequence[tuple[str, str]],
                 joins: Sequence[tuple[str, str]]):
        self.table = table
        self.on = list(on)
        self.joins = list(joins)
        self.side = JoinSide(space, table, [c for _o, c in on])
        self.values = ColumnStore(pa.schema([table.schema.field(c).with_name(n) for n, c in joins]))

    def fill(self, groups: np.ndarray, n: int) -> None:
        if groups.size == 0:
            return
        self.values.ensure(n)
        self.values.write(groups, pa.Table.from_arrays([pa.nulls(groups.size, f.type) for f in self.values.schema],
                                                       schema=self.values.schema))


class _MultiStore:
    def __init__(self, join: "MultiJoinTable"):
        self.join = join

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        j = self.join
        names = list(columns) if columns is not None else j.schema.names
        g = np.asarray(slots, dtype=np.int64)
        got: dict[str, pa.ChunkedArray] = {}
        knames = [n for n in names if n in j.key_names]
        if knames:
            kv = j.space.key_values(g)
            got.update((n, kv.column(j.key_names.index(n))) for n in knames)
        for p in j.parts:
            mine = [n for n in names if n in p.values.schema.names]
            if mine:
                got.update(zip(mine, p.values.gather(g, mine).columns))
        return pa.Table.from_arrays([got[n] for n in names], schema=pa.schema([j.schema.field(n) for n in names]))

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class MultiJoinTable(_Op):
    """One row per key of `inputs` (see the module docstring)."""

    def __init__(self, graph: "UpdateGraph", name: str, first: Table, inputs: Sequence[Input]):
        if not inputs:
            raise OperationError("multi_join needs at least one input table")
        key_names = [o for o, _c in inputs[0][1]]
        fields: list[pa.Field] = []
        parts_spec = []
        for i, (t, on, joins) in enumerate(inputs):
            on = [(str(a), str(b)) for a, b in on]
            if not on:
                raise OperationError(f"io.deephaven.proto.backplane.grpc.MultiJoinInput must have at least one "
                                     f"columns_to_match ({i})")
            if [o for o, _c in on] != key_names:
                raise OperationError(f"Key column mismatch for table {i}, first table has key columns="
                                     f"[{', '.join(key_names)}], this table has [{', '.join(o for o, _c in on)}]")
            missing = [c for _o, c in on if c not in t.schema.names]
            if missing:
                raise unknown_columns(t, missing)
            if i == 0:
                fields = [t.schema.field(c).with_name(o) for o, c in on]
            if any(t.schema.field(c).type != f.type for (_o, c), f in zip(on, fields)):
                raise OperationError(f"Key column type mismatch for table {i}, first table has key column types="
                                     f"[{', '.join(java_type(f.type) for f in fields)}], this table has "
                                     f"[{', '.join(java_type(t.schema.field(c).type) for _o, c in on)}]")
            if joins is None:
                own = {c for _o, c in on}
                joins = [(c, c) for c in t.schema.names if c not in own]
            else:
                joins = [(str(a), str(b)) for a, b in joins]
            missing = [c for _n, c in joins if c not in t.schema.names]
            if missing:
                raise unknown_columns(t, missing)
            parts_spec.append((t, on, joins))
        owner: dict[str, int] = {}
        for i, (_t, _on, joins) in enumerate(parts_spec):
            for n, _c in joins:
                if n in key_names:
                    raise OperationError(f"Conflicting column names [{n}]")
                if n in owner:
                    raise OperationError(f"Column {n} defined in table {owner[n]} and table {i}")
                owner[n] = i
        self.key_names = key_names
        self.space = KeySpace([f.type for f in fields], reuse=True)
        self.parts = [_Part(self.space, t, on, joins) for t, on, joins in parts_spec]
        self.space.on_new.append(self._new_groups)
        self._new_groups(np.arange(self.space.n, dtype=np.int64))
        for t, _on, joins in parts_spec:
            fields += [t.schema.field(c).with_name(n) for n, c in joins]
        self._total = np.zeros(1024, dtype=np.int64)  # group -> rows over every input
        self._pinfo: Optional[list[tuple[np.ndarray, pa.Table]]] = None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, first, pa.schema(fields), others=[t for t, _o, _j in parts_spec[1:]])
            self.store = _MultiStore(self)
            touched = []
            for p in self.parts:
                ch = p.side.follow(TableUpdate(added=p.table.rowset))
                self._refresh(p, ch.touched)
                touched.append(ch.touched)
            G = unique(np.concatenate(touched)) if touched else _EMPTY
            self._count(G)
            self._commit(_EMPTY, G[self._total[G] > 0])
            self._rs = None

    def _new_groups(self, groups: np.ndarray) -> None:
        for p in getattr(self, "parts", ()):
            p.fill(groups, self.space.n)

    def _count(self, groups: np.ndarray) -> np.ndarray:
        """Updates the total row count of `groups`; returns the totals before."""
        if self.space.n > self._total.size:
            grown = np.zeros(max(self.space.n, 2 * self._total.size), dtype=np.int64)
            grown[:self._total.size] = self._total
            self._total = grown
        before = self._total[groups].copy()
        total = np.zeros(groups.size, dtype=np.int64)
        for p in self.parts:
            total += p.side.counts(groups)
        self._total[groups] = total
        out: np.ndarray = before
        return out

    def _refresh(self, p: _Part, G: np.ndarray) -> tuple[np.ndarray, pa.Table]:
        """Takes input p's values of groups G again; returns the groups whose values changed and
        their old values."""
        if G.size == 0:
            return _EMPTY, p.values.gather(_EMPTY)
        count = p.side.counts(G)
        dup = G[count > 1]
        if dup.size:
            raise OperationError(f"Duplicate key found for {self.space.describe(int(dup[0]))} in table "
                                 f"{self.parts.index(p)}.")
        rk = p.side.edge(G, front=True)
        has = rk >= 0
        idx = np.full(G.size, -1, dtype=np.int64)
        idx[has] = np.arange(int(has.sum()), dtype=np.int64)
        got = p.table.gather([c for _n, c in p.joins], rk[has])
        new = pa.Table.from_arrays([got.column(i).combine_chunks().take(pa.array(idx, mask=idx < 0))
                                    for i in range(len(p.joins))], schema=p.values.schema)
        old = p.values.gather(G)
        same = np.ones(G.size, dtype=bool)
        for i in range(len(p.joins)):
            same &= equal_mask(old.column(i).combine_chunks(), new.column(i))
        ch = ~same
        if ch.any():
            p.values.write(G[ch], new.filter(pa.array(ch)))
        return G[ch], old.filter(pa.array(ch))

    def _follow_all(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        self.space.begin_cycle()
        touched: list[np.ndarray] = []
        changed: list[np.ndarray] = []
        cols: set[str] = set()
        self._pinfo = []
        for p in self.parts:
            up = updates.get(p.table.name)
            if up is None:
                self._pinfo.append((_EMPTY, p.values.gather(_EMPTY)))
                continue
            ch = p.side.follow(up)
            G = ch.touched
            srcs = {c for _n, c in p.joins}
            if not up.modified.is_empty() and srcs & up.modified_columns:
                G = unique(np.concatenate((G, p.side.group_of.get(up.modified.keys()))))
            diff, old = self._refresh(p, G)
            order = np.argsort(diff)
            self._pinfo.append((diff[order], old.take(pa.array(order, type=pa.int64()))))
            touched.append(ch.touched)
            if diff.size:
                changed.append(diff)
                cols |= {n for n, _c in p.joins}
        T = unique(np.concatenate(touched)) if touched else _EMPTY
        before = self._count(T)
        after = self._total[T]
        added, removed = T[(before == 0) & (after > 0)], T[(before > 0) & (after == 0)]
        mod = _EMPTY
        if changed:
            C = unique(np.concatenate(changed))
            now = self._total[C] > 0
            was = now.copy()
            if T.size:
                i = np.minimum(np.searchsorted(T, C), T.size - 1)
                hit = T[i] == C
                was[hit] = before[i[hit]] > 0
            mod = C[was & now]
        if added.size == 0 and removed.size == 0 and mod.size == 0:
            return None
        self._commit(removed, added)
        modified = RowSet.from_keys(mod)
        return TableUpdate(added=RowSet.from_keys(added), removed=RowSet.from_keys(removed), modified=modified,
                           modified_columns=ModifiedColumnSet([c for c in self.schema.names if c in cols]
                                                              if mod.size else ()))

    def end_cycle(self) -> None:
        _Op.end_cycle(self)
        self._pinfo = None

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        k = self._prev_keys(keys)
        names = column_names(self.schema, columns)
        now = self.gather(names, k)
        if k.size == 0 or self._pinfo is None:
            return now
        cols = dict(zip(names, now.columns))
        for p, (diff, old) in zip(self.parts, self._pinfo):
            mine = [n for n in names if n in p.values.schema.names]
            if not mine or diff.size == 0:
                continue
            j = np.minimum(np.searchsorted(diff, k), diff.size - 1)
            hit = diff[j] == k
            vals = take_two(now.select(mine), old.select(mine), hit, j[hit])
            cols.update(zip(mine, vals.columns))
        return pa.Table.from_arrays([cols[n] for n in names], schema=now.schema)


def _multi_join(graph: "UpdateGraph", name: str, first: Table, inputs: Sequence[Input]) -> Table:
    return MultiJoinTable(graph, name, first, inputs)


register_operation("multi_join", _multi_join)
