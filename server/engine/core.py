"""The engine's public calls: everything that feeds or reads tables goes through these, never
through the update graph's lock or table registry.

- **Catalog**: `get_or_create(TableSpec)` makes a table of a kind (append, keyed, ring, blink,
  static) or returns the existing one when it matches, else raises `TableMismatchError`; the schema
  is checked against the wire mapping first, so nothing unservable is ever registered.
  `resolve(name)`, `public_names()`, `tables()` and `drop(name)` (refused while derived tables or
  subscribers hold the table).
- **Ingest**: `write(table, data, ...)` queues a batch (append/upsert, or delete by key) with an
  optional batch id and, with `wait=True`, returns once the cycle that applied it has run, so the
  next call of any client reads it. `writes()` queues several writes so that one cycle applies
  them all; `wait_applied(step)` waits for a step.
- **Reading**: `reading()` holds a cycle boundary; `snapshot(table)` reads one table at one.

Hidden tables (a session's exports and the tables derived for them) are flagged `hidden`; they are
never listed and never resolved by name. System tables (`TableSpec.system`: the server's performance
tables) are resolved by name like any other but listed only when asked (`system=True`), or by
default once `list_system` is set (a server started with --show-system-tables).
"""
from __future__ import annotations

import threading
import time
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping, Optional, Sequence

import pyarrow as pa

from tickwire.errors import TickwireError
from tickwire.errors import ProtocolError
from tickwire.protocol.schema import check_wire_schema
from tickwire.server.engine.graph import AppendOnlyTable, BlinkTable, KeyedTable, RingTable, StaticTable, Table, UpdateGraph
from tickwire.server.engine.graph.sources import WriteRefused

__all__ = ["Engine", "TableSpec", "UpdateSourceTable", "CatalogError", "TableMismatchError", "TableInUseError",
           "IngestError", "KINDS", "engine_of", "kind_of", "is_hidden", "is_system"]

KINDS = ("append", "keyed", "ring", "blink", "static")
_CLASSES = {"append": AppendOnlyTable, "keyed": KeyedTable, "ring": RingTable, "blink": BlinkTable,
            "static": StaticTable}


class CatalogError(TickwireError):
    """A table cannot be made as asked (an unservable type, a bad name, keys not in the schema)."""

    code = "INVALID_ARGUMENT"


class TableMismatchError(CatalogError):
    """A table of that name exists with another kind, other keys or another schema."""

    code = "FAILED_PRECONDITION"


class TableInUseError(CatalogError):
    """A table cannot be dropped while derived tables or subscribers hold it."""

    code = "FAILED_PRECONDITION"


class IngestError(TickwireError):
    """A write a table cannot take (its schema, its kind)."""

    code = "INVALID_ARGUMENT"


def is_hidden(table: Table) -> bool:
    """Tables no name reaches: session-owned ones (flagged) and "__"-prefixed names."""
    return table.hidden or table.name.startswith("__")


def is_system(table: Table) -> bool:
    """Tables made with `TableSpec.system`: reachable by name, listed only when asked."""
    return getattr(table, "system", False)


def _check_schema(name: str, schema: pa.Schema) -> None:
    """Nothing is registered whose schema Deephaven's clients could not be served."""
    try:
        check_wire_schema(schema)
    except ProtocolError as exc:
        raise CatalogError(f"table {name!r}: {exc}") from None


def kind_of(table: Table) -> str:
    for kind, cls in _CLASSES.items():
        if type(table) is cls:
            return kind
    return "derived"


@dataclass(frozen=True)
class TableSpec:
    """What a table should be. `keys` for keyed tables, `capacity` for ring tables, `data` for
    static ones (their schema is the data's). `attributes` are Deephaven table attributes. A
    `system` table is never durable and is listed only when asked (`Engine.list_system`)."""

    name: str
    kind: str
    schema: Optional[pa.Schema] = None
    keys: tuple[str, ...] = ()
    capacity: Optional[int] = None
    hidden: bool = False
    data: Optional[pa.Table] = None
    attributes: Mapping[str, object] = field(default_factory=dict)
    durable: bool = True  # journaled when the engine has a data directory (append, keyed, ring; not hidden)
    system: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise CatalogError(f"unknown table kind {self.kind!r}; expected one of {', '.join(KINDS)}")
        object.__setattr__(self, "keys", tuple(self.keys))
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


