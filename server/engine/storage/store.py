"""Durable source tables: an intraday journal per table, Parquet checkpoints, recovery at start.

Layout of a data directory (after Deephaven's intraday/historical storage model):

    DIR/<namespace>/<table>/
        table.json                                    kind, keys, capacity, schema (Arrow IPC, base64),
                                                      attributes, an upload's schema (its served types)
        intraday/<arrival date>/<source>/journal-<seq>.twj
                                                      the input of each cycle, in order (journal.py)
        checkpoints/checkpoint-<step>.parquet         the table's rows at a cycle boundary, with their
                                                      row keys, the next row key and the batch ids

Every cycle the graph hands this store the input it is about to apply (UpdateGraph.set_input_journal).
Each durable table's input becomes one journal record (the rows, which operation, the batch ids
they came with, the step), encoded, appended and (with `fsync="cycle"`) synced by one writer
thread, so the cycle never waits for the disk; cycles queued together share one sync (group
commit). The engine acknowledges a write (`wait=True`) only once `durable_through(step)` says its
cycle's input is on disk. A table whose record cannot be written or synced fails the writes of
that cycle and refuses every later one, with the file and the error in the message; the other
tables go on.

Every `checkpoint_cycles` journaled cycles or `checkpoint_bytes` of journal, a table's rows are
taken at the cycle boundary and written to Parquet in the background (to a temporary name, then
renamed), `CHECKPOINT_SLICE` rows a row group; the journal files it covers are deleted after. A
keyed or ring table's rows are copied at the boundary (they change after it); an append table's
are not (they never change): the writer reads them a slice at a time, under the graph's lock for
each, so that a checkpoint of a table of many rows costs a slice of memory, not a copy of it.
At start (`recover`), each table comes back from its last checkpoint plus the journal after it,
with the same row keys and the same batch-id memory: a Spark query resuming from its checkpoint
neither loses nor repeats a batch.
Blink tables are not journaled (they hold one cycle), nor are static and hidden (session) tables.
"""
from __future__ import annotations

import base64
import datetime
import json
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Optional, Sequence, Union
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.errors import TickwireError
from tickwire.protocol.schema import BARRAGE_SCHEMA
from tickwire.server.engine.catalog import TableSpec
from tickwire.server.engine.config import Durability
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.graph.sources import KeyedTable, SourceTable
from tickwire.server.engine.storage.journal import JournalCorrupt, decode_data, encode_record, scan

if TYPE_CHECKING:
    from tickwire.server.engine.core import Engine

__all__ = ["Durability", "Storage", "StorageError", "DURABLE_KINDS", "OP_COLUMN", "ROWKEY_COLUMN"]

log = logging.getLogger(__name__)

DURABLE_KINDS = ("append", "keyed", "ring")
FORMAT = 1
OP_COLUMN = "__tw_op"  # 0: add/upsert, 1: delete by key
ROWKEY_COLUMN = "__tw_rowkey"
_CKPT_META = b"tickwire.checkpoint"
MAX_QUEUED = 64  # cycles of input handed to the journal writer and not yet taken
_JOURNAL_RE = re.compile(r"^journal-(\d{8})\.twj$")
_CKPT_RE = re.compile(r"^checkpoint-(\d{12})\.parquet$")

# one queued input: ("add", rows) or ("delete", key values)
_Op = tuple[str, pa.Table]
CHECKPOINT_SLICE = 65_536  # rows a checkpoint's row group holds (and an append table's read takes)
# what a checkpoint starts from: the rows (None: read from the table, whose rows stay), their row
# keys, and its metadata
_Snapshot = tuple[Optional[pa.Table], RowSet, dict[str, Any]]


class StorageError(TickwireError):
    """A data directory, journal or checkpoint that cannot be used; the message names the file."""

    def __init__(self, message: str, code: str = "FAILED_PRECONDITION"):
        super().__init__(message, code)


def _dir_name(name: str) -> str:
    return quote(name, safe="") if name not in (".", "..") else quote(name.replace(".", "%2E"), safe="%")


