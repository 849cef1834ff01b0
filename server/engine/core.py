"""The engine: one object, built once, that owns the update graph, the catalog, the one write path,
staging, storage, the performance tables and the clock. Everything above it (the gRPC services,
the web side, the Spark sinks, replicas, the demo, tests) is handed an `Engine` and uses its calls;
nothing else names the graph, its lock or its private state. Two engines in one process share
nothing.

    engine = Engine(EngineConfig(interval_ms=100))      # or Engine(interval_ms=100)
    trades, _ = engine.get_or_create(TableSpec("trades", "keyed", schema, keys=("Sym",)))
    engine.start()                                      # the cycle thread (tests step run_cycle())
    engine.write(trades, batch)                         # returns once a cycle applied it
    step, rows = engine.snapshot(trades)
    engine.stop()

- **Lifecycle**: `open()` brings back the tables of the data directory (when the config has one);
  `start()` opens and starts the cycle thread; `run_cycle()` runs one cycle now (deterministic
  stepping); `stop()` ends the thread and closes the data directory.
- **Catalog**: `get_or_create(TableSpec)` makes a table of a kind (append, keyed, ring, blink,
  static) or returns the existing one when it matches, else raises `TableMismatchError`; the
  schema is checked against the wire mapping first, so nothing unservable is ever registered.
  `resolve(name)`, `public_names()`, `tables()` and `drop(name)` (refused while derived tables or
  subscribers hold the table).
- **Ingest**: `write(target, data, ...)` is the only way rows enter a table. `target` is a source
  table, a `TableSpec` (made unless it exists), or a `Destination` (a table written by mode:
  append, upsert, replace, blink); an optional batch id makes the write happen once. With
  `wait=True` it returns once the cycle that applied it has run (and, for a durable table, once
  it is on disk), so the next call of any client reads it. `writes()` queues several writes so
  that one cycle applies them all.
- **Reading**: `reading()` holds a cycle boundary (no cycle runs inside it); `writing()` holds
  it to change what tables exist or who holds them; `snapshot(table)` reads one table at one.
- **Publishing**: `publishers(config)` is a registry of a server's publishers over this engine.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import weakref
from contextlib import contextmanager
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Hashable, Iterator, Mapping, Optional, Sequence, Union
from urllib.parse import quote

import pyarrow as pa
import pyarrow.fs as pafs

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.server.engine.catalog import (
    CLASSES,
    KINDS,
    TableSpec,
    check_schema,
    check_table,
    is_hidden,
    is_system,
    kind_of,
)
from tickwire.server.engine.config import Durability, EngineConfig, PublishingConfig
from tickwire.server.engine.errors import (
    CatalogError,
    IngestError,
    ModeError,
    TableInUseError,
    TableMismatchError,
    TickwireError,
    WriteTimeout,
)
from tickwire.server.engine.graph.column_store import check_hashable
from tickwire.server.engine.graph.graph import CycleErrorRecord, TableFailure, UpdateGraph
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.sources import KeyedTable, SourceTable, UpdateSourceTable
from tickwire.server.engine.graph.table_update import TableUpdate
from tickwire.server.engine.graph.tables import Table, TableInput, as_table
from tickwire.server.engine.ingest import Destination, ReplaceState, prepare_ops
from tickwire.server.engine.perf_tables import PerfTables
from tickwire.server.engine.publishing.publisher import PublisherRegistry
from tickwire.server.engine.staging import Staging
from tickwire.server.engine.storage.store import Storage, StorageError

__all__ = ["Engine", "TableSpec", "Destination", "UpdateSourceTable", "CatalogError", "TableMismatchError",
           "TableInUseError", "IngestError", "KINDS", "kind_of", "is_hidden", "is_system"]

if TYPE_CHECKING:
    from tickwire.server.engine.storage.history import HistoryTable

log = logging.getLogger(__name__)


def history_index_path(data_dir: Union[str, os.PathLike[str]], name: str) -> Path:
    """Where the location index of history table `name` lives in a data directory."""
    return Path(data_dir) / "history" / f"{quote(name, safe='')}.json"

Target = Union[Table, TableSpec, Destination]


class _CycleWaiter:
    """Wakes threads waiting for the graph's step to reach a value (one cycle listener per engine)."""

    def __init__(self, graph: UpdateGraph, clock: Clock):
        self.cond = threading.Condition(threading.Lock())
        self._graph = weakref.ref(graph)
        self._clock = clock
        self.durable: Optional[Callable[[int], bool]] = None  # with a data directory: is a step on disk
        graph.add_cycle_listener(self._on_cycle)

    def _on_cycle(self, step: int) -> None:
        self.notify()

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def wait_for(self, step: int, timeout: float) -> bool:
        clock = self._clock
        deadline = clock.monotonic() + timeout
        with self.cond:
            while True:
                graph = self._graph()
                durable = self.durable
                if graph is None or (graph.step >= step and (durable is None or durable(step))):
                    return True
                if clock.monotonic() >= deadline or not graph.running:
                    return False
                # bounded, so that a graph stopped meanwhile (or a manual clock moved) is noticed
                self.cond.wait(0.05)