class UpdateSourceTable(Table):
    """A source table fed whole updates by one producer (a replica following another server, a
    scripted test source): `push(op)` queues an operation of the subclass's own form from any
    thread, and the next cycle hands every queued one, in order, to the subclass's
    `apply_pending(step, ops)`, which applies them and returns their update (or None)."""

    def __init__(self, graph: UpdateGraph, name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self._queue: list = []

    def push(self, op) -> None:
        with self.graph._intake_lock:  # a cycle takes every source's input at once
            self._queue.append(op)

    def take_pending(self) -> list:
        q, self._queue = self._queue, []
        return q

    def apply_pending(self, step: int, ops: list):
        raise NotImplementedError


class _CycleWaiter:
    """Wakes threads waiting for the graph's step to reach a value (one cycle listener per graph)."""

    def __init__(self, graph: UpdateGraph):
        self.cond = threading.Condition(threading.Lock())
        self._graph = weakref.ref(graph)
        self.durable: Optional[Callable[[int], bool]] = None  # with a data directory: is a step on disk
        graph.add_cycle_listener(self._on_cycle)

    def _on_cycle(self, step: int) -> None:
        self.notify()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, step: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                graph = self._graph()
                durable = self.durable
                if graph is None or (graph.step >= step and (durable is None or durable(step))):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not graph.running:
                    return False
                self.cond.wait(min(left, 0.5))  # bounded, so that a graph stopped meanwhile is noticed


class Engine:
    """The catalog, ingest and reading calls over one update graph (one per graph: `engine_of`)."""

    def __init__(self, graph: UpdateGraph):
        self.graph = graph
        self._create = threading.Lock()
        self._waiter = _CycleWaiter(graph)
        self.storage = None  # tickwire.server.engine.storage.Storage once open_storage ran
        self.list_system = False  # whether the listings include system tables when not told

    # -- durability ---------------------------------------------------------------------------------
    def open_storage(self, data_dir, durability=None) -> list:
        """Makes the engine's source tables durable in `data_dir` (tickwire.server.engine.storage): every
        table found there comes back first (returned), then every new append, keyed or ring table
        made through `get_or_create` with `durable=True` is journaled. `errors` of the storage
        name the tables that could not be read back (their names then refuse `get_or_create`)."""
        from tickwire.server.engine.storage.store import Storage

        if self.storage is not None:
            raise CatalogError("this engine already has a data directory", "FAILED_PRECONDITION")
        storage = Storage(self, data_dir, durability)
        tables = storage.recover()
        self.storage = storage
        storage.on_durable = self._waiter.notify
        self._waiter.durable = storage.durable_through  # a write is acknowledged once it is on disk
        self.graph.set_input_journal(storage)
        return tables

    def close_storage(self) -> None:
        storage, self.storage = self.storage, None
        if storage is not None:
            self.graph.set_input_journal(None)
            storage.close()
            self._waiter.durable = None
            self._waiter.notify()

    # -- catalog ------------------------------------------------------------------------------------
    def get_or_create(self, spec: TableSpec) -> tuple[Table, bool]:
        """(table, created): the table named `spec.name`, made from `spec` unless it exists; an
        existing table must be of the spec's kind, keys and capacity and hold the spec's columns."""
        _check_schema(spec.name, spec.schema)
        missing = [k for k in spec.keys if k not in spec.schema.names]
        if missing:
            raise CatalogError(f"table {spec.name!r}: key column(s) {', '.join(map(repr, missing))} not in the schema")
        g = self.graph

        def make() -> Table:
            if spec.kind == "append":
                table = g.append_table(spec.name, spec.schema)
            elif spec.kind == "keyed":
                table = g.keyed_table(spec.name, spec.schema, list(spec.keys))
            elif spec.kind == "ring":
                table = g.ring_table(spec.name, spec.schema, int(spec.capacity))
            elif spec.kind == "blink":
                table = g.blink_table(spec.name, spec.schema)
            else:
                table = g.static_table(spec.name, spec.data)
            if spec.hidden:
                table.hidden = True
            if spec.system:
                table.system = True
            if spec.attributes:
                table.attributes.update(spec.attributes)
            storage = self.storage
            journaled = spec.durable and not (spec.hidden or spec.system) and spec.kind in ("append", "keyed", "ring")
            if storage is not None and journaled:
                try:
                    storage.attach(table, spec)
                except TickwireError:
                    g.remove_table(spec.name)  # not durable as asked: not made at all
                    raise
            return table

        storage = self.storage
        if storage is not None and spec.name in storage.errors:
            raise CatalogError(f"table {spec.name!r} was not recovered from the data directory: "
                               f"{storage.errors[spec.name]}", "FAILED_PRECONDITION")
        return self._get_or_make(spec.name, lambda existing: self._check(existing, spec), make)

    def get_or_create_source(self, cls: type, name: str, schema: pa.Schema) -> tuple[Table, bool]:
        """(table, created) for an update source of class `cls` (an UpdateSourceTable): an
        existing table of that name must be of that class with that schema."""
        if not (isinstance(cls, type) and issubclass(cls, UpdateSourceTable)):
            raise CatalogError(f"{cls!r} is not an update source class")
        _check_schema(name, schema)

        def check(existing: Table) -> None:
            if type(existing) is not cls or not existing.schema.equals(schema):
                raise TableMismatchError(f"a different table named {name!r} exists")

        return self._get_or_make(name, check, lambda: cls(self.graph, name, schema))

    def _get_or_make(self, name: str, check, make) -> tuple[Table, bool]:
        """The existing table `name` once `check(table)` accepts it, else `make()` under the
        catalog's lock; the graph's refusals become CatalogError."""
        with self._create:
            existing = self.graph.tables.get(name)
            if existing is not None:
                check(existing)
                return existing, False
            try:
                return make(), True
            except (ValueError, KeyError, TypeError) as exc:
                raise CatalogError(f"cannot create table {name!r}: {exc}") from None

    @staticmethod
    def _check(table: Table, spec: TableSpec) -> None:
        want = _CLASSES[spec.kind]
        if type(table) is not want:
            raise TableMismatchError(f"table {spec.name!r} is a {kind_of(table)} table, not {spec.kind}")
        if spec.kind == "keyed" and tuple(table.keys) != spec.keys:
            raise TableMismatchError(f"table {spec.name!r} is keyed on {list(table.keys)}, not {list(spec.keys)}")
        if spec.kind == "ring" and table.capacity != spec.capacity:
            raise TableMismatchError(f"ring table {spec.name!r} keeps {table.capacity} rows, not {spec.capacity}")
        have = table.schema
        for f in spec.schema:
            if f.name not in have.names:
                raise TableMismatchError(f"table {spec.name!r} has no column {f.name!r} (columns: "
                                         f"{', '.join(have.names)})", "INVALID_ARGUMENT")
            if have.field(f.name).type != f.type:
                raise TableMismatchError(f"table {spec.name!r}: column {f.name!r} is {have.field(f.name).type}, "
                                         f"not {f.type}", "INVALID_ARGUMENT")

    def resolve(self, name: str, *, hidden: bool = False) -> Optional[Table]:
        """The table named `name`, or None (hidden tables only with `hidden=True`)."""
        t = self.graph.tables.get(name)
        if t is None or (is_hidden(t) and not hidden):
            return None
        return t

    def _listed(self, table: Table, hidden: bool, system: Optional[bool]) -> bool:
        if is_hidden(table):
            return hidden
        if is_system(table):
            return hidden or (self.list_system if system is None else system)
        return True

    def public_names(self, *, system: Optional[bool] = None) -> list[str]:
        """The names of the tables that are not hidden, in creation order (system tables when
        `system`, by default when `list_system`)."""
        return [t.name for t in self.tables(system=system)]

    def names_now(self, *, system: Optional[bool] = None) -> tuple[str, ...]:
        """The public names as they are now, without waiting for a cycle boundary.

        A cycle holds the graph's lock for as long as it runs (seconds, for a large table), and
        which tables exist does not depend on one: tables are added and removed under the lock by
        replacing entries of the registry, and copying a dict's values is atomic in CPython, so the
        copy is the set of tables before or after any such change (as `resolve` sees them)."""
        for _attempt in range(8):
            try:
                tables = list(self.graph.tables.values())
                break
            except RuntimeError:  # changed during the copy (only possible without the GIL's guarantee)
                continue
        else:
            tables = list(dict(self.graph.tables).values())
        return tuple(t.name for t in tables if self._listed(t, False, system))

    def tables(self, *, hidden: bool = False, system: Optional[bool] = None) -> list[Table]:
        """The tables, at a cycle boundary (hidden ones only with `hidden=True`, which includes the
        system ones; system ones with `system=True`, by default when `list_system`)."""
        with self.graph.lock:
            return [t for t in self.graph.tables.values() if self._listed(t, hidden, system)]

    def drop(self, name: str) -> None:
        """Removes a table; refused while tables derived from it or subscribers hold it."""
        with self.graph.lock:
            table = self.graph.tables.get(name)
            if table is None:
                raise CatalogError(f"no table named {name!r}", "NOT_FOUND")
            children = [t.name for t in self.graph.tables.values() if table in t.parents]
            if children:
                raise TableInUseError(f"table {name!r} is held by the tables derived from it: "
                                      f"{', '.join(map(repr, children[:5]))}")
            if table.listeners:
                raise TableInUseError(f"table {name!r} has {len(table.listeners)} subscriber(s) or listener(s)")
            self.graph.remove_table(name)
            if self.storage is not None:
                self.storage.detach(table, delete=True)  # a dropped table is gone, from disk too

    def remove_unused(self, table: Table) -> bool:
        """Removes a table nothing derives from any more; True when it is gone (now or before),
        False when a table still derives from it. For the owner of session tables (exports and
        the tables derived for them)."""
        with self.graph.lock:
            if self.graph.tables.get(table.name) is not table:
                return True
            if any(table in t.parents for t in self.graph.tables.values()):
                return False
            self.graph.remove_table(table.name)
            return True

    # -- ingest -------------------------------------------------------------------------------------
    def write(self, table: Table, data=None, *, delete=None, batch_id=None, wait: bool = True,
              timeout: float = 30.0) -> bool:
        """Queues `data` (rows to append or upsert) and/or `delete` (keys to remove, keyed tables)
        under `batch_id`; False when that batch id was applied before (nothing is queued). With
        `wait`, returns once a cycle has applied the write (at once when no cycle thread runs:
        the caller steps the graph)."""
        ok = _Writes().write(table, data, delete=delete, batch_id=batch_id)
        if ok and wait:
            self.flush(timeout)
            refusal = getattr(table, "refusal", None)
            if refusal is not None:  # the cycle could not make the write durable: it was not applied
                raise IngestError(f"table {table.name!r} takes no writes: {refusal}", "UNAVAILABLE")
        return ok

    def flush(self, timeout: float = 30.0) -> None:
        """Returns once every write queued before the call has been applied by a cycle (at once
        when no cycle thread runs: the caller steps the graph)."""
        if not self.graph.running:
            return
        with self.graph.lock:  # after any cycle that may have taken them already: the next one surely will
            target = self.graph.step + 1
        if not self._waiter.wait_for(target, timeout):
            raise IngestError(f"the update graph did not apply a write within {timeout:.0f} s", "UNAVAILABLE")

    @contextmanager
    def writes(self, *, wait: bool = True, timeout: float = 30.0) -> Iterator["_Writes"]:
        """Queues several writes for one cycle: `with engine.writes() as w: w.write(...); ...`.
        No cycle starts while the block runs; with `wait`, leaving it waits for the cycle that
        applies them all."""
        w = _Writes()
        with self.graph.lock:  # no cycle runs meanwhile: the next one to start takes every write
            yield w
            target = self.graph.step + 1
        if wait and w.queued and self.graph.running:
            if not self._waiter.wait_for(target, timeout):
                raise IngestError(f"the update graph did not apply a write within {timeout:.0f} s", "UNAVAILABLE")

    def wait_applied(self, step: int, timeout: float = 30.0) -> bool:
        """Waits until the graph has run step `step` (False on timeout or when it is not running)."""
        return self._waiter.wait_for(step, timeout)

    # -- reading ------------------------------------------------------------------------------------
    @contextmanager
    def reading(self):
        """Holds a cycle boundary: every table read inside is at the same step (`step`)."""
        with self.graph.lock:
            yield self

    @property
    def step(self) -> int:
        return self.graph.step

    def snapshot(self, table: Table, columns: Optional[Sequence[str]] = None) -> tuple[int, pa.Table]:
        return self.graph.snapshot(table, columns)


class _Writes:
    def __init__(self):
        self.queued = 0

    def run(self, put) -> bool:
        """Runs `put()`, a write of the caller's own (through a table's add/apply_ops); its truth
        says whether it queued anything."""
        ok = bool(put())
        if ok:
            self.queued += 1
        return ok

    def write(self, table: Table, data=None, *, delete=None, batch_id=None) -> bool:
        if not hasattr(table, "add"):
            raise IngestError(f"table {table.name!r} is a {kind_of(table)} table; it takes no writes",
                              "FAILED_PRECONDITION")
        try:
            if delete is not None:
                if not hasattr(table, "apply_ops"):
                    raise IngestError(f"table {table.name!r} is not keyed; rows cannot be deleted by key")
                ops = ([("add", data)] if data is not None else []) + [("delete", delete)]
                ok = table.apply_ops(ops, batch_id=batch_id)
            else:
                ok = table.add(data, batch_id=batch_id)
        except IngestError:
            raise
        except WriteRefused as exc:
            raise IngestError(str(exc), "UNAVAILABLE") from None
        except (ValueError, TypeError, KeyError, pa.ArrowInvalid) as exc:
            raise IngestError(f"write into {table.name!r}: {exc}") from None
        if ok:
            self.queued += 1
        return ok


_engines: "weakref.WeakKeyDictionary[UpdateGraph, Engine]" = weakref.WeakKeyDictionary()
_engines_lock = threading.Lock()


def engine_of(graph: UpdateGraph) -> Engine:
    """The engine of `graph` (one per graph)."""
    with _engines_lock:
        e = _engines.get(graph)
        if e is None:
            e = _engines[graph] = Engine(graph)
        return e
