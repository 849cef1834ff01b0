"""What a table is asked to be (`TableSpec`), its kinds, and the one check that an existing table is
what a spec or a write expects (`check_table`).

Kinds: "append" (rows only added), "keyed" (upserts and deletes by key columns), "ring" (the last
`capacity` rows), "blink" (each cycle's rows replace the last ones), "static" (never changes).
Hidden tables (a session's exports and the tables derived for them, and "__"-prefixed names) are
never listed or resolved by name; system tables (the performance tables) are resolved by name but
listed only when asked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol.schema import check_wire_schema
from tickwire.server.engine.errors import CatalogError, TableMismatchError
from tickwire.server.engine.graph.sources import AppendOnlyTable, BlinkTable, KeyedTable, RingTable
from tickwire.server.engine.graph.tables import StaticTable, Table

__all__ = ["TableSpec", "KINDS", "CLASSES", "kind_of", "is_hidden", "is_system", "check_schema", "check_table"]

KINDS = ("append", "keyed", "ring", "blink", "static")
CLASSES: dict[str, type] = {"append": AppendOnlyTable, "keyed": KeyedTable, "ring": RingTable, "blink": BlinkTable,
                            "static": StaticTable}


def kind_of(table: Table) -> str:
    """"append", "keyed", "ring", "blink", "static", or "derived" (any other table). A table class
    written as one of those kinds says so with `catalog_kind` (a history table is an append table)."""
    said = getattr(type(table), "catalog_kind", None)
    if said is not None:
        return str(said)
    for kind, cls in CLASSES.items():
        if type(table) is cls:
            return kind
    return "derived"


def is_hidden(table: Table) -> bool:
    """Tables no name reaches: session-owned ones (flagged) and "__"-prefixed names."""
    return table.hidden or table.name.startswith("__")


def is_system(table: Table) -> bool:
    """Tables made with `TableSpec.system`: reachable by name, listed only when asked."""
    return bool(getattr(table, "system", False))


def check_schema(name: str, schema: pa.Schema, attributes: Optional[Mapping[str, object]] = None) -> None:
    """Nothing is registered whose schema Deephaven's clients could not be served (with the types
    the `attributes` of an uploaded table keep)."""
    try:
        check_wire_schema(schema, attributes)
    except ProtocolError as exc:
        raise CatalogError(f"table {name!r}: {exc}") from None


@dataclass(frozen=True)
class TableSpec:
    """What a table should be. `keys` for keyed tables, `capacity` for ring tables, `data` for
    static ones (their schema is the data's). `attributes` are Deephaven table attributes. A
    `system` table is never durable and is listed only when asked. `durable`: journaled when the
    engine has a data directory (append, keyed and ring tables that are neither hidden nor system)."""

    name: str
    kind: str
    schema: Optional[pa.Schema] = None
    keys: tuple[str, ...] = ()
    capacity: Optional[int] = None
    hidden: bool = False
    data: Optional[pa.Table] = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    durable: bool = True
    system: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise CatalogError(f"unknown table kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        object.__setattr__(self, "keys", (self.keys,) if isinstance(self.keys, str) else tuple(self.keys))
        if self.kind == "static":
            if self.data is None:
                raise CatalogError(f"static table {self.name!r} needs its data")
            object.__setattr__(self, "schema", self.data.schema)
        elif self.schema is None:
            raise CatalogError(f"table {self.name!r} needs a schema")
        if self.kind == "keyed" and not self.keys:
            raise CatalogError(f"keyed table {self.name!r} needs key columns")
        if self.kind != "keyed" and self.keys:
            raise CatalogError(f"only keyed tables have key columns ({self.name!r} is {self.kind})")
        if self.kind == "ring" and (self.capacity is None or self.capacity <= 0):
            raise CatalogError(f"ring table {self.name!r} needs a positive capacity")

    @property
    def journaled(self) -> bool:
        return self.durable and not (self.hidden or self.system) and self.kind in ("append", "keyed", "ring")


def _a(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def check_table(table: Table, kind: str, schema: pa.Schema, *, keys: Iterable[str] = (), capacity: Optional[int] = None,
                mode: Optional[str] = None, where: Optional[str] = None) -> None:
    """That the existing `table` is of `kind` (with `keys`, `capacity`) and holds `schema`'s
    columns in their types; TableMismatchError otherwise, naming what differs.

    For a spec (`mode` None) the table may have more columns than the spec. For a write in a mode
    (`mode`: "append", "upsert", ...; `where` prefixes the messages) the batch's columns must be
    exactly the table's, and every difference is FAILED_PRECONDITION."""
    name = table.name
    have_kind = kind_of(table)
    prefix = where or f"table {name!r}"
    if have_kind != kind:
        if mode is None:
            raise TableMismatchError(f"table {name!r} is {_a(have_kind)} {have_kind} table, not {kind}")
        raise TableMismatchError(f"{prefix}: mode {mode!r} needs {_a(kind)} {kind} table, but the table is "
                                 f"{_a(have_kind)} {have_kind} table")
    keys = tuple(keys)
    # kind_of matched: a keyed table is a KeyedTable, a ring table a RingTable
    if kind == "keyed" and isinstance(table, KeyedTable) and tuple(table.keys) != keys:
        raise TableMismatchError(f"{prefix}: the table is keyed on {list(table.keys)}, not {list(keys)}")
    if kind == "ring" and isinstance(table, RingTable) and table.capacity != capacity:
        raise TableMismatchError(f"{prefix}: the ring table keeps {table.capacity} rows, not {capacity}")
    have = table.schema
    code = "INVALID_ARGUMENT" if mode is None else "FAILED_PRECONDITION"
    for f in schema:
        if f.name not in have.names:
            what = f"has no column {f.name!r}" if mode is None else \
                f"column {f.name!r} ({f.type}) of the batch is not in the table"
            raise TableMismatchError(f"{prefix}: {what} (columns: {', '.join(have.names)})", code)
        if have.field(f.name).type != f.type:
            if mode is None:
                raise TableMismatchError(f"{prefix}: column {f.name!r} is {have.field(f.name).type}, not {f.type}",
                                         code)
            raise TableMismatchError(f"{prefix}: column {f.name!r} is {f.type} in the batch but "
                                     f"{have.field(f.name).type} in the table; the schema of a table written in "
                                     f"a mode cannot change", code)
    if mode is not None:
        missing = [n for n in have.names if n not in schema.names]
        if missing:
            raise TableMismatchError(f"{prefix}: the batch has no column {missing[0]!r} "
                                     f"({have.field(missing[0]).type}), which the table has", code)
