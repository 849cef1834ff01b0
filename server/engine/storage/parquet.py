"""Historical data on Parquet: locations found with pyarrow.dataset, column data read per row group
on demand through a bounded cache.

A historical dataset is a Hive-partitioned Parquet tree (`Date=2026-11-20/part-0.parquet`), local
or on an object store (`pyarrow.fs`). Each Parquet file is a *location*: its partition values (the
directory names) and its row groups' row counts (its footer) are all that opening it reads. A
location index (`LocationIndex`, a JSON file) keeps those per file with the file's size and
modification time, so that a restart reads no footer of a file that did not change; it is rebuilt
from the files whenever they differ from it.

Row keys: location i (locations in partition-value order, then path) holds the keys
`[i << REGION_BITS, (i << REGION_BITS) + rows)`, so a location never moves when another comes or
goes. `ParquetRows.gather` reads the row groups that hold the asked keys (and only the asked
columns), keeping recently read column chunks in an LRU cache bounded in bytes.

This module must not touch the update graph or the engine's lock: it reads files and returns Arrow
data; the history table (`history.py`) puts it in the graph.
"""
from __future__ import annotations

import json
import logging
import os
import threading
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tickwire.protocol.schema import DH_IS_PARTITIONING
from tickwire.server.engine.errors import TickwireError

__all__ = ["REGION_BITS", "Location", "HistoryError", "NoLocations", "DEFAULT_NAMESPACE", "open_uri", "discover",
           "LocationIndex", "ParquetRows", "partition_table", "ReadStats", "Dataset", "SystemsLayout",
           "discover_dataset"]

log = logging.getLogger(__name__)

#: each location's row keys start at a multiple of 2**REGION_BITS (a trillion rows per location)
REGION_BITS = 40
#: the namespace of tables named without one, in the data directory's Systems tree
DEFAULT_NAMESPACE = "Default"
#: the cache of column chunks read from Parquet, in bytes, unless the table says otherwise
DEFAULT_CACHE_BYTES = 256 << 20


class HistoryError(TickwireError):
    """A historical dataset that cannot be opened or read, with what was wrong."""

    code = "FAILED_PRECONDITION"


class NoLocations(HistoryError):
    """A table of its own locations that has none yet, and no schema recorded or given."""


@dataclass(frozen=True)
class Location:
    """One Parquet file of a dataset: where it is, its partition values, its row groups' sizes."""

    path: str
    partition: tuple[tuple[str, Any], ...]  # (column, value) in partitioning order
    row_groups: tuple[int, ...]  # rows per row group
    size: int = -1  # bytes, -1 unknown
    mtime_ns: int = -1

    @property
    def num_rows(self) -> int:
        return int(sum(self.row_groups))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "partition": [list(p) for p in self.partition],
                "row_groups": list(self.row_groups), "size": self.size, "mtime_ns": self.mtime_ns}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Location":
        return cls(str(d["path"]), tuple((str(k), v) for k, v in d["partition"]),
                   tuple(int(n) for n in d["row_groups"]), int(d.get("size", -1)), int(d.get("mtime_ns", -1)))


def open_uri(uri: str, options: Optional[dict[str, str]] = None) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of a dataset's root: a local path, `file://...`, or `s3://bucket/prefix`
    (pyarrow's S3 options as query parameters, e.g. `?endpoint_override=127.0.0.1:9000&scheme=http`;
    without an endpoint in the URI, AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL is used, and the
    credentials and region come from the usual AWS_* variables). `options` adds query parameters."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    parsed = urllib.parse.urlsplit(uri)
    query = dict(urllib.parse.parse_qsl(parsed.query))
    query.update(options or {})
    if parsed.scheme == "s3":
        endpoint = query.get("endpoint_override") or os.environ.get("AWS_ENDPOINT_URL_S3") or \
            os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and "endpoint_override" not in query:
            ep = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
            query["endpoint_override"] = ep.netloc
            query.setdefault("scheme", ep.scheme)
        query.setdefault("region", os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1")
    uri = urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, parsed.path, urllib.parse.urlencode(query), ""))
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise HistoryError(f"cannot open {uri!r}: {exc}") from None
    return fs, path.rstrip("/")


