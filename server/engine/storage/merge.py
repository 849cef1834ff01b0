"""The merge: a date's intraday rows of a history table become a historical location.

Steps, each safe to be cut short by a crash (`on_step` is told each step's name as it is reached):

    selected    the intraday rows whose first partition column holds the value, taken at a cycle
                boundary; a merge record (beside the location index) names them, the temporary
                file and the final one, before anything is written
    writing     the rows are being written to a hidden temporary file in the location's folder
                (`.merging-*.parquet`, which no listing takes for a location) (said after its
                first row group)
    written     the temporary file is complete
    validated   it was read back: the same row count and the same checksum (sha256 of the Arrow
                IPC stream) as the intraday rows it was written from
    renamed     moved to its final name: from here on the location exists
    indexed     the location index lists it
    adopted     one cycle replaced the intraday rows by the location (removed and added rows)
    done        a checkpoint without those rows is on disk and the record is gone

Restarting (`finish_merge`, when the table is opened with its data directory): a record whose final
file does not exist is dropped with its temporary file (the intraday rows stay, served); a record
whose final file exists has its intraday rows dropped before anything is served, then a checkpoint
is written and the record goes. So a crash leaves exactly one of the two served.

This module must not touch the engine's lock: it reads the table through `reading`, and the cycle
that adopts the location is the engine's.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Optional

import numpy as np
import pyarrow as pa
import pyarrow.fs  # noqa: F401 - pa.fs.FileType
import pyarrow.parquet as pq

from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.engine.storage.history import HistoryTable
from tickwire.server.engine.storage.parquet import Dataset, HistoryError, Location
from tickwire.server.engine.storage.store import fsync_dir

__all__ = ["MergeError", "MergeResult", "merge", "finish_merge", "record_path", "checksum"]

log = logging.getLogger(__name__)

#: rows per row group of a merged location
ROW_GROUP_ROWS = 1 << 20


class MergeError(HistoryError):
    """A merge that did not happen, and why; the intraday rows stay served."""


@dataclass(frozen=True)
class MergeResult:
    table: str
    value: object
    rows: int
    path: str
    checksum: str


def record_path(table: HistoryTable) -> Optional[str]:
    ds = table.dataset
    if ds is None or ds.index.path is None:
        return None
    return f"{ds.index.path}.merge.json"


def checksum(t: pa.Table) -> str:
    """sha256 of the rows as an Arrow IPC stream (one batch per row group, schema metadata left out)."""
    t = t.replace_schema_metadata(None)
    t = pa.Table.from_arrays([c.combine_chunks() for c in t.columns], schema=pa.schema(
        [pa.field(f.name, f.type, f.nullable) for f in t.schema]))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t, max_chunksize=ROW_GROUP_ROWS)
    return hashlib.sha256(sink.getvalue().to_pybytes()).hexdigest()


def _write_json(path: str, obj: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def merge(table: HistoryTable, value: object, *, reading: Callable[[], ContextManager[Any]],
          adopt: Callable[[], None], checkpoint: Callable[[], None],
          on_step: Optional[Callable[[str], None]] = None) -> MergeResult:
    """Merges the intraday rows of `table` whose first partition column holds `value` into a new
    historical location (see the module's steps). `reading()`: a context in which the table is
    read at a cycle boundary; `adopt()`: returns once a cycle adopted the location; `checkpoint()`:
    returns once a checkpoint of the table's rows is on disk. MergeError says why nothing changed."""
    step = on_step or (lambda _name: None)
    ds = table.dataset
    rec_path = record_path(table)
    if ds is None or rec_path is None:
        raise MergeError(f"table {table.name!r}: the merge needs a history table with a data directory")
    if os.path.exists(rec_path):
        raise MergeError(f"table {table.name!r}: a merge is under way ({rec_path})")
    parts = table.history.partition_names
    if not parts:
        raise MergeError(f"table {table.name!r}: its dataset has no partition column")
    col = parts[0]
    try:
        typed = pa.scalar(value).cast(table.schema.field(col).type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise MergeError(f"table {table.name!r}: {value!r} is not a value of {col!r} "
                         f"({table.schema.field(col).type}): {exc}") from None
    last = [dict(loc.partition).get(col) for loc in table.history.locations]
    if last and last[-1] is not None and typed.as_py() < last[-1]:
        raise MergeError(f"table {table.name!r}: {col}={typed.as_py()} comes before the last historical location "
                         f"({col}={last[-1]}); a merge adds locations after the others")
    data_cols = [n for n in table.schema.names if n not in set(parts)]
    with reading():
        keys = table.rows_of_partition(typed.as_py())
        if keys.is_empty():
            raise MergeError(f"table {table.name!r}: no intraday rows with {col}={typed.as_py()}")
        rows = table.gather(data_cols, keys)
    token = uuid.uuid4().hex[:12]
    if ds.layout is not None:  # tickwire's own Systems tree: one file per location folder
        text = str(typed.as_py())
        if not text or "/" in text or text.startswith((".", "_")):
            raise MergeError(f"table {table.name!r}: {col}={text!r} cannot name a location folder")
        folder = ds.layout.folder(ds.root, text)
        final = f"{folder}/table.parquet"
        if ds.fs.get_file_info(final).type != pa.fs.FileType.NotFound:
            raise MergeError(f"table {table.name!r}: the location {final} exists already; a location is merged once")
    else:
        folder = f"{ds.root}/{col}={typed.as_py()}"
        final = f"{folder}/part-merged-{token}.parquet"
    temp = f"{folder}/.merging-{token}.parquet"
    record = {"table": table.name, "column": col, "value": typed.as_py(), "keys": keys.ranges().tolist(),
              "temp": temp, "final": final}
    _write_json(rec_path, record)
    step("selected")
    try:
        ds.fs.create_dir(folder, recursive=True)
        with ds.fs.open_output_stream(temp) as out:
            writer = pq.ParquetWriter(out, rows.schema)
            try:
                for i, start in enumerate(range(0, rows.num_rows, ROW_GROUP_ROWS)):
                    writer.write_table(rows.slice(start, ROW_GROUP_ROWS), row_group_size=ROW_GROUP_ROWS)
                    if i == 0:
                        step("writing")
            finally:
                writer.close()
        step("written")
        got = pq.read_table(ds.fs.open_input_file(temp))
        want_sum = checksum(rows)
        if got.num_rows != rows.num_rows or not got.equals(rows) or checksum(got) != want_sum:
            raise MergeError(f"table {table.name!r}: the location written for {col}={typed.as_py()} reads back "
                             f"{got.num_rows} rows, not the {rows.num_rows} written, or other values; nothing "
                             f"was merged")
        step("validated")
        ds.fs.move(temp, final)
    except BaseException:
        _abandon(ds, temp, rec_path)
        raise
    step("renamed")
    info = ds.fs.get_file_info(final)
    meta = pq.ParquetFile(ds.fs.open_input_file(final)).metadata
    location = Location(final, ((col, typed.as_py()),), tuple(meta.row_group(i).num_rows
                                                               for i in range(meta.num_row_groups)),
                        int(info.size), int(info.mtime_ns) if info.mtime_ns is not None else -1)
    index = table.history.add_location(location)
    ds.index.save(table.schema, table.history.locations)
    step("indexed")
    table.adopt_locations([index], keys)
    adopt()
    step("adopted")
    checkpoint()
    _remove(rec_path)
    step("done")
    log.info("table %r: %d intraday rows with %s=%s merged into %s", table.name, rows.num_rows, col,
             typed.as_py(), final)
    return MergeResult(table.name, typed.as_py(), rows.num_rows, final, want_sum)


def _abandon(ds: Dataset, temp: str, rec_path: str) -> None:
    try:
        ds.fs.delete_file(temp)
    except FileNotFoundError:
        pass  # never written (a crash before the first byte)
    except (OSError, pa.ArrowException) as exc:  # a hidden name: never served, only left behind
        log.warning("the temporary file %s of an abandoned merge could not be removed: %s", temp, exc)
    _remove(rec_path)


def finish_merge(table: HistoryTable, checkpoint: Callable[[], None]) -> Optional[str]:
    """At start, before the table is served: completes or drops the merge a crash interrupted (see
    the module). Returns what was done, None when there was no merge."""
    rec_path = record_path(table)
    if rec_path is None or not os.path.exists(rec_path):
        return None
    ds = table.dataset
    assert ds is not None  # record_path needs it
    with open(rec_path, encoding="utf-8") as f:
        rec = json.load(f)
    final_there = ds.fs.get_file_info(rec["final"]).type == pa.fs.FileType.File
    if not final_there:
        _abandon(ds, rec["temp"], rec_path)
        return f"merge of {rec['column']}={rec['value']} dropped: its location was never published"
    keys = RowSet.from_ranges(np.array(rec["keys"], dtype=np.int64).reshape(-1, 2))
    dropped = len(table.intraday_rows.intersect(keys))
    table.drop_intraday(keys)
    checkpoint()
    _remove(rec_path)
    return f"merge of {rec['column']}={rec['value']} finished: {dropped} intraday rows dropped, its location served"