def fsync_dir(path: Union[str, os.PathLike[str]]) -> None:
    """Flushes a folder's entries (a file just renamed into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _schema_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def _nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)


def _json_batch_id(b: Hashable) -> object:
    if isinstance(b, tuple):
        return [_json_batch_id(x) for x in b]
    if b is None or isinstance(b, (str, int, float, bool)):
        return b
    raise StorageError(f"batch id {b!r}: a durable table's batch ids are strings, numbers or tuples of them",
                       "INVALID_ARGUMENT")


def _batch_id_from_json(b: Any) -> Hashable:
    if isinstance(b, list):
        return tuple(_batch_id_from_json(x) for x in b)
    scalar: Hashable = b  # a JSON string, number, bool or null
    return scalar


class _TableFiles:
    """One durable table's directory, its open journal and its checkpoint bookkeeping."""

    def __init__(self, storage: "Storage", table: SourceTable, root: Path):
        self.storage = storage
        self.table = table
        self.root = root
        self.seq = 0
        self.fd: Optional[int] = None
        self.path: Optional[Path] = None
        self.size = 0
        self.dirty = False
        self.cycles = 0  # journaled cycles since the last checkpoint
        self.bytes = 0  # journal bytes since the last checkpoint
        self.checkpointing = False
        self.failed = False  # its journal failed: the table refuses writes
        self.journal_schema = _nullable(table.schema).append(pa.field(OP_COLUMN, pa.int8()))

    # -- journal --------------------------------------------------------------------------------
    def open_journal(self, seq: int) -> None:
        day = datetime.datetime.fromtimestamp(self.storage.clock.now(), datetime.timezone.utc).strftime("%Y-%m-%d")
        folder = self.root / "intraday" / day / self.storage.config.source
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"journal-{seq:08d}.twj"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.close_journal()
        self.fd, self.path, self.seq, self.size = fd, path, seq, os.fstat(fd).st_size
        if self.storage.config.fsync != "off":
            fsync_dir(folder)

    def close_journal(self) -> None:
        if self.fd is not None:
            try:
                if self.dirty and self.storage.config.fsync != "off":
                    os.fsync(self.fd)
            finally:
                os.close(self.fd)
                self.fd = None
                self.dirty = False

    def record_bytes(self, step: int, ops: list[_Op], batch_ids: list[Hashable]) -> bytes:
        parts = []
        for kind, t in ops:
            code = 1 if kind == "delete" else 0
            cols = []
            for f in self.journal_schema:
                if f.name == OP_COLUMN:
                    cols.append(pa.array(np.full(t.num_rows, code, dtype=np.int8)))
                elif f.name in t.column_names:
                    cols.append(t.column(f.name).cast(f.type) if t.schema.field(f.name).type != f.type
                                else t.column(f.name))
                else:
                    cols.append(pa.nulls(t.num_rows, f.type))
            parts.append(pa.Table.from_arrays(cols, schema=self.journal_schema))
        data = pa.concat_tables(parts) if len(parts) > 1 else (parts[0] if parts else None)
        meta = {"step": step, "batches": [_json_batch_id(b) for b in batch_ids]}
        return encode_record(meta, data)

    def append(self, record: bytes) -> None:
        """Writes one record whole; on an error the file is cut back to where it was."""
        fd = self.fd
        assert fd is not None  # Storage._append writes only to an open journal
        before = self.size
        try:
            view = memoryview(record)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError:
            try:
                os.ftruncate(fd, before)
            except OSError:
                pass  # the half record stays at the end: recovery drops it as a torn tail
            raise
        self.size += len(record)
        self.bytes += len(record)
        self.dirty = True

    def sync(self) -> None:
        if self.dirty and self.fd is not None:
            os.fsync(self.fd)
            self.dirty = False

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint_files(self) -> list[tuple[int, Path]]:
        return _checkpoint_files(self.root)

    def journal_files(self) -> list[tuple[int, Path]]:
        return _journal_files(self.root)


def _checkpoint_files(root: Path) -> list[tuple[int, Path]]:
    """(step, path) of a table directory's checkpoints, oldest first."""
    folder = root / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := _CKPT_RE.match(p.name)))


def _journal_files(root: Path) -> list[tuple[int, Path]]:
    """(sequence, path) of a table directory's journals, in order, across dates and sources."""
    base = root / "intraday"
    if not base.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in base.glob("*/*/journal-*.twj") if (m := _JOURNAL_RE.match(p.name)))