def _listing(fs: pafs.FileSystem, root: str, allow_not_found: bool = False) -> list[pafs.FileInfo]:
    """The Parquet files under `root` (hidden and underscore files left out, as Spark and
    pyarrow.dataset leave them out), sorted by path."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=allow_not_found))
    except (OSError, pa.ArrowException) as exc:
        raise HistoryError(f"cannot list {root!r}: {exc}") from None
    out = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(root):].lstrip("/")
        if any(part.startswith((".", "_")) for part in rel.split("/")):
            continue
        out.append(info)
    return sorted(out, key=lambda i: i.path)


def _mtime_ns(info: pafs.FileInfo) -> int:
    m = info.mtime_ns
    return int(m) if m is not None else -1


Partition = tuple[tuple[str, Any], ...]  # a location's (column, value) pairs


def discover(fs: pafs.FileSystem, root: str, known: Optional[dict[str, Location]] = None
             ) -> tuple[pa.Schema, list[Location], int]:
    """(schema with the partition columns first, locations in partition-value order, footers
    read) of the Hive-partitioned Parquet dataset at `root`; `known` locations (by path) whose
    size and modification time did not change are taken as they are, without reading their footer."""
    infos = _listing(fs, root)
    if not infos:
        raise HistoryError(f"no Parquet files under {root!r}")
    try:
        dataset = ds.dataset([i.path for i in infos], filesystem=fs, format="parquet",
                             partitioning=ds.HivePartitioning.discover(infer_dictionary=False), partition_base_dir=root)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise HistoryError(f"cannot read the dataset at {root!r}: {exc}") from None
    schema = dataset.schema
    part_names = [n for n in schema.names if n in set(dataset.partitioning.schema.names)] \
        if dataset.partitioning is not None else []
    # partition columns first, in directory order, marked as Deephaven marks them
    data_names = [n for n in schema.names if n not in part_names]
    schema = pa.schema([schema.field(n).with_metadata({DH_IS_PARTITIONING: b"true"}) for n in part_names]
                       + [schema.field(n) for n in data_names])

    def partition_of(frag: ds.Fragment) -> Partition:
        keys = ds.get_partition_keys(frag.partition_expression)
        return tuple((n, keys.get(n)) for n in part_names)

    locations, read = _locations(dataset, infos, partition_of, known)
    return schema, locations, read


def _locations(dataset: ds.Dataset, infos: Sequence[pafs.FileInfo], partition_of: Callable[[Any], Partition],
               known: Optional[dict[str, Location]]) -> tuple[list[Location], int]:
    """The locations of a dataset's files in partition-value order (then path), and how many
    footers were read: a `known` location whose file kept its size and time is taken as it is."""
    by_path = {i.path: i for i in infos}
    locations = []
    read = 0
    for frag in dataset.get_fragments():
        info = by_path[frag.path]
        partition = partition_of(frag)
        old = (known or {}).get(frag.path)
        if old is not None and old.size == info.size and old.mtime_ns == _mtime_ns(info) and old.partition == partition:
            locations.append(old)
            continue
        try:
            frag.ensure_complete_metadata()
            rgs = tuple(int(rg.num_rows) for rg in frag.row_groups)
        except (pa.ArrowException, OSError) as exc:
            raise HistoryError(f"cannot read the footer of {frag.path!r}: {exc}") from None
        read += 1
        locations.append(Location(frag.path, partition, rgs, int(info.size), _mtime_ns(info)))
    locations.sort(key=lambda loc: (tuple(_order_key(v) for _, v in loc.partition), loc.path))
    return locations, read


@dataclass(frozen=True)
class SystemsLayout:
    """tickwire's own historical layout for one table, the seed's `Systems` tree of a namespace
    (`root` is `<data dir>/Systems/<namespace>`):

        <root>/Partitions/<internal partition>/<Date value>/<table>/table.parquet   a location
        <root>/WritablePartitions/<internal partition>   -> ../Partitions/<internal partition>
        <root>/MetadataIndex/<table>.tlmi                the table's location index

    The internal partition is hidden; the date directory is the partitioning column (`column`,
    strings), first in the schema. Merges write into the `writable` internal partition; reads take
    every internal partition."""

    table: str
    column: str = "Date"
    writable: str = "0"
    tree: str = "Systems"  # or "Users": the same, without WritablePartitions (storage/users.py)

    @classmethod
    def of(cls, data_dir: Union[str, os.PathLike[str]], name: str, column: str = "Date", tree: str = "Systems"
           ) -> tuple["SystemsLayout", str]:
        """The layout of table `name` ("namespace/table", or a table of DEFAULT_NAMESPACE) in a
        data directory, and its root (`<data dir>/<tree>/<namespace>`)."""
        namespace, _, table = name.rpartition("/")
        return cls(table, column, tree=tree), str(Path(data_dir) / tree / (namespace or DEFAULT_NAMESPACE))

    def table_schema(self, schema: pa.Schema) -> pa.Schema:
        """`schema` with the partitioning column (a string) first, marked as Deephaven marks one."""
        part = pa.field(self.column, pa.string()).with_metadata({DH_IS_PARTITIONING: b"true"})
        return pa.schema([part] + [f for f in schema if f.name != self.column], metadata=schema.metadata)

    def index_path(self, root: str) -> str:
        return f"{root}/MetadataIndex/{self.table}.tlmi"

    def folder(self, root: str, value: object) -> str:
        """The location folder a merge of `value` writes (through the internal partition's real path)."""
        return f"{root}/Partitions/{self.writable}/{value}/{self.table}"

    def prepare(self, root: str) -> None:
        """The layout's directories on local disk, the writable partition linked as the seed has it."""
        os.makedirs(f"{root}/Partitions/{self.writable}", exist_ok=True)
        if self.tree != "Systems":  # the seed's Users tree: no WritablePartitions, no location index
            return
        os.makedirs(f"{root}/MetadataIndex", exist_ok=True)
        os.makedirs(f"{root}/WritablePartitions", exist_ok=True)
        link = f"{root}/WritablePartitions/{self.writable}"
        if not os.path.lexists(link):
            os.symlink(f"../Partitions/{self.writable}", link)

    def discover(self, fs: pafs.FileSystem, root: str, known: Optional[dict[str, Location]] = None,
                 schema: Optional[pa.Schema] = None) -> tuple[pa.Schema, list[Location], int]:
        """(schema, locations, footers read) of the table's locations; with none yet, `schema` (the
        index's) or NoLocations."""
        base = f"{root}/Partitions"

        def parts(path: str) -> list[str]:  # a location's: <internal partition>/<value>/<table>/<file>.parquet
            return path[len(base):].lstrip("/").split("/")

        files = [i for i in _listing(fs, base, allow_not_found=True)
                 if len(p := parts(i.path)) == 4 and p[2] == self.table and p[3].endswith(".parquet")]
        if not files:
            if schema is None:
                raise NoLocations(f"no locations of table {self.table!r} under {base!r} and no schema for it")
            return schema, [], 0
        try:
            dataset = ds.dataset([i.path for i in files], filesystem=fs, format="parquet")
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise HistoryError(f"cannot read the locations of table {self.table!r} under {base!r}: {exc}") from None
        found = self.table_schema(dataset.schema.remove_metadata())

        def partition_of(frag: ds.Fragment) -> Partition:
            return ((self.column, parts(frag.path)[1]),)

        locations, read = _locations(dataset, files, partition_of, known)
        return found, locations, read


def _order_key(v: Any) -> tuple[int, Any]:
    return (0, "") if v is None else (1, v)


@dataclass
class Dataset:
    """Where a history table's locations are: its URI, the filesystem and root path it names, and
    the location index kept for it (its path None without a data directory)."""

    uri: str
    fs: pafs.FileSystem
    root: str
    index: "LocationIndex"
    layout: Optional[SystemsLayout] = None  # None: a Hive-partitioned tree


def discover_dataset(d: Dataset, known: Optional[dict[str, Location]] = None,
                     schema: Optional[pa.Schema] = None) -> tuple[pa.Schema, list[Location], int]:
    """`discover` for a dataset of either layout."""
    if d.layout is not None:
        return d.layout.discover(d.fs, d.root, known, schema)
    return discover(d.fs, d.root, known)


class LocationIndex:
    """The locations of a dataset kept in a JSON file (`path`), with the dataset's schema: what a
    restart reads instead of the footers. `load` gives the locations recorded, `open` brings them
    up to date with the files (reading only the footers of files that changed) and rewrites the
    index atomically when anything changed."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self._uri: Optional[str] = None  # the dataset's, once opened or read

    def _read(self) -> Optional[dict[str, Any]]:
        """The index file's content (None when there is none, or it cannot be read: rebuilt)."""
        if self.path is None or not os.path.exists(self.path):
            return None
        try:
            with open(self.path, encoding="utf-8") as f:
                got = json.load(f)
            return got if isinstance(got, dict) else None
        except (OSError, ValueError) as exc:
            log.warning("location index %s is unreadable (%s): rebuilt from the files", self.path, exc)
            return None

    def _parse(self, d: Optional[dict[str, Any]]) -> tuple[Optional[pa.Schema], dict[str, Location]]:
        if d is None:
            return None, {}
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(bytes.fromhex(d["schema"])))
            return schema, {loc["path"]: Location.from_json(loc) for loc in d["locations"]}
        except (ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            log.warning("location index %s is unreadable (%s): rebuilt from the files", self.path, exc)
            return None, {}

    def uri(self) -> Optional[str]:
        """The dataset's URI as the index recorded it (None without one)."""
        d = self._read()
        got = d.get("uri") if d is not None else None
        return str(got) if got else None

    def save(self, schema: pa.Schema, locations: Sequence[Location]) -> None:
        if self.path is None:
            return
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        tmp = f"{self.path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump({"schema": schema.serialize().to_pybytes().hex(), "uri": self._uri,
                       "locations": [loc.to_json() for loc in locations]}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def open(self, fs: pafs.FileSystem, root: str, uri: Optional[str] = None, *,
             layout: Optional[SystemsLayout] = None, schema: Optional[pa.Schema] = None
             ) -> tuple[pa.Schema, list[Location], int]:
        """(schema, locations, footers read) of the dataset at `root` (Hive-partitioned, or of a
        SystemsLayout: then `schema` is the table's when it has no location and no index yet), the
        index brought up to date (the file read once, written when anything changed)."""
        d = self._read()
        recorded = str(d["uri"]) if d is not None and d.get("uri") else None
        if uri is not None and recorded not in (None, uri):
            raise HistoryError(f"the location index {self.path} is of {recorded!r}, not {uri!r}; remove it to "
                               f"serve another dataset under this name")
        old_schema, known = self._parse(d)
        if layout is not None:
            if schema is not None and old_schema is not None and not old_schema.equals(schema):
                raise HistoryError(f"table {layout.table!r} has the schema {old_schema} in {self.path}, not {schema}")
            schema, locations, read = layout.discover(fs, root, known, old_schema if old_schema is not None else schema)
        else:
            schema, locations, read = discover(fs, root, known)
        if old_schema is not None and not old_schema.equals(schema):
            raise HistoryError(f"the dataset at {root!r} changed its schema from {old_schema} to {schema}; "
                               f"remove {self.path} to serve the new one")
        self._uri = uri or recorded
        if read or set(known) != {loc.path for loc in locations} or self._uri != recorded or old_schema is None:
            self.save(schema, locations)
        return schema, locations, read