class Engine:
    """See the module documentation. `config` (EngineConfig) or its fields as keywords
    (`Engine(interval_ms=50)`); `clock` is read for everything time decides (a ManualClock in
    tests)."""

    def __init__(self, config: Optional[EngineConfig] = None, *, clock: Optional[Clock] = None, **options: Any):
        if options:
            config = dataclasses.replace(config or EngineConfig(), **options)
        self.config = config or EngineConfig()
        self.clock: Clock = clock or SYSTEM_CLOCK
        # the update graph: engine-internal; nothing outside tickwire.server.engine reads it
        self.graph = UpdateGraph(self.config.interval_ms, self.config.max_errors, clock=self.clock)
        # the catalog's lock: taken only inside the graph's (`_catalog`), because code that holds the
        # graph's lock (a block of writes) makes tables, and making a table takes the graph's lock
        self._create = threading.RLock()
        self._pending_history: dict[str, str] = {}  # own-location history tables made by their first write: column
        self._waiter = _CycleWaiter(self.graph, self.clock)
        self.storage: Optional[Storage] = None
        self.recovered: list[SourceTable] = []  # tables the data directory brought back (`open`)
        self.staging = Staging(self, self.config.staging, clock=self.clock)
        self.perf: Optional[PerfTables] = None
        if self.config.perf_tables is not None:
            self.perf = PerfTables(self, self.config.perf_tables)
        self._replace: "weakref.WeakKeyDictionary[Table, ReplaceState]" = weakref.WeakKeyDictionary()
        self._opened = False
        self._data_dir: Optional[Path] = None  # the data directory being opened (open_storage)
        self.user_tables: dict[str, Any] = {}  # name -> storage.users.Definition, of the tables served
        self.user_errors: list[str] = []  # user tables that could not be served, and why

    def __repr__(self) -> str:
        return f"Engine(step={self.step}, tables={len(self.graph.tables)}, running={self.running})"

    # -- lifecycle ----------------------------------------------------------------------------------
    def open(self) -> "Engine":
        """Brings back the tables of the configured data directory (once; `recovered` lists them,
        `storage.errors` names those that could not be read). Before anything is served, so that
        no client sees a table that is still coming back."""
        if not self._opened:
            self._opened = True
            if self.config.data_dir is not None and self.storage is None:
                self.recovered = self.open_storage(self.config.data_dir, self.config.durability)
        return self

    def start(self) -> "Engine":
        """Opens, then starts the cycle thread (one cycle every `interval_ms`)."""
        self.open()
        if not self.graph.running:
            self.graph.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the cycle thread, then writes out and closes the data directory."""
        self.graph.stop(timeout)
        self.close_storage()

    def run_cycle(self) -> dict[str, TableUpdate]:
        """Runs one cycle now; returns the updates by table name (for callers that step the engine
        themselves instead of starting its thread)."""
        return self.graph.run_cycle()

    @property
    def running(self) -> bool:
        return self.graph.running

    @property
    def step(self) -> int:
        """The logical clock: the number of the last cycle run."""
        return self.graph.step

    @property
    def interval_ms(self) -> float:
        return self.graph.interval_ms

    @property
    def errors(self) -> Sequence[CycleErrorRecord]:
        """What failed in recent cycles (a source's input, a listener), newest last."""
        return tuple(self.graph.errors)

    @property
    def cycle_seconds(self) -> Sequence[float]:
        """How long the recent cycles took, newest last."""
        return tuple(self.graph.cycle_seconds)

    @property
    def cycle_updates(self) -> Mapping[str, TableUpdate]:
        """Inside a cycle listener: each changed table's update of the calling cycle, by name
        (empty outside a cycle)."""
        return MappingProxyType(self.graph.cycle_updates)

    def add_cycle_listener(self, fn: Callable[[int], None]) -> None:
        """`fn(step)` runs at the end of every cycle (in the cycle, inside `reading()`)."""
        self.graph.add_cycle_listener(fn)

    def remove_cycle_listener(self, fn: Callable[[int], None]) -> None:
        self.graph.remove_cycle_listener(fn)

    def __enter__(self) -> "Engine":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- durability ---------------------------------------------------------------------------------
    def open_storage(self, data_dir: Union[str, os.PathLike[str]],
                     durability: Optional[Durability] = None) -> list[SourceTable]:
        """Makes the engine's source tables durable in `data_dir` (tickwire.server.engine.storage):
        every table found there comes back first (returned), then every new append, keyed or ring
        table made through `get_or_create` with `durable=True` is journaled. `storage.errors`
        names the tables that could not be read back (their names then refuse `get_or_create`)."""
        if self.storage is not None:
            raise CatalogError("this engine already has a data directory", "FAILED_PRECONDITION")
        storage = Storage(self, Path(data_dir), durability, clock=self.clock)
        self._data_dir = Path(data_dir)
        self._open_user_tables()  # before recovery: a partitioned one's intraday rows come back into it
        tables = storage.recover()
        self._journal_history(storage)
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
    @contextmanager
    def _catalog(self) -> Iterator[None]:
        """The catalog's lock, taken after the graph's: always in that order, so that a block of
        writes (the graph's lock held) that makes a table cannot wait for a thread that holds the
        catalog and waits for the graph."""
        with self.graph.lock, self._create:
            yield

    def get_or_create(self, spec: TableSpec) -> tuple[Table, bool]:
        """(table, created): the table named `spec.name`, made from `spec` unless it exists; an
        existing table must be of the spec's kind, keys and capacity and hold the spec's columns."""
        schema = spec.schema
        assert schema is not None  # TableSpec.__post_init__ sets it (from the data of a static table)
        check_schema(spec.name, schema, spec.attributes)
        missing = [k for k in spec.keys if k not in schema.names]
        if missing:
            raise CatalogError(f"table {spec.name!r}: key column(s) {', '.join(map(repr, missing))} not in the schema")
        for k in spec.keys:
            if not check_hashable(schema.field(k).type):
                raise CatalogError(f"table {spec.name!r}: key column {k!r} has type {schema.field(k).type}, which "
                                   f"cannot be a key (use numbers, booleans, temporal types, strings or binaries)")
        storage = self.storage
        if storage is not None and spec.name in storage.errors:
            raise CatalogError(f"table {spec.name!r} was not recovered from the data directory: "
                               f"{storage.errors[spec.name]}", "FAILED_PRECONDITION")
        with self._catalog():
            column = self._pending_history.get(spec.name)
            if column is not None and self.resolve(spec.name, hidden=True) is None:
                # a history table of its own locations, made by its first write
                if spec.kind != "append":
                    raise CatalogError(f"table {spec.name!r} is a history table (--history): its rows are "
                                       f"appended, not {spec.kind}", "FAILED_PRECONDITION")
                if column not in schema.names:
                    raise CatalogError(f"history table {spec.name!r} is partitioned by {column!r}, a column its "
                                       f"rows must have", "INVALID_ARGUMENT")
                made = self.history(spec.name, schema=schema, column=column)
                assert made is not None
                return made, True

        def check(existing: Table) -> None:
            check_table(existing, spec.kind, schema, keys=spec.keys, capacity=spec.capacity)

        return self._get_or_make(spec.name, check, lambda: self._make(spec))

    def create(self, spec: TableSpec) -> Table:
        """A new table made from `spec`; CatalogError (ALREADY_EXISTS) when the name is taken."""
        table, created = self.get_or_create(spec)
        if not created:
            raise CatalogError(f"a table named {spec.name!r} already exists", "ALREADY_EXISTS")
        return table

    def _make(self, spec: TableSpec) -> Table:
        g = self.graph
        cls = CLASSES[spec.kind]
        table: Table
        if spec.kind == "keyed":
            table = cls(g, spec.name, spec.schema, list(spec.keys))
        elif spec.kind == "ring":
            assert spec.capacity is not None  # TableSpec checks a ring table's capacity
            table = cls(g, spec.name, spec.schema, int(spec.capacity))
        elif spec.kind == "static":
            table = cls(g, spec.name, spec.data)
        else:
            table = cls(g, spec.name, spec.schema)
        if spec.hidden:
            table.hidden = True
        if spec.system:
            table.system = True
        if spec.attributes:
            table.attributes.update(spec.attributes)
        storage = self.storage
        if storage is not None and spec.journaled:
            assert isinstance(table, SourceTable)  # journaled kinds: append, keyed, ring
            try:
                storage.attach(table, spec)
            except TickwireError:
                g.remove_table(spec.name)  # not durable as asked: not made at all
                raise
        return table

    def history(self, name: str, uri: Optional[str] = None, *, cache_bytes: Optional[int] = None,
                options: Optional[dict[str, str]] = None, index_path: Optional[str] = None,
                schema: Optional[pa.Schema] = None, column: str = "Date", tree: str = "Systems") -> Optional[Table]:
        """A table of history plus live (storage/history.py): its historical locations, followed
        by the rows written to `name` from now on. Only the locations' metadata is read here.

        With `uri` (a path, file://... or s3://bucket/prefix, see storage.parquet.open_uri), the
        locations are a Hive-partitioned Parquet dataset there, its location index kept at
        `index_path`, else under the data directory (history/<name>.json) when there is one, else
        in memory. Without, they are the table's own, in the data directory's `Systems` tree
        (storage.parquet.SystemsLayout; `namespace/table` names its namespace, else "Default"),
        partitioned by `column`; a table with no location and no index yet takes `schema`, or, when
        that is None too, is made by the first write to `name` (its columns, `column` among them):
        None is returned then. `tree="Users"`: the `Users` tree instead (a user namespace's
        partitioned table, storage/users.py: no location index, the files are listed at start).
        CatalogError when the name is taken."""
        from tickwire.server.engine.storage.history import HistoryTable
        from tickwire.server.engine.storage.parquet import (
            DEFAULT_CACHE_BYTES,
            Dataset,
            HistoryError,
            LocationIndex,
            NoLocations,
            ParquetRows,
            SystemsLayout,
            open_uri,
        )

        storage = self.storage
        data_dir = storage.root if storage is not None else (self._data_dir or self.config.data_dir)
        layout: Optional[SystemsLayout] = None
        if uri is None:
            if data_dir is None:
                raise HistoryError(f"history table {name!r}: its own locations need a data directory (or give a URI)")
            layout, root = SystemsLayout.of(data_dir, name, column, tree)
            layout.prepare(root)
            fs: Any = pafs.LocalFileSystem()
            uri = root
            index = LocationIndex(layout.index_path(root) if tree == "Systems" else None)
            if schema is not None:
                if column in schema.names and not pa.types.is_string(schema.field(column).type):
                    raise CatalogError(f"the partitioning column {column!r} must be a string, not "
                                       f"{schema.field(column).type}", "INVALID_ARGUMENT")
                schema = layout.table_schema(schema)
        else:
            if index_path is None and data_dir is not None:
                index_path = str(history_index_path(data_dir, name))
            fs, root = open_uri(uri, options)
            index = LocationIndex(index_path)
        try:
            found, locations, _read = index.open(fs, root, uri, layout=layout, schema=schema)
        except NoLocations:  # nothing yet: made by the first write
            with self._create:
                self._pending_history[name] = column
            return None
        check_schema(name, found)
        rows = ParquetRows(fs, found, locations, DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes)

        def check(existing: Table) -> None:
            raise CatalogError(f"a table named {name!r} already exists", "ALREADY_EXISTS")

        def make() -> Table:
            t = HistoryTable(self.graph, name, rows)
            t.dataset = Dataset(uri, fs, root, index, layout)
            return t

        with self.graph.lock:
            table, _ = self._get_or_make(name, check, make)
        with self._create:
            self._pending_history.pop(name, None)
        if storage is not None:  # made after the data directory was opened: journaled from now on
            self._journal_history(storage)
        return table

    def merge(self, name: str, value: object, *, on_step: Optional[Callable[[str], None]] = None,
              timeout: float = 60.0) -> Any:
        """Merges the intraday rows of history table `name` whose partition column (its first) holds
        `value` into a new historical location (storage/merge.py); returns a MergeResult. Online (the
        engine's cycles adopt it, subscribers see its rows removed and added once) or offline (this
        call runs the cycle). Needs the data directory. MergeError says why nothing was merged."""
        from tickwire.server.engine.storage.history import HistoryTable
        from tickwire.server.engine.storage.merge import MergeError, merge

        table = self.resolve(name)
        storage = self.storage
        if not isinstance(table, HistoryTable):
            raise MergeError(f"no history table named {name!r}")
        if storage is None:
            raise MergeError(f"table {name!r}: the merge needs a data directory")
        return merge(table, value, reading=self.reading, adopt=functools.partial(self._adopted, table, timeout),
                     checkpoint=functools.partial(self._checkpoint_now, storage, table), on_step=on_step)

    def merge_before(self, value: object, *, timeout: float = 60.0) -> list[Any]:
        """Merges, in every history table that has a data directory, each intraday partition value
        before `value` (in order; the daily merge passes today's date), as `merge` does; returns
        the MergeResults. A table whose merge fails is logged and left as it is; the others go on."""
        from tickwire.server.engine.storage.history import HistoryTable

        done = []
        # taken at a cycle boundary: the graph's tables change while others are made and dropped
        for table in [t for t in self.tables(hidden=True) if isinstance(t, HistoryTable) and t.dataset is not None]:
            if not table.history.partition_names:
                continue
            with self.reading():
                values = table.intraday_partition_values()
            for v in values:
                if not v < value:
                    break
                try:
                    done.append(self.merge(table.name, v, timeout=timeout))
                except (TickwireError, OSError) as exc:  # a MergeError among them
                    log.warning("table %r: the daily merge of %s failed, its rows stay intraday: %s", table.name, v,
                                exc)
                    break
        return done

    def refresh_history(self, name: str, timeout: float = 60.0) -> list[str]:
        """Adds the Parquet files that appeared in history table `name`'s dataset since it was
        opened (a batch job's new dates) as locations after the others, in one cycle (their rows
        added); returns their paths. A new file whose partition value sorts before the last
        location's is left for the next start (it would not come after the others) and logged."""
        from tickwire.server.engine.storage.history import HistoryTable
        from tickwire.server.engine.storage.merge import MergeError
        from tickwire.server.engine.storage.parquet import discover_dataset

        table = self.resolve(name)
        if not isinstance(table, HistoryTable) or table.dataset is None:
            raise MergeError(f"no history table named {name!r}")
        hist: HistoryTable = table
        ds = hist.dataset
        assert ds is not None
        have = {loc.path: loc for loc in hist.history.locations}
        schema, found, _read = discover_dataset(ds, have, hist.schema)
        if not schema.equals(hist.schema):
            raise MergeError(f"table {name!r}: the dataset's schema changed to {schema}; restart to serve it")
        col = hist.history.partition_names[0] if hist.history.partition_names else None
        last = dict(hist.history.locations[-1].partition).get(col) if col and hist.history.locations else None
        added: list[int] = []
        for loc in found:
            if loc.path in have:
                continue
            value = dict(loc.partition).get(col) if col else None
            if last is not None and value is not None and value < last:
                log.warning("table %r: %s (%s=%s) comes before the last location; served after a restart",
                            name, loc.path, col, value)
                continue
            added.append(hist.history.add_location(loc))
        if not added:
            return []
        ds.index.save(hist.schema, hist.history.locations)
        hist.adopt_locations(added, RowSet())
        self._adopted(hist, timeout)
        return [hist.history.locations[i].path for i in added]

    # -- user namespaces (storage/users.py) ---------------------------------------------------------
    def _user_tree(self) -> Any:
        from tickwire.server.engine.storage.users import UserTree

        data_dir = self.storage.root if self.storage is not None else (self._data_dir or self.config.data_dir)
        if data_dir is None:
            raise CatalogError("user tables live in the data directory: this engine has none", "FAILED_PRECONDITION")
        return UserTree(data_dir)

    def _open_user_tables(self) -> None:
        """Serves every table defined in the data directory's Users tree."""
        tree = self._user_tree()
        defs, self.user_errors = tree.definitions()
        for d in defs:
            try:
                self._serve_user_table(tree, d)
            except (TickwireError, OSError, pa.ArrowException) as exc:
                self.user_errors.append(f"user table {d.name!r}: {exc}")
        for e in self.user_errors:
            log.error("not served: %s", e)

    def _serve_user_table(self, tree: Any, d: Any) -> Table:
        from tickwire.server.engine.graph.tables import StaticTable

        if d.column is not None:
            t = self.history(d.name, schema=d.schema, column=d.column, tree="Users")
            assert t is not None  # a schema is given: made even without a location
        else:
            data = tree.read_table(d)

            def check(existing: Table) -> None:
                raise CatalogError(f"a table named {d.name!r} already exists", "ALREADY_EXISTS")

            with self.graph.lock:
                t, _ = self._get_or_make(d.name, check, lambda: StaticTable(self.graph, d.name, data))
        self.user_tables[d.name] = d
        return t

    def add_user_table(self, name: str, data: TableInput, *, replace: bool = False) -> Table:
        """Saves `data` as user table `name` ("namespace/table") in the data directory's Users tree
        (storage/users.py) and serves it (a static table), as Deephaven's `db.add_table` does;
        `replace` replaces a user table of that name (`db.replace_table`), which must not be held
        by derived tables or subscribers. It comes back when the server starts again."""
        from tickwire.server.engine.storage.users import Definition, split_user_name

        split_user_name(name)
        data = as_table(data)
        tree = self._user_tree()
        with self._catalog():
            existing = self.resolve(name, hidden=True)
            if existing is not None:
                if name not in self.user_tables:
                    raise CatalogError(f"a table named {name!r} already exists", "ALREADY_EXISTS")
                if not replace:
                    raise CatalogError(f"user table {name!r} already exists (replace=True replaces it)",
                                       "ALREADY_EXISTS")
                if self.user_tables[name].column is not None:
                    raise CatalogError(f"user table {name!r} is partitioned: add partitions to it, or remove it "
                                       f"first", "FAILED_PRECONDITION")
                self.drop(name)  # refused while held; nothing written yet then
                del self.user_tables[name]
            d = Definition(name, data.schema.remove_metadata() if data.schema.metadata else data.schema)
            tree.define(d)
            tree.write_table(name, data)
            return self._serve_user_table(tree, d)

    def add_user_table_partition(self, name: str, value: str, data: TableInput, *, column: str = "Date") -> Table:
        """Saves `data` as partition `value` of partitioned user table `name` ("namespace/table",
        partitioned by `column`, a string column first in its schema: Deephaven's
        `db.add_table_partition`), in the Users tree, defining the table with the first partition.
        A served table takes the new partition as a location after the others, in one cycle, so
        partitions are added in increasing order (a value before the last one is refused). `data`
        may hold `column` (every row equal to `value`) or not."""
        from tickwire.server.engine.storage.history import HistoryTable
        from tickwire.server.engine.storage.parquet import SystemsLayout
        from tickwire.server.engine.storage.users import Definition, check_partition_value, split_user_name

        split_user_name(name)
        data = as_table(data)
        if not isinstance(value, str):
            raise CatalogError(f"a partition value is a string, not {type(value).__name__}", "INVALID_ARGUMENT")
        check_partition_value(value)
        if column in data.schema.names:
            have = data.column(column)
            if have.null_count or (len(have) and have.unique().to_pylist() != [value]):
                raise CatalogError(f"partition {value!r} of {name!r}: its rows' {column!r} must all be {value!r}",
                                   "INVALID_ARGUMENT")
            data = data.drop_columns([column])
        data = data.replace_schema_metadata(None)
        tree = self._user_tree()
        with self._catalog():
            d = self.user_tables.get(name)
            table = self.resolve(name, hidden=True)
            if d is None:
                if table is not None:
                    raise CatalogError(f"a table named {name!r} already exists", "ALREADY_EXISTS")
                layout = SystemsLayout(name.partition("/")[2], column, tree="Users")
                d = Definition(name, layout.table_schema(data.schema), column)
                tree.define(d)
                table = self._serve_user_table(tree, d)
            elif d.column is None:
                raise CatalogError(f"user table {name!r} has no partitions", "FAILED_PRECONDITION")
            else:
                column = d.column
            assert isinstance(table, HistoryTable)
            want = pa.schema([f for f in d.schema if f.name != d.column])
            if not data.schema.equals(want):
                raise CatalogError(f"partition {value!r} of {name!r}: columns {data.schema} are not the table's "
                                   f"{want}", "INVALID_ARGUMENT")
            locs = table.history.locations
            last = dict(locs[-1].partition).get(column) if locs else None
            if last is not None and not value > last:
                raise CatalogError(f"partition {value!r} of {name!r} does not come after its last one, {last!r}: "
                                   f"partitions of a served table are added in increasing order",
                                   "FAILED_PRECONDITION")
            tree.write_partition(name, value, data)
        self.refresh_history(name)  # outside the catalog's lock: it waits for a cycle to adopt the location
        return table

    def remove_user_table(self, name: str) -> None:
        """Stops serving user table `name` and deletes its files (Deephaven's `db.remove_table`);
        refused while derived tables or subscribers hold it."""
        with self._catalog():
            if name not in self.user_tables:
                raise CatalogError(f"no user table named {name!r}", "NOT_FOUND")
            self.drop(name)
            del self.user_tables[name]
            self._user_tree().remove(name)

    def _adopted(self, table: "HistoryTable", timeout: float) -> None:
        """Returns once a cycle adopted the locations `table` (a HistoryTable) was handed: the
        engine's next cycle when it runs, else one run here. MergeError after `timeout` seconds."""
        from tickwire.server.engine.storage.merge import MergeError

        if not self.running:
            self.run_cycle()
        elif not table.adopted.wait(timeout):
            raise MergeError(f"table {table.name!r}: no cycle adopted its new locations in {timeout} s")

    @staticmethod
    def _checkpoint_now(storage: Storage, table: SourceTable) -> None:
        """A checkpoint of `table` at the current cycle boundary, on disk when this returns."""
        storage.wait_checkpoints()  # one under way would refuse a new one
        if not storage.checkpoint(table):
            raise StorageError(f"table {table.name!r}: no checkpoint could be taken")
        storage.wait_checkpoints()

    def _journal_history(self, storage: Storage) -> None:
        """Journals the intraday rows of every history table not journaled yet (made before the data
        directory was opened and not found in it, or made after)."""
        from tickwire.server.engine.storage.history import HistoryTable
        from tickwire.server.engine.storage.merge import finish_merge

        for t in list(self.graph.tables.values()):
            if isinstance(t, HistoryTable) and not t.journaled:
                storage.attach(t, TableSpec(t.name, "append", t.schema))
            if isinstance(t, HistoryTable):  # a merge a crash cut short: finished or dropped, before serving
                done = finish_merge(t, functools.partial(self._checkpoint_now, storage, t))
                if done:
                    log.warning("table %r: %s", t.name, done)

    def get_or_create_source(self, cls: type, name: str, schema: pa.Schema) -> tuple[Table, bool]:
        """(table, created) for an update source of class `cls` (an UpdateSourceTable): an
        existing table of that name must be of that class with that schema."""
        if not (isinstance(cls, type) and issubclass(cls, UpdateSourceTable)):
            raise CatalogError(f"{cls!r} is not an update source class")
        check_schema(name, schema)

        def check(existing: Table) -> None:
            if type(existing) is not cls or not existing.schema.equals(schema):
                raise TableMismatchError(f"a different table named {name!r} exists")

        return self._get_or_make(name, check, lambda: cls(self.graph, name, schema))

    def _get_or_make(self, name: str, check: Callable[[Table], None],
                     make: Callable[[], Table]) -> tuple[Table, bool]:
        """The existing table `name` once `check(table)` accepts it, else `make()` under the
        catalog's lock."""
        with self._catalog():
            existing = self.graph.tables.get(name)
            if existing is not None:
                check(existing)
                return existing, False
            return make(), True

    def resolve(self, name: str, *, hidden: bool = False) -> Optional[Table]:
        """The table named `name`, or None (hidden tables only with `hidden=True`)."""
        t = self.graph.tables.get(name)
        if t is None or (is_hidden(t) and not hidden):
            return None
        return t

    @staticmethod
    def _listed(table: Table, hidden: bool, system: bool) -> bool:
        if is_hidden(table):
            return hidden
        if is_system(table):
            return hidden or system
        return True

    def public_names(self, *, system: bool = False) -> list[str]:
        """The names of the tables that are not hidden, in creation order (the system tables too
        when `system`)."""
        return [t.name for t in self.tables(system=system)]

    def names_now(self, *, system: bool = False) -> tuple[str, ...]:
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

    def tables(self, *, hidden: bool = False, system: bool = False) -> list[Table]:
        """The tables, at a cycle boundary (hidden ones only with `hidden=True`, which includes the
        system ones; system ones with `system=True`)."""
        with self.graph.lock:
            return [t for t in self.graph.tables.values() if self._listed(t, hidden, system)]

    def memory_by_table(self) -> dict[str, int]:
        """Bytes each table holds (its columns, indexes, row sets and state; data it shares with
        another table is counted under each), read at a cycle boundary one table at a time: a
        diagnosis aid whose cost follows the tables' Python objects (engine/footprint.py)."""
        from .footprint import reachable_bytes

        with self.graph.lock:
            tables = list(self.graph.tables.values())
        out = {}
        for t in tables:
            with self.graph.lock:
                if self.graph.tables.get(t.name) is t:
                    out[t.name] = reachable_bytes(t, stop=self._not_this_table)
        return out

    def held_bytes(self, root: object, stop: Optional[Callable[[object], bool]] = None) -> int:
        """Bytes reachable from `root` (a publisher, a server part: its sessions, its web side), not
        counting other tables and publishers, the graph, the engine, nor what `stop` names
        (engine/footprint.py)."""
        from .footprint import reachable_bytes

        return reachable_bytes(root, stop=lambda o: self._not_this_table(o) or (stop is not None and stop(o)))

    @staticmethod
    def _not_this_table(o: object) -> bool:
        """Where a walk from one table stops: other tables, the graph, the engine, publishing."""
        from .publishing.publisher import Publisher, PublisherRegistry

        return isinstance(o, (Table, UpdateGraph, Engine, Publisher, PublisherRegistry, Storage, Staging, PerfTables,
                              threading.Thread))

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
            if self.storage is not None and isinstance(table, SourceTable):  # only source tables are durable
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

    def unique_name(self, base: str) -> str:
        """`base`, or `base#2`, `base#3`, ...: the first name no table has."""
        with self.graph.lock:
            if base not in self.graph.tables:
                return base
            i = 2
            while f"{base}#{i}" in self.graph.tables:
                i += 1
            return f"{base}#{i}"

    def fail(self, table: Table, what: str, error: BaseException) -> TableFailure:
        """Fails a derived table whose values cannot be computed (with every table derived from
        it); returns its failure. See UpdateGraph.fail."""
        return self.graph.fail(table, what, error)

    # -- ingest -------------------------------------------------------------------------------------
    def write(self, target: Target, data: Any = None, *, delete: Optional[TableInput] = None,
              batch_id: Optional[Hashable] = None, wait: bool = True, timeout: float = 30.0,
              timing: Optional[dict[str, Any]] = None, restate: bool = False) -> bool:
        """The one way rows enter a table. Queues `data` (rows to append or upsert, or, for an
        UpdateSourceTable, one operation of its own form) and/or `delete` (keys to remove, keyed
        tables) under `batch_id`; False when that batch id was applied before (nothing is queued).

        `target`: a source table; a TableSpec (the table is made unless it exists, then written);
        or a Destination (a table written by mode, made from the batch's schema unless it exists).
        With `wait`, returns once a cycle has applied the write, and for a durable table once it
        is on disk (at once when no cycle thread runs: the caller steps the engine). `timing`, a
        dict, gets the figures of a write by mode ("rows"; "removed" and "upserted" in replace mode).
        `restate`: a keyed table reports every row of `data` whose key it has as modified (every
        value column), also when its values do not change, as Deephaven's input tables report an
        add; otherwise only values that changed are modifications."""
        writes = _Writes(self, self._replace_state)
        table, ok = writes.put(target, data, delete=delete, batch_id=batch_id, timing=timing, restate=restate)
        if ok and self.config.cycle_on_write:
            self.graph.kick()
        if ok and wait:
            self.flush(timeout)
            refusal = getattr(table, "refusal", None)
            if refusal is not None:  # the cycle could not make the write durable: it was not applied
                raise IngestError(f"table {table.name!r} takes no writes: {refusal}", "UNAVAILABLE")
        return ok

    def flush(self, timeout: float = 30.0) -> None:
        """Returns once every write queued before the call has been applied by a cycle (at once
        when no cycle thread runs: the caller steps the engine)."""
        if not self.graph.running:
            return
        with self.graph.lock:  # after any cycle that may have taken them already: the next one surely will
            target = self.graph.step + 1
        if not self._waiter.wait_for(target, timeout):
            raise WriteTimeout(f"the update graph did not apply a write within {timeout:.0f} s")

    @contextmanager
    def writes(self, *, wait: bool = True, timeout: float = 30.0) -> Iterator["_Writes"]:
        """Queues several writes for one cycle: `with engine.writes() as w: w.write(...); ...`.
        No cycle starts while the block runs; with `wait`, leaving it waits for the cycle that
        applies them all."""
        w = _Writes(self, self._replace_state)
        with self.graph.lock:  # no cycle runs meanwhile: the next one to start takes every write
            yield w
            target = self.graph.step + 1
        if w.queued and self.config.cycle_on_write:
            self.graph.kick()
        if wait and w.queued and self.graph.running:
            if not self._waiter.wait_for(target, timeout):
                raise WriteTimeout(f"the update graph did not apply a write within {timeout:.0f} s")

    def wait_applied(self, step: int, timeout: float = 30.0) -> bool:
        """Waits until the engine has run step `step` (False on timeout or when it is not running)."""
        return self._waiter.wait_for(step, timeout)

    def destination_table(self, dest: Destination, schema: pa.Schema, *, create: bool = True) -> Optional[Table]:
        """The table `dest` writes for batches of `schema` (the table's columns): made unless it
        exists (or, with `create=False`, None when it does not), and checked when it does
        (ModeError names what differs)."""
        with self._catalog():
            table = self.resolve(dest.name, hidden=True)
            if table is not None:
                dest.check_existing(table, schema)
                return table
            if not create:
                dest.check_keys(schema)
                return None
            try:
                table, _created = self.get_or_create(dest.spec(schema))
            except CatalogError as exc:
                raise ModeError(f"{dest.where}: {exc}", exc.code) from None
            return table

    def _replace_state(self, table: Table) -> ReplaceState:
        with self._create:
            state = self._replace.get(table)
            if state is None:
                state = self._replace[table] = ReplaceState()
            return state

    # -- reading ------------------------------------------------------------------------------------
    @contextmanager
    def reading(self) -> Iterator["Engine"]:
        """Holds a cycle boundary: every table read inside is at the same step (`step`), and no
        cycle runs until it is left."""
        with self.graph.lock:
            yield self

    @contextmanager
    def writing(self) -> Iterator["Engine"]:
        """Holds a cycle boundary to change which tables exist or who holds them (the same
        exclusion as `reading`, named for what it is used for)."""
        with self.graph.lock:
            yield self

    def snapshot(self, table: Table, columns: Optional[Sequence[str]] = None) -> tuple[int, pa.Table]:
        """(step, contents) of a table at a cycle boundary; TableFailedError for a failed table."""
        return self.graph.snapshot(table, columns)

    # -- publishing ---------------------------------------------------------------------------------
    def publishers(self, config: Optional[PublishingConfig] = None) -> PublisherRegistry:
        """A registry of publishers over this engine's tables (one per server)."""
        return PublisherRegistry(self, config or PublishingConfig())


class _Writes:
    """Writes queued by one `Engine.write` or `Engine.writes()` block."""

    def __init__(self, engine: Engine, replace_state: Callable[[Table], ReplaceState]):
        self.engine = engine
        self._replace_state = replace_state
        self.queued = 0
        self.tables: list[Table] = []

    def write(self, target: Target, data: Any = None, *, delete: Optional[TableInput] = None,
              batch_id: Optional[Hashable] = None, timing: Optional[dict[str, Any]] = None) -> bool:
        """Queues one write (see Engine.write); False when its batch id was applied before."""
        return self.put(target, data, delete=delete, batch_id=batch_id, timing=timing)[1]

    def put(self, target: Target, data: Any = None, *, delete: Optional[TableInput] = None,
            batch_id: Optional[Hashable] = None, timing: Optional[dict[str, Any]] = None,
            restate: bool = False) -> tuple[Table, bool]:
        engine = self.engine
        if isinstance(target, Destination):
            if delete is not None:
                raise IngestError(f"{target.where}: a write by mode deletes through its delete column")
            table, ok = self._by_mode(target, data, batch_id, timing)
        else:
            table = engine.get_or_create(target)[0] if isinstance(target, TableSpec) else target
            ok = self._to_table(table, data, delete, batch_id, restate)
        if ok:
            self.queued += 1
            self.tables.append(table)
        return table, ok

    def _by_mode(self, dest: Destination, data: Any, batch_id: Optional[Hashable],
                 timing: Optional[dict[str, Any]]) -> tuple[Table, bool]:
        if data is None:
            raise IngestError(f"{dest.where}: no rows to write")
        data = as_table(data)
        table = self.engine.destination_table(dest, dest.table_schema(data.schema))
        assert isinstance(table, SourceTable)  # made (create=True) or checked to be of the mode's kind
        if data.num_rows and dest.mode != "replace":
            data = data.combine_chunks()
        state = self._replace_state(table) if dest.mode == "replace" else None
        return table, bool(prepare_ops(dest, table, data, batch_id, state, timing)())

    @staticmethod
    def _to_table(table: Table, data: Any, delete: Optional[TableInput], batch_id: Optional[Hashable],
                  restate: bool = False) -> bool:
        if isinstance(table, UpdateSourceTable):
            if delete is not None or batch_id is not None:
                raise IngestError(f"table {table.name!r} is fed whole updates; it takes no deletes or batch ids")
            table.queue_update(data)
            return True
        if not isinstance(table, SourceTable):
            raise IngestError(f"table {table.name!r} is a {kind_of(table)} table; it takes no writes",
                              "FAILED_PRECONDITION")
        if delete is not None:
            if not isinstance(table, KeyedTable):
                raise IngestError(f"table {table.name!r} is not keyed; rows cannot be deleted by key")
            ops = ([("add", data)] if data is not None else []) + [("delete", delete)]
            return table.queue_ops(ops, batch_id=batch_id)
        if data is None:
            raise IngestError(f"a write into table {table.name!r} needs rows or keys to delete")
        if restate and isinstance(table, KeyedTable):
            return table.queue_ops([("restate", data)], batch_id=batch_id)
        return table.queue_rows(data, batch_id=batch_id)