class Storage:
    """The durable side of one engine (see the module docstring)."""

    def __init__(self, engine: "Engine", data_dir: Union[str, os.PathLike[str]], config: Optional[Durability] = None,
                 *, clock: Clock = SYSTEM_CLOCK):
        self.engine = engine
        self.graph = engine.graph
        self.clock = clock
        self.config = config or Durability()
        self.root = Path(data_dir)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / ".tickwire-write-test"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise StorageError(f"data directory {self.root}: cannot write there ({exc.strerror or exc})") from None
        self.ns_root = self.root / _dir_name(self.config.namespace)
        self.ns_root.mkdir(exist_ok=True)
        self._files: dict[int, _TableFiles] = {}  # id(table) -> files
        self.errors: dict[str, str] = {}  # table name -> why it could not be recovered
        self._lock = threading.Lock()
        self._checkpoints: list[threading.Thread] = []
        self.stats = {"records": 0, "bytes": 0, "fsyncs": 0, "fsync_seconds": 0.0, "checkpoints": 0,
                      "checkpoint_seconds": 0.0, "recovered_rows": 0, "recovery_seconds": 0.0, "writer_waits": 0,
                      "queue_high": 0}  # the most cycles of input ever waiting for the writer
        # the journal writer: the cycle hands it each cycle's input and goes on
        self._cond = threading.Condition(threading.Lock())
        self._queue: list[tuple[Any, ...]] = []  # ("records", step, entries) or ("rotate", files, snapshot)
        self._stopping = False
        self._processing = False
        self._last_enqueued = 0  # the step of the newest input handed to the writer
        self._durable = 0  # every input up to this step is on disk
        self.on_durable: Optional[Callable[[], None]] = None  # the engine's waiter
        self._writer = threading.Thread(target=self._write_loop, name="tickwire-journal", daemon=True)
        self._writer.start()

    # -- tables ---------------------------------------------------------------------------------
    def table_dir(self, name: str) -> Path:
        return self.ns_root / _dir_name(name)

    def attach(self, table: SourceTable, spec: TableSpec) -> None:
        """Makes a new table durable: its metadata is written and its first journal opened."""
        root = self.table_dir(table.name)
        meta: dict[str, Any] = {"format": FORMAT, "name": table.name, "kind": spec.kind, "keys": list(spec.keys),
                "capacity": spec.capacity, "schema": _schema_b64(table.schema),
                "attributes": {k: v for k, v in spec.attributes.items() if isinstance(v, (str, int, float, bool))},
                "created": datetime.datetime.fromtimestamp(self.clock.now(), datetime.timezone.utc).isoformat()}
        upload = spec.attributes.get(BARRAGE_SCHEMA)
        if isinstance(upload, pa.Schema):  # an upload's types, which the table is served with
            meta["barrage_schema"] = _schema_b64(upload)
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / "table.json.tmp"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, root / "table.json")
            if self.config.fsync != "off":
                fsync_dir(root)
            files = _TableFiles(self, table, root)
            existing = files.journal_files()
            files.open_journal((existing[-1][0] + 1) if existing else 1)
        except OSError as exc:
            raise StorageError(f"table {table.name!r}: cannot create its files in {root} "
                               f"({exc.strerror or exc})") from None
        with self._lock:
            self._files[id(table)] = files
        table.journaled = True

    def detach(self, table: SourceTable, *, delete: bool = False) -> None:
        with self._lock:
            files = self._files.pop(id(table), None)
        table.journaled = False
        if files is not None:
            files.close_journal()
            if delete:
                shutil.rmtree(files.root, ignore_errors=True)

    # -- the graph's hook -----------------------------------------------------------------------
    def record(self, step: int, inputs: dict[SourceTable, tuple[list[Any], list[Hashable]]]) -> set[SourceTable]:
        """Hands each durable table's input of this cycle to the journal writer
        (UpdateGraph.set_input_journal); returns the tables that refuse writes. The cycle goes on
        at once: the writer encodes, appends and syncs in the background, and `durable_through`
        tells when a step's input is on disk (the engine releases `wait=True` writers then)."""
        refused: set[SourceTable] = set()
        entries: list[tuple[SourceTable, _TableFiles, list[Any], list[Hashable]]] = []
        for table, (ops, batch_ids) in inputs.items():
            with self._lock:
                files = self._files.get(id(table))
            if files is None:
                continue
            if table.refusal is not None or files.failed:  # refused earlier: input since is refused too
                refused.add(table)
                continue
            if not files.checkpointing and (files.cycles >= self.config.checkpoint_cycles
                                            or files.bytes >= self.config.checkpoint_bytes):
                self._start_checkpoint(table, files, step)
            files.cycles += 1
            entries.append((table, files, ops, list(batch_ids)))
        if entries:
            with self._cond:
                # a disk slower than the input holds the cycles back instead of queueing their rows
                # without bound: at most MAX_QUEUED cycles wait, plus those the writer is on
                while len(self._queue) >= MAX_QUEUED and self._writer.is_alive():
                    self.stats["writer_waits"] += 1
                    self._cond.wait(1.0)
                self._queue.append(("records", step, entries))
                self.stats["queue_high"] = max(self.stats["queue_high"], len(self._queue))
                self._last_enqueued = step
                self._cond.notify_all()
        return refused

    def durable_through(self, step: int) -> bool:
        """True once every input journaled at or before `step` is on disk (as the fsync policy
        puts it there: synced with "cycle", written with "interval" and "off")."""
        with self._cond:
            return self._durable >= min(step, self._last_enqueued)

    def wait_durable(self, timeout: float = 30.0) -> bool:
        """Waits until everything handed to the writer is on disk."""
        deadline = self.clock.monotonic() + timeout
        with self._cond:
            while self._durable < self._last_enqueued:
                left = deadline - self.clock.monotonic()
                if left <= 0 or not self._writer.is_alive():
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def _write_loop(self) -> None:
        cfg = self.config
        interval = cfg.fsync_interval_ms / 1000.0
        clock = self.clock
        last_sync = clock.monotonic()
        dirty: set[_TableFiles] = set()
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    if cfg.fsync == "interval" and dirty:
                        self._cond.wait(min(0.05, max(0.0, last_sync + interval - clock.monotonic())))
                        break
                    self._cond.wait()
                items = list(self._queue)
                self._queue.clear()
                stopping = self._stopping
                self._processing = bool(items)
                self._cond.notify_all()  # a cycle held back by a full queue may go on
            done_step = None
            for item in items:
                if item[0] == "records":
                    _kind, step, entries = item
                    for table, files, ops, batch_ids in entries:
                        if self._append(table, files, step, ops, batch_ids):
                            dirty.add(files)
                    done_step = step
                else:  # ("rotate", files, snapshot): a checkpoint starts from here
                    _kind, files, snapshot = item
                    self._rotate(files, snapshot)
                    dirty.discard(files)
            now = clock.monotonic()
            if dirty and (cfg.fsync == "cycle" or (cfg.fsync == "interval" and (now - last_sync >= interval
                                                                                 or stopping))):
                self._sync(dirty)  # one sync a file for every cycle taken together: group commit
                dirty = set()
                last_sync = now
            with self._cond:
                if done_step is not None:
                    self._durable = max(self._durable, done_step)
                self._processing = False
                self._cond.notify_all()
            if done_step is not None:
                if self.on_durable is not None:
                    self.on_durable()
            if stopping and not items:
                if dirty and cfg.fsync != "off":
                    self._sync(dirty)
                return

    def _append(self, table: SourceTable, files: _TableFiles, step: int, ops: list[_Op],
                batch_ids: list[Hashable]) -> bool:
        if files.failed or files.fd is None:  # refused, or closed (the table was dropped) since it was queued
            return False
        try:
            rec = files.record_bytes(step, ops, batch_ids)
            files.append(rec)
        except StorageError as exc:
            self._refuse(table, files, str(exc))
            return False
        except OSError as exc:
            self._refuse(table, files, f"its journal {files.path} could not be written ({exc.strerror or exc})")
            return False
        self.stats["records"] += 1
        self.stats["bytes"] += len(rec)
        return True

    def _sync(self, dirty: set[_TableFiles]) -> None:
        t0 = time.perf_counter()
        for files in dirty:
            try:
                files.sync()
                self.stats["fsyncs"] += 1
            except OSError as exc:
                self._refuse(files.table, files, f"its journal {files.path} could not be synced "
                                                 f"({exc.strerror or exc})")
        self.stats["fsync_seconds"] += time.perf_counter() - t0

    def _refuse(self, table: SourceTable, files: _TableFiles, reason: str) -> None:
        log.error("table %r refuses writes: %s", table.name, reason)
        table.refusal = reason
        files.failed = True
        try:
            if files.fd is not None:
                os.close(files.fd)
        except OSError:
            pass
        files.fd = None

    # -- checkpoints ----------------------------------------------------------------------------
    def checkpoint(self, table: SourceTable, step: Optional[int] = None) -> bool:
        """Starts a checkpoint of `table` at the current cycle boundary (under the graph's lock);
        False when one is already under way or the table is not durable."""
        with self.graph.lock:
            with self._lock:
                files = self._files.get(id(table))
            if files is None or files.checkpointing or files.failed:
                return False
            self._start_checkpoint(table, files, self.graph.step + 1 if step is None else step)
            return True

    def _start_checkpoint(self, table: SourceTable, files: _TableFiles, step: int) -> None:
        """Takes `table`'s rows at the boundary before `step` (the graph's lock is held) and queues
        the journal's rotation: the writer starts a new journal there, and the old ones are deleted
        once the checkpoint, written in the background, is on disk."""
        files.checkpointing = True
        rows = table.checkpoint_rows()
        data = None
        if not table.checkpoint_rows_stay:   # its rows (and row set) change after the boundary
            data, rows = table.gather(None, rows), RowSet.from_keys(rows.keys().copy())
        snapshot: _Snapshot = (data, rows, {"step": step - 1, "next_key": int(table.next_key),
                                            "batches": table.applied_batch_state(), "format": FORMAT})
        files.cycles = 0
        with self._cond:
            self._queue.append(("rotate", files, snapshot))
            self._cond.notify_all()

    def _rotate(self, files: _TableFiles, snapshot: _Snapshot) -> None:
        data, rows, meta = snapshot
        covered = files.seq
        meta = dict(meta, journal_seq=covered)
        if not files.failed:
            try:
                files.open_journal(files.seq + 1)
            except OSError as exc:
                self._refuse(files.table, files, f"a new journal in {files.root} could not be opened "
                                                 f"({exc.strerror or exc})")
        files.bytes = 0
        thread = threading.Thread(target=self._write_checkpoint,
                                  args=(files.table, files, data, rows, meta, covered),
                                  name=f"tickwire-checkpoint-{files.table.name}", daemon=True)
        self._checkpoints = [t for t in self._checkpoints if t.is_alive()] + [thread]
        thread.start()

    def _slice(self, table: SourceTable, data: Optional[pa.Table], rows: RowSet, first: int) -> pa.Table:
        """Rows [first, first + CHECKPOINT_SLICE) of a checkpoint, with their row keys."""
        last = min(len(rows), first + CHECKPOINT_SLICE) - 1
        part_rows = rows.subset_by_positions(first, last)
        if data is None:
            with self.graph.lock:   # the rows stay; the table's storage may grow meanwhile
                part = table.gather(None, part_rows)
        else:
            part = data.slice(first, last - first + 1)
        return part.append_column(pa.field(ROWKEY_COLUMN, pa.int64()), pa.array(part_rows.keys(), pa.int64()))

    def _write_checkpoint(self, table: SourceTable, files: _TableFiles, data: Optional[pa.Table], rows: RowSet,
                          meta: dict[str, Any], covered: int) -> None:
        t0 = time.perf_counter()
        folder = files.root / "checkpoints"
        final = folder / f"checkpoint-{meta['step']:012d}.parquet"
        tmp = folder / (final.name + ".tmp")
        try:
            folder.mkdir(exist_ok=True)
            part = self._slice(table, data, rows, 0)
            schema_meta = dict(part.schema.metadata or {})
            schema_meta[_CKPT_META] = json.dumps(meta).encode()
            schema = part.schema.with_metadata(schema_meta)
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
                first = 0
                while True:
                    writer.write_table(part.replace_schema_metadata(schema_meta), row_group_size=CHECKPOINT_SLICE)
                    first += part.num_rows
                    if first >= len(rows):
                        break
                    part = self._slice(table, data, rows, first)
            del part
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
            fsync_dir(folder)
            for seq, path in files.journal_files():  # what the checkpoint covers
                if seq <= covered:
                    path.unlink(missing_ok=True)
            for _step, path in files.checkpoint_files():
                if path != final:
                    path.unlink(missing_ok=True)
            self.stats["checkpoints"] += 1
            self.stats["checkpoint_seconds"] += time.perf_counter() - t0
        except OSError as exc:
            # the journal still holds everything: nothing is lost, the next checkpoint tries again
            log.error("table %r: checkpoint %s failed (%s); its journal is kept", table.name, final, exc)
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
        finally:
            files.checkpointing = False

    def wait_checkpoints(self, timeout: float = 60.0) -> None:
        """Waits for the writer to take what it was handed, then for the checkpoints it started."""
        deadline = self.clock.monotonic() + timeout
        with self._cond:
            while (self._queue or self._processing) and self._writer.is_alive():
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.05))
        for t in list(self._checkpoints):
            while t.is_alive() and self.clock.monotonic() < deadline:
                t.join(0.05)

    # -- recovery -------------------------------------------------------------------------------
    def recover(self) -> list[SourceTable]:
        """Brings back every table of the namespace; returns them. A table whose files cannot be
        read is not created: `errors[name]` says why, naming the file."""
        t0 = time.perf_counter()
        out = []
        last_step = 0
        for root in sorted(p for p in self.ns_root.iterdir() if p.is_dir()):
            meta_path = root / "table.json"
            if not meta_path.is_file():
                continue
            name = unquote(root.name)
            try:
                meta = json.loads(meta_path.read_text())
                name = meta["name"]
                attributes = dict(meta.get("attributes") or {})
                if meta.get("barrage_schema"):
                    attributes[BARRAGE_SCHEMA] = _schema_from_b64(meta["barrage_schema"])
                spec = TableSpec(name, meta["kind"], _schema_from_b64(meta["schema"]),
                                 keys=tuple(meta.get("keys") or ()),
                                 capacity=meta.get("capacity"), attributes=attributes)
            except (OSError, ValueError, KeyError, TypeError, pa.ArrowInvalid) as exc:
                self.errors[name] = f"{meta_path} cannot be read: {exc}"
                log.error("table %r not recovered: %s", name, self.errors[name])
                continue
            try:
                table, step = self._recover_table(spec, root)
            except (StorageError, JournalCorrupt) as exc:
                self.errors[name] = str(exc)
                log.error("table %r not recovered: %s", name, exc)
                continue
            last_step = max(last_step, step)
            out.append(table)
        with self.graph.lock:
            if last_step > self.graph.step:
                self.graph.step = last_step  # steps keep growing across restarts
        self.stats["recovery_seconds"] = time.perf_counter() - t0
        return out

    def _recover_table(self, spec: TableSpec, root: Path) -> tuple[SourceTable, int]:
        engine = self.engine
        for stale in (root / "checkpoints").glob("*.tmp") if (root / "checkpoints").is_dir() else ():
            stale.unlink(missing_ok=True)  # a checkpoint a crash interrupted: the journal still covers it
        ckpts = _checkpoint_files(root)
        ckpt_meta: Optional[dict[str, Any]] = None
        ckpt_data: Optional[pa.Table] = None
        ckpt_keys: Optional[np.ndarray] = None
        if ckpts:
            path = ckpts[-1][1]
            try:
                t = pq.read_table(path)
                ckpt_meta = json.loads((t.schema.metadata or {})[_CKPT_META])
                ckpt_keys = t.column(ROWKEY_COLUMN).to_numpy()
                ckpt_data = t.drop_columns([ROWKEY_COLUMN]).replace_schema_metadata(None)
            except (OSError, KeyError, ValueError, pa.ArrowException) as exc:
                raise StorageError(f"table {spec.name!r}: checkpoint {path} cannot be read ({exc}); move it away "
                                   f"to recover from the journal alone only if no journal was deleted after it",
                                   "DATA_LOSS") from None
        journals = [(seq, p) for seq, p in _journal_files(root)
                    if ckpt_meta is None or seq > ckpt_meta["journal_seq"]]
        records: list[tuple[dict[str, Any], Optional[pa.Table]]] = []
        for i, (_seq, path) in enumerate(journals):
            raw = path.read_bytes()
            try:
                res = scan(raw)
            except JournalCorrupt as exc:
                raise StorageError(f"table {spec.name!r}: journal {path}: {exc}", "DATA_LOSS") from None
            if res.torn:
                if i != len(journals) - 1:
                    raise StorageError(f"table {spec.name!r}: journal {path} ends inside a record but later "
                                       f"journals follow it", "DATA_LOSS")
                log.warning("table %r: dropping a torn last record (%d bytes) of %s", spec.name, res.torn, path)
                with open(path, "r+b") as fh:
                    fh.truncate(res.valid_end)
                    os.fsync(fh.fileno())
            for r in res.records:
                if ckpt_meta is not None and r.meta["step"] <= ckpt_meta["step"]:
                    continue
                records.append((r.meta, decode_data(r)))
        table, _created = engine.get_or_create(spec)
        assert isinstance(table, SourceTable)  # a durable kind: append, keyed or ring
        with self.graph.lock:
            if ckpt_meta is not None:
                assert ckpt_keys is not None and ckpt_data is not None  # read with ckpt_meta
                table.restore(ckpt_keys, ckpt_data, ckpt_meta["next_key"])
                table.restore_batches(ckpt_meta["batches"])
                self.stats["recovered_rows"] += ckpt_data.num_rows
            last = ckpt_meta["step"] if ckpt_meta else 0
            pending_ops: list[_Op] = []
            # once a keyed table has freed row keys, its cycles are replayed one by one: which freed
            # keys new rows take depends on the cycle (and the live rows before it), as when the
            # journal was written
            keyed = table if isinstance(table, KeyedTable) else None
            freed = keyed is not None and keyed.free_keys > 0
            for meta, data in records:
                if freed and pending_ops and meta["step"] != last:
                    self._replay(table, last, pending_ops)
                    pending_ops = []
                if data is not None:
                    ops = _split_ops(data, spec.keys, table.schema)
                    freed = freed or (keyed is not None and any(kind == "delete" for kind, _t in ops))
                    pending_ops.extend(ops)
                    self.stats["recovered_rows"] += data.num_rows
                for b in meta.get("batches", ()):
                    table.batch_memory().add(_batch_id_from_json(b))
                last = max(last, meta["step"])
                if sum(t.num_rows for _, t in pending_ops) >= 1_000_000:
                    self._replay(table, last, pending_ops)
                    pending_ops = []
            if pending_ops:
                self._replay(table, last, pending_ops)
            table.last_step = last
        self.attach(table, spec)
        return table, last

    @staticmethod
    def _replay(table: SourceTable, step: int, ops: list[_Op]) -> None:
        table.apply_pending(step, ops)
        table.end_cycle()
        table.prev_rowset = table.rowset

    def close(self) -> None:
        """Writes and syncs what the writer holds, waits for checkpoints, closes the journals."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._writer is not threading.current_thread():
            self._writer.join()
        self.wait_checkpoints()
        with self._lock:
            files = list(self._files.values())
        for f in files:
            # its journal is closed: a write now could be applied but never be on disk
            f.table.refusal = f"the data directory {self.root} was closed (the server stopped)"
            try:
                f.close_journal()
            except OSError as exc:
                log.error("closing journal %s: %s", f.path, exc)


def _split_ops(data: pa.Table, keys: Sequence[str], schema: pa.Schema) -> list[_Op]:
    """A record's rows back into (kind, rows) operations, in order."""
    op = data.column(OP_COLUMN).to_numpy(zero_copy_only=False)
    body = data.drop_columns([OP_COLUMN])
    cuts = np.flatnonzero(op[1:] != op[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(op)]
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        part = body.slice(a, b - a)
        if op[a] == 1:
            keyed = part.select(list(keys))
            out.append(("delete", keyed.cast(pa.schema([schema.field(k) for k in keys]))))
        else:
            out.append(("add", part.cast(schema)))
    return out
