"""User namespaces: the seed's `Users` tree under a data directory, written by users directly.

    <data dir>/Users/<namespace>/Definitions/<table>.tbl                       a table's definition
    <data dir>/Users/<namespace>/Tables/<table>/table.parquet                  a table without partitions
    <data dir>/Users/<namespace>/Partitions/0/<value>/<table>/table.parquet    a partitioned table's location

A definition (JSON) holds the table's Arrow schema (base64 of its IPC form) and its partitioning
column (None for a table without partitions). As the seed has it, the tree follows the `Systems`
layout without WritablePartitions and adds `Tables`; it has no location index (its files are
listed when the server starts). Engine.add_user_table / add_user_table_partition /
remove_user_table write and remove; the engine serves every defined table as `namespace/table`
when it opens the data directory.

Every file is written to a temporary name beside its place, flushed and renamed: a crash leaves
the previous state or the new one. A definition is written before a table's first data and
removed after its last, so a definition without data is a table with no rows yet, never data
without a definition.

This module must not touch the engine's lock or the update graph: it reads and writes files only.
"""
from __future__ import annotations

import base64
import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Union

import pyarrow as pa
import pyarrow.parquet as pq

from tickwire.server.engine.errors import CatalogError
from tickwire.server.engine.storage.store import fsync_dir

__all__ = ["UserTree", "Definition", "split_user_name", "check_partition_value"]

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
_VALUE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*\Z")


def _check(what: str, text: str, pattern: "re.Pattern[str]" = _NAME) -> str:
    if not isinstance(text, str) or not pattern.match(text) or text in (".", ".."):
        raise CatalogError(f"{what} {text!r} is not a name a user table can have: letters, digits, '_', '.', '-' "
                           f"(a partition value may also hold ':'), not starting with '.'", "INVALID_ARGUMENT")
    return text


def check_partition_value(value: str) -> str:
    """`value` if it can name a partition's directory (INVALID_ARGUMENT otherwise)."""
    return _check("partition value", value, _VALUE)


def split_user_name(name: str) -> tuple[str, str]:
    """("namespace", "table") of a user table's name "namespace/table" (INVALID_ARGUMENT otherwise)."""
    namespace, sep, table = str(name).partition("/")
    if not sep:
        raise CatalogError(f"a user table is named 'namespace/table', not {name!r}", "INVALID_ARGUMENT")
    return _check("namespace", namespace), _check("table name", table)


@dataclass(frozen=True)
class Definition:
    """A user table's definition: its name ("namespace/table"), schema and partitioning column."""

    name: str
    schema: pa.Schema
    column: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "partitioning": self.column,
                           "schema": base64.b64encode(self.schema.serialize().to_pybytes()).decode("ascii")})

    @classmethod
    def from_json(cls, text: str) -> "Definition":
        d = json.loads(text)
        schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(d["schema"])))
        return cls(str(d["name"]), schema, d.get("partitioning"))


def _write_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """`write(tmp)` then a rename into `path` (its folder made first), the folder flushed too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


class UserTree:
    """The `Users` tree of data directory `data_dir`."""

    def __init__(self, data_dir: Union[str, os.PathLike[str]]):
        self.root = Path(data_dir) / "Users"

    def definition_path(self, namespace: str, table: str) -> Path:
        return self.root / namespace / "Definitions" / f"{table}.tbl"

    def table_path(self, namespace: str, table: str) -> Path:
        return self.root / namespace / "Tables" / table / "table.parquet"

    def partition_path(self, namespace: str, table: str, value: str) -> Path:
        return self.root / namespace / "Partitions" / "0" / value / table / "table.parquet"

    def definitions(self) -> tuple[list[Definition], list[str]]:
        """Every table defined in the tree (namespace, then table order), and what could not be
        read (a message per definition)."""
        found: list[Definition] = []
        errors: list[str] = []
        if not self.root.is_dir():
            return found, errors
        for ns_dir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            defs = ns_dir / "Definitions"
            if not defs.is_dir():
                continue
            for f in sorted(defs.glob("*.tbl")):
                try:
                    d = Definition.from_json(f.read_text(encoding="utf-8"))
                    if d.name != f"{ns_dir.name}/{f.stem}":
                        raise ValueError(f"it defines {d.name!r}")
                    found.append(d)
                except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
                    errors.append(f"{f}: {exc}")
        return found, errors

    def define(self, d: Definition) -> None:
        namespace, table = split_user_name(d.name)
        _write_atomically(self.definition_path(namespace, table),
                          lambda tmp: tmp.write_text(d.to_json(), encoding="utf-8"))

    def write_table(self, name: str, data: pa.Table) -> Path:
        """A table without partitions: its one Parquet file (in place of the previous one)."""
        namespace, table = split_user_name(name)
        path = self.table_path(namespace, table)
        _write_atomically(path, lambda tmp: pq.write_table(data, tmp))
        return path

    def read_table(self, d: Definition) -> pa.Table:
        namespace, table = split_user_name(d.name)
        path = self.table_path(namespace, table)
        if not path.exists():
            return d.schema.empty_table()
        return pq.read_table(path, schema=d.schema)

    def write_partition(self, name: str, value: str, data: pa.Table) -> Path:
        """A partitioned table's location for partition `value` (ALREADY_EXISTS when there is one)."""
        namespace, table = split_user_name(name)
        path = self.partition_path(namespace, table, check_partition_value(value))
        if path.exists():
            raise CatalogError(f"user table {name!r} already has a partition {value!r}", "ALREADY_EXISTS")
        _write_atomically(path, lambda tmp: pq.write_table(data, tmp))
        return path

    def remove(self, name: str) -> None:
        """A table's files: its data first, its definition last."""
        namespace, table = split_user_name(name)
        shutil.rmtree(self.table_path(namespace, table).parent, ignore_errors=True)
        parts = self.root / namespace / "Partitions"
        if parts.is_dir():
            for internal in parts.iterdir():
                for value in internal.iterdir() if internal.is_dir() else ():
                    shutil.rmtree(value / table, ignore_errors=True)
                    if value.is_dir() and not any(value.iterdir()):
                        value.rmdir()
        self.definition_path(namespace, table).unlink(missing_ok=True)
