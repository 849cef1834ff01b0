"""view and select: columns of the parent kept, renamed or computed."""
from __future__ import annotations

import time
from typing import TYPE_CHECKING, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.column_store import ColumnStore
from tickwire.server.engine.graph.graph import TableFailedError
from tickwire.server.engine.graph.keymap import KeyMap
from tickwire.server.engine.graph.ops.base import (
    _EMPTY,
    _evaluate,
    _first_keys,
    _Op,
    _unregistered_on_error,
    expression_columns,
    shifted_rows,
)
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.table_update import ModifiedColumnSet, TableUpdate, column_names
from tickwire.server.engine.graph.tables import ColumnSpecs, Rows, Table, register_operation

if TYPE_CHECKING:
    from tickwire.server.engine.graph.graph import UpdateGraph

__all__ = ["ProjectTable", "ROW_VARIABLES"]

#: Deephaven's row variables: the row's position (i, ii) and row key (k)
ROW_VARIABLES = (pa.field("i", pa.int32()), pa.field("ii", pa.int64()), pa.field("k", pa.int64()))


class _ViewStore:
    """Storage of a view, addressed by the parent's storage slots: plain and renamed columns are
    the parent's, computed columns are evaluated on the parent's values at the same slots."""

    def __init__(self, table: "ProjectTable"):
        self.table = table
        self.schema = table.schema

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        t = self.table
        names = list(columns) if columns is not None else self.schema.names
        computed = [n for n in names if t.sources[n] is None]
        need = list(dict.fromkeys([s for n in names if (s := t.sources[n]) is not None]
                                  + sorted({c for n in computed for c in t.inputs[n]})))
        base = t.parent.store.gather(slots, need) if need else pa.table({"_": pa.nulls(len(slots))})
        if t.failure is not None:
            raise TableFailedError(t.failure)
        try:
            return t.assemble(names, base, base, slots.size)
        except Exception as exc:  # a formula that raises on these values fails the view
            raise TableFailedError(t.graph.fail(t, "computing its columns", exc)) from exc

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class _SelectStore:
    """Storage of a select, addressed by its own slots (one per row, found by row key): computed
    columns are stored, plain and renamed columns are read from the parent by row key."""

    def __init__(self, table: "ProjectTable"):
        self.table = table
        self.schema = table.schema

    def gather(self, slots: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        t = self.table
        names = list(columns) if columns is not None else self.schema.names
        plain = list(dict.fromkeys(s for n in names if (s := t.sources[n]) is not None))
        computed = [n for n in names if t.sources[n] is None]
        base = t.parent.gather(plain, t.key_of_slot[slots]) if plain else None
        assert t.computed_store is not None  # a select stores its computed columns
        stored = t.computed_store.gather(slots, computed) if computed else None
        return t.assemble(names, base, stored, slots.size)

    def gather_column(self, name: str, slots: np.ndarray) -> pa.Array:
        return self.gather(slots, [name]).column(0).combine_chunks()


class ProjectTable(_Op):
    """Columns of the parent (kept, renamed) and columns computed from pyarrow compute
    expressions, under the parent's row keys. A `view` (materialize=False) computes on read; a
    `select` stores the computed columns, by its own row keys, and recomputes them for added
    rows and for modified rows whose inputs changed. A modification is reported only on the
    columns whose inputs the parent modified."""

    def __init__(self, graph: "UpdateGraph", name: str, parent: Table, columns: ColumnSpecs,
                 materialize: bool = False, row_variables: bool = False):
        # row_variables: expressions may read the row's position ("i" int32, "ii" int64) and row key
        # ("k"), Deephaven's formula variables; only for tables whose rows never move (static or
        # append-only), whose values are computed once, when the row arrives
        self.row_variables = [f for f in ROW_VARIABLES if f.name not in parent.schema.names] if row_variables else []
        if self.row_variables and parent.is_refreshing and not (
                parent.attributes.get("AppendOnly") or parent.attributes.get("AddOnly")):
            raise OperationError(f"table {name!r}: the row variables i, ii and k need a static or append-only "
                                 f"table ({parent.name!r} is neither)")
        pschema = pa.schema(list(parent.schema) + self.row_variables)
        specs = self._parse(columns, pschema)
        self.sources: dict[str, Optional[str]] = {}
        self.exprs: dict[str, pc.Expression] = {}
        self.inputs: dict[str, list[str]] = {}
        fields = []
        empty = pa.table({f.name: pa.array([], f.type) for f in pschema})
        for out, spec in specs:
            if out in self.sources:
                raise OperationError(f"table {name!r}: column {out!r} is given twice")
            if isinstance(spec, str) and spec in {f.name for f in self.row_variables}:
                spec = pc.field(spec)
            if isinstance(spec, str):
                field = parent.schema.field(column_names(parent.schema, [spec])[0])
                self.sources[out] = spec
                self.inputs[out] = [spec]
                fields.append(pa.field(out, field.type, field.nullable, field.metadata))
            else:
                typ = _evaluate(empty, [spec], [out]).schema.field(0).type
                self.sources[out] = None
                self.exprs[out] = spec
                self.inputs[out] = expression_columns(spec, pschema)
                fields.append(pa.field(out, typ))
        schema = pa.schema(fields)
        self.materialize = (bool(materialize) or bool(self.row_variables)) and bool(self.exprs)
        self.computed_store: Optional[ColumnStore] = None
        with graph.lock, _unregistered_on_error(graph, self):
            _Op.__init__(self, graph, name, parent, schema)
            self.attributes = {k: v for k, v in parent.attributes.items()
                               if k in ("AddOnly", "AppendOnly", "BlinkTable")}
            if self.materialize:
                self.computed_store = ColumnStore(pa.schema([schema.field(n) for n in self.exprs]))
                self._slot_of = KeyMap()
                self.key_of_slot = np.full(1024, -1, dtype=np.int64)
                self._free = _EMPTY.copy()
                self._next_slot = 0
                self.store = _SelectStore(self)
                self._store_rows(parent.rowset.keys())
            else:
                self.store = _ViewStore(self)

    @staticmethod
    def _parse(columns: ColumnSpecs, schema: pa.Schema) -> list[tuple[str, Union[str, pc.Expression]]]:
        items: list[tuple[str, Union[str, pc.Expression]]]
        if isinstance(columns, dict):
            items = list(columns.items())
        else:
            if isinstance(columns, (str, tuple)):
                columns = [columns]
            items = []
            for c in columns:
                if isinstance(c, str):
                    items.append((c, c))
                elif isinstance(c, tuple) and len(c) == 2 and isinstance(c[0], str):
                    items.append(c)
                else:
                    raise OperationError(f"a column is a name or a (name, column name or Expression) pair, got {c!r}")
        for out, spec in items:
            if not isinstance(spec, (str, pc.Expression)):
                raise OperationError(f"column {out!r}: expected a column name or a pyarrow Expression, "
                                f"got {type(spec).__name__}")
        return items

    def assemble(self, names: Sequence[str], base: Optional[pa.Table], computed_src: Optional[pa.Table],
                 n: int) -> pa.Table:
        """Output columns from the parent's columns (`base`) and, for computed columns, either
        stored values (select) or values evaluated on `computed_src` (view)."""
        computed = [n_ for n_ in names if self.sources[n_] is None]
        values = {}
        if computed:
            assert computed_src is not None  # given whenever computed columns are asked for
            if self.materialize:
                values = {c: computed_src.column(c) for c in computed}
            else:
                inputs = sorted({c for c in computed for c in self.inputs[c]})
                src = computed_src.select(inputs) if inputs else pa.table({"_": pa.nulls(n)})
                got = _evaluate(src, [self.exprs[c] for c in computed], computed)
                values = {c: got.column(c) for c in computed}
        arrays = []
        for c in names:
            source = self.sources[c]
            if source is None:
                col = values[c]
            else:
                assert base is not None  # given whenever plain columns are asked for
                col = base.column(source)
            want = self.schema.field(c).type
            arrays.append(col.cast(want) if col.type != want else col)
        return pa.Table.from_arrays(arrays, schema=pa.schema([self.schema.field(c) for c in names]))

    # rows are the parent's
    @property
    def rowset(self) -> RowSet:
        return self.parent.rowset

    @rowset.setter
    def rowset(self, value: RowSet) -> None:
        pass

    @property
    def prev_rowset(self) -> Optional[RowSet]:
        return self.parent.prev_rowset if self._update is not None else None

    @prev_rowset.setter
    def prev_rowset(self, value: Optional[RowSet]) -> None:
        pass

    @property
    def size(self) -> int:
        return self.parent.size

    def _edge_keys(self, n: int, front: bool) -> np.ndarray:
        return _first_keys(self.parent, n, front)

    def slots(self, keys: np.ndarray) -> np.ndarray:
        if self.materialize:
            return self._slot_of.get(np.asarray(keys, dtype=np.int64))
        return self.parent.slots(keys)

    # -- the stored columns of a select ---------------------------------------------------------
    def _store_rows(self, keys: np.ndarray) -> None:
        """Gives rows new slots (reusing freed ones) and stores their computed values."""
        if keys.size == 0:
            return
        reuse = min(self._free.size, keys.size)
        slots = np.concatenate((self._free[self._free.size - reuse:],
                                np.arange(self._next_slot, self._next_slot + keys.size - reuse, dtype=np.int64)))
        self._free = self._free[:self._free.size - reuse]
        self._next_slot += keys.size - reuse
        if self._next_slot > self.key_of_slot.size:
            size = self.key_of_slot.size
            while size < self._next_slot:
                size *= 2
            grown = np.full(size, -1, dtype=np.int64)
            grown[:self.key_of_slot.size] = self.key_of_slot
            self.key_of_slot = grown
        self._slot_of.set(keys, slots)
        self.key_of_slot[slots] = keys
        self._compute(keys, slots)

    def _compute(self, keys: np.ndarray, slots: np.ndarray) -> None:
        if keys.size == 0:
            return
        names = list(self.exprs)
        inputs = sorted({c for n in names for c in self.inputs[n]})
        virtual = {f.name for f in self.row_variables}
        real = [c for c in inputs if c not in virtual]
        src = self.parent.gather(real, keys) if real else pa.table({"_": pa.nulls(keys.size)})
        if virtual & set(inputs):
            rs = self.parent.rowset
            pos = keys - rs.first() if rs.is_single_range else np.searchsorted(rs.keys(), keys)
            made = {"i": pa.array(pos.astype(np.int32)), "ii": pa.array(pos.astype(np.int64)),
                    "k": pa.array(keys.astype(np.int64))}
            for f in self.row_variables:
                if f.name in inputs:
                    src = src.append_column(f.name, made[f.name])
        got = _evaluate(src, [self.exprs[n] for n in names], names)
        store = self.computed_store
        assert store is not None  # a select stores its computed columns
        got = pa.Table.from_arrays([got.column(n).cast(self.schema.field(n).type) for n in names],
                                   schema=store.schema)
        store.ensure(int(slots.max()) + 1)
        store.write(slots, got)

    def prev_gather(self, columns: Optional[Sequence[str]] = None, keys: Optional[Rows] = None) -> pa.Table:
        names = column_names(self.schema, columns)
        k = self._prev_keys(keys)
        if k.size == 0:
            return self.gather(names, k)
        need = sorted({c for n in names for c in self.inputs[n]})
        prev = self.parent.prev_gather(need, k)
        materialize, self.materialize = self.materialize, False  # evaluate on the previous inputs
        try:
            return self.assemble(names, prev, prev, k.size)
        finally:
            self.materialize = materialize

    def _follow(self, step: int, up: TableUpdate) -> TableUpdate:
        changed = {out for out, ins in self.inputs.items() if set(ins) & up.modified_columns}
        if self.materialize:
            if not up.removed.is_empty():
                rk = up.removed.keys()
                slots = self._slot_of.get(rk)
                self._slot_of.delete(rk)
                self.key_of_slot[slots] = -1
                self._free = np.concatenate((self._free, slots))
            if not up.shifted.is_empty():
                old, new = shifted_rows(self.parent, up)
                if old.size:
                    self._slot_of.remap(old, new)
                    self.key_of_slot[self._slot_of.get(new)] = new
            self._store_rows(up.added.keys())
            if {n for n in changed if self.sources[n] is None} and not up.modified.is_empty():
                mk = up.modified.keys()
                self._compute(mk, self._slot_of.get(mk))
        self._moves = getattr(self.parent, "_moves", None)
        mod = up.modified if changed else RowSet()
        return TableUpdate(added=up.added, removed=up.removed, modified=mod, shifted=up.shifted,
                           modified_columns=ModifiedColumnSet(changed if not mod.is_empty() else ()))

    def follow_parents(self, step: int, updates: dict[str, TableUpdate]) -> Optional[TableUpdate]:
        up = updates.get(self.parent.name)
        if up is None:
            return None
        t0 = time.perf_counter()
        update: Optional[TableUpdate]
        update = self._follow(step, up)
        if update.is_empty():
            update = None
        self._update = update
        self.cycle_seconds.append(time.perf_counter() - t0)
        if len(self.cycle_seconds) > 1000:
            del self.cycle_seconds[:-1000]
        return update

    def end_cycle(self) -> None:
        self._prev = None
        self._update = None
        self._moves = None


register_operation("view", lambda graph, name, parent, columns: ProjectTable(graph, name, parent, columns, False))
register_operation("select", lambda graph, name, parent, columns: ProjectTable(graph, name, parent, columns, True))
register_operation("select_numbered",
                   lambda graph, name, parent, columns: ProjectTable(graph, name, parent, columns, True, True))