def partition_names(schema: pa.Schema) -> list[str]:
    """The partition columns of a dataset's schema (marked isPartitioning), in order."""
    return [f.name for f in schema if (f.metadata or {}).get(DH_IS_PARTITIONING) == b"true"]


def partition_table(schema: pa.Schema, locations: Sequence[Location]) -> pa.Table:
    """One row per location: its partition values, typed as the schema's partition columns."""
    names = partition_names(schema)
    return pa.table({n: pa.array([dict(loc.partition)[n] for loc in locations], type=schema.field(n).type)
                     for n in names}, schema=pa.schema([schema.field(n) for n in names]))


@dataclass
class ReadStats:
    """What a ParquetRows read: column chunks read from storage (one column of one row group),
    their bytes, chunks found in the cache, and the (location, row group) pairs the last gather
    touched."""

    chunks_read: int = 0
    bytes_read: int = 0
    cache_hits: int = 0
    reads: list[tuple[int, int]] = field(default_factory=list)


class ParquetRows:
    """The rows of a dataset's locations, read by row key. `gather(keys, columns)` reads, for each
    row group holding some of the keys, only the asked columns, through an LRU cache of at most
    `cache_bytes` of column chunks (a chunk bigger than the whole cache is read and not kept)."""

    def __init__(self, fs: pafs.FileSystem, schema: pa.Schema, locations: Sequence[Location],
                 cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.fs = fs
        self.schema = schema
        self.locations = list(locations)
        self.partition_names = partition_names(schema)
        self.cache_bytes = int(cache_bytes)
        # per location: the first row of each row group (and the total at the end)
        self._rg_starts = [np.concatenate(([0], np.cumsum(loc.row_groups, dtype=np.int64)))
                           for loc in self.locations]
        self._parts = partition_table(schema, self.locations)
        # text columns are read dictionary-encoded (Parquet stores them so, mostly): decoding a row
        # group's strings costs several times its numbers, and only the rows gathered are decoded
        parts = set(self.partition_names)
        self._dictionary_columns = [f.name for f in schema if f.name not in parts and (
            pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_binary(f.type)
            or pa.types.is_large_binary(f.type))]
        self._cache: "OrderedDict[tuple[int, int, str], pa.Array]" = OrderedDict()
        self._cached = 0
        self._files: "OrderedDict[int, pq.ParquetFile]" = OrderedDict()
        self._lock = threading.Lock()
        self.stats = ReadStats()

    @property
    def num_rows(self) -> int:
        return int(sum(loc.num_rows for loc in self.locations))

    def add_location(self, location: Location) -> int:
        """Adds a location after the others (a merge's); returns its index."""
        with self._lock:
            self.locations.append(location)
            self._rg_starts.append(np.concatenate(([0], np.cumsum(location.row_groups, dtype=np.int64))))
            self._parts = partition_table(self.schema, self.locations)
            return len(self.locations) - 1

    def key_ranges(self, which: Optional[np.ndarray] = None) -> np.ndarray:
        """The closed key ranges of the non-empty locations (all, or those indexed by `which`),
        shape (n, 2)."""
        idx = range(len(self.locations)) if which is None else np.asarray(which, dtype=np.int64).tolist()
        rows = [(i << REGION_BITS, (i << REGION_BITS) + self.locations[i].num_rows - 1) for i in idx
                if self.locations[i].num_rows]
        return np.array(rows, dtype=np.int64).reshape(-1, 2)

    def partition_values(self) -> pa.Table:
        """One row per location: its partition values."""
        return self._parts

    def cached_bytes(self) -> int:
        return self._cached

    # -- reading ------------------------------------------------------------------------------
    def _file(self, li: int) -> pq.ParquetFile:
        f = self._files.get(li)
        if f is None:
            loc = self.locations[li]
            try:
                # pre_buffer: a row group's column chunks in coalesced reads (fewer object-store round trips)
                f = pq.ParquetFile(self.fs.open_input_file(loc.path), read_dictionary=self._dictionary_columns,
                                   pre_buffer=True)
            except (OSError, pa.ArrowException) as exc:
                raise HistoryError(f"cannot open {loc.path!r}: {exc}") from None
            self._files[li] = f
            while len(self._files) > 64:
                self._files.popitem(last=False)
        else:
            self._files.move_to_end(li)
        return f

    def _chunks(self, li: int, rg: int, names: Sequence[str]) -> dict[str, pa.Array]:
        """Columns `names` of row group `rg` of location `li`: from the cache, the others read in
        one call (pyarrow decodes them on its threads) and kept while the cache's bound allows."""
        out: dict[str, pa.Array] = {}
        missing = []
        for name in names:
            got = self._cache.get((li, rg, name))
            if got is None:
                missing.append(name)
                continue
            self._cache.move_to_end((li, rg, name))
            self.stats.cache_hits += 1
            out[name] = got
        if not missing:
            return out
        try:
            t = self._file(li).read_row_group(rg, columns=missing, use_threads=True)
        except (OSError, pa.ArrowException) as exc:
            raise HistoryError(f"cannot read row group {rg} of {self.locations[li].path!r}: {exc}") from None
        for name in missing:
            col = t.column(name)
            # one chunk (the usual row group) is used as is: combining would copy it (tens of ms
            # for a row group of a million numbers, most of a cold viewport's time)
            arr = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            want = self.schema.field(name).type
            if arr.type != want and not pa.types.is_dictionary(arr.type):  # text stays dictionary-encoded
                arr = arr.cast(want)
            self.stats.chunks_read += 1
            self.stats.bytes_read += arr.nbytes
            out[name] = arr
            self._keep((li, rg, name), arr)
        return out

    def _keep(self, key: tuple[int, int, str], arr: pa.Array) -> None:
        """Caches `arr` under `key` (in place of what was there), the least recently used chunks
        leaving past the bound; a chunk bigger than the whole cache is not kept."""
        old = self._cache.pop(key, None)
        if old is not None:
            self._cached -= old.nbytes
        if arr.nbytes <= self.cache_bytes:
            self._cache[key] = arr
            self._cached += arr.nbytes
            while self._cached > self.cache_bytes:
                _, gone = self._cache.popitem(last=False)
                self._cached -= gone.nbytes

    def gather(self, keys: np.ndarray, columns: Optional[Sequence[str]] = None) -> pa.Table:
        """The values of row keys `keys` (in that order) as a table of `columns` (default: all)."""
        names = list(columns) if columns is not None else list(self.schema.names)
        keys = np.asarray(keys, dtype=np.int64)
        out_schema = pa.schema([self.schema.field(n) for n in names])
        if keys.size == 0:
            return out_schema.empty_table()
        li = keys >> REGION_BITS
        local = keys - (li << REGION_BITS)
        if li.min() < 0 or li.max() >= len(self.locations):
            raise IndexError("row key outside every location")
        ascending = keys.size < 2 or bool(np.all(keys[1:] > keys[:-1]))  # the usual case: a row set's order
        # the row group of each key: one search per location that the keys touch
        rg = np.empty(keys.size, dtype=np.int64)
        if ascending:
            cut = np.flatnonzero(li[1:] != li[:-1]) + 1
            seg_bounds = list(zip(np.concatenate(([0], cut)).tolist(), np.concatenate((cut, [keys.size])).tolist()))
            segments = [(int(li[a]), slice(a, b)) for a, b in seg_bounds]
        else:
            segments = [(loc_i, li == loc_i) for loc_i in np.unique(li).tolist()]
        for loc_i, at in segments:
            starts = self._rg_starts[loc_i]
            if local[at].max() >= starts[-1]:
                raise IndexError(f"row key beyond the rows of location {self.locations[loc_i].path!r}")
            rg[at] = np.searchsorted(starts, local[at], side="right") - 1
        group = (li << 24) | rg  # a row group's id; row groups per file stay far below 2**24
        order = np.arange(keys.size) if ascending else np.argsort(group, kind="stable")
        sorted_group = group if ascending else group[order]
        bounds = np.flatnonzero(np.diff(sorted_group)) + 1
        starts_i = np.concatenate(([0], bounds)).tolist()
        ends_i = np.concatenate((bounds, [keys.size])).tolist()
        data_names = [n for n in names if n not in set(self.partition_names)]
        pieces: dict[str, list[pa.Array]] = {n: [] for n in data_names}
        with self._lock:
            reads = []
            if data_names:
                for s, e in zip(starts_i, ends_i):
                    g = int(sorted_group[s])
                    loc_i, g_rg = g >> 24, g & ((1 << 24) - 1)
                    rows = local[order[s:e]] - self._rg_starts[loc_i][g_rg]
                    chunks = self._chunks(loc_i, g_rg, data_names)
                    first, count = int(rows[0]), e - s
                    run = ascending and int(rows[-1]) - first == count - 1  # a run of the row group: a slice
                    taken = None if run else pa.array(rows, type=pa.int64())
                    for name in data_names:
                        chunk = chunks[name]
                        want = self.schema.field(name).type
                        if chunk.type != want and count * 4 >= len(chunk):  # most of it: decoded once, kept so
                            chunk = chunk.cast(want)
                            self._keep((loc_i, g_rg, name), chunk)
                        piece = chunk.slice(first, count) if taken is None else chunk.take(taken)
                        pieces[name].append(piece if piece.type == want else piece.cast(want))
                    reads.append((loc_i, g_rg))
            self.stats.reads = sorted(set(reads))
        inverse = None
        if not ascending:
            inverse = np.empty_like(order)
            inverse[order] = np.arange(keys.size)
        arrays = []
        for name in names:
            if name in self.partition_names:
                values = self._parts.column(name).combine_chunks()
                arrays.append(values.take(pa.array(li, type=pa.int64())))
                continue
            col = pa.chunked_array(pieces[name], type=self.schema.field(name).type)
            if inverse is not None:
                col = col.take(pa.array(inverse, type=pa.int64()))
            arrays.append(col)
        return pa.Table.from_arrays(arrays, schema=out_schema)
