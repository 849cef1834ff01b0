"""The intraday journal's record format: checksummed records of Arrow IPC data, append-only.

A journal file is a sequence of records, each one input the engine applied in one cycle:

    magic   4 bytes  b"TWJ1"
    length  8 bytes  little-endian: bytes of `body` that follow the checksum
    crc32   4 bytes  little-endian: zlib.crc32 of `body`
    body    length bytes:
        meta_len  4 bytes little-endian, then meta_len bytes of UTF-8 JSON (the record's metadata:
                  the cycle step, the kind of input, the batch id it carries, ...)
        the rest: one Arrow IPC stream (schema + record batches), possibly empty

The batch id lives in the same record as the data, so "applied" and "remembered as applied" can
never disagree: a record is either wholly in the file (its checksum holds) or not at all.

`scan(data)` reads a file's bytes. A last record cut short by a crash (a header or body that
runs past the end, or a checksum that fails on the last record) is a torn tail: `scan` reports
where the good records end and the caller truncates the file there. A record that fails its
checksum with more records after it is corruption, never dropped silently: `JournalCorrupt`
names the offset. This module does no I/O; `JournalFile` in tickwire.server.engine.storage appends and
syncs.
"""
from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from tickwire.errors import TickwireError

__all__ = ["MAGIC", "HEADER", "Record", "ScanResult", "JournalCorrupt", "encode_record", "scan", "decode_data"]

MAGIC = b"TWJ1"
HEADER = struct.Struct("<4sQI")  # magic, body length, crc32
_META_LEN = struct.Struct("<I")
MAX_META = 1 << 20


class JournalCorrupt(TickwireError):
    """A journal record in the middle of a file fails its checks."""

    def __init__(self, message: str):
        super().__init__(message, "DATA_LOSS")


@dataclass(frozen=True)
class Record:
    offset: int  # where the record starts in the file
    end: int  # where the next one starts
    meta: dict[str, Any]
    data: memoryview = field(repr=False)  # the Arrow IPC stream (empty: no rows)


@dataclass(frozen=True)
class ScanResult:
    records: list[Record]
    valid_end: int  # bytes of the file holding whole records; a torn tail starts here
    torn: int  # bytes after valid_end (0 for a clean file)


def encode_record(meta: dict[str, Any], data: Optional[pa.Table | pa.RecordBatch] = None) -> bytes:
    """One record's bytes: `meta` (JSON-serialisable) and `data` as an Arrow IPC stream."""
    meta_bytes = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    if len(meta_bytes) > MAX_META:
        raise ValueError(f"journal record metadata of {len(meta_bytes)} bytes (limit {MAX_META})")
    ipc = b""
    if data is not None:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, data.schema) as writer:
            writer.write(data)
        ipc = sink.getvalue().to_pybytes()
    body = _META_LEN.pack(len(meta_bytes)) + meta_bytes + ipc
    return HEADER.pack(MAGIC, len(body), zlib.crc32(body)) + body


def decode_data(record: Record) -> Optional[pa.Table]:
    """The record's rows (None when it carries none)."""
    if not len(record.data):
        return None
    buf = pa.py_buffer(record.data)
    if buf.address % 8:
        # the stream starts wherever the metadata before it ends: copied to an aligned buffer, its
        # columns' buffers are aligned (unaligned ones make Acero warn, and slow numpy and Arrow)
        aligned = pa.allocate_buffer(len(record.data))
        np.frombuffer(aligned, dtype=np.uint8)[:] = np.frombuffer(record.data, dtype=np.uint8)
        buf = aligned
    return pa.ipc.open_stream(buf).read_all()


def scan(data: bytes | bytearray | memoryview) -> ScanResult:
    """Every whole record of a journal file's bytes; see the module docstring for torn tails."""
    view = memoryview(data)
    n = len(view)
    pos = 0
    records: list[Record] = []
    while pos < n:
        if n - pos < HEADER.size:
            return ScanResult(records, pos, n - pos)  # a header cut short: torn
        magic, length, crc = HEADER.unpack_from(view, pos)
        if magic != MAGIC:
            if _only_zeros(view[pos:]):
                return ScanResult(records, pos, n - pos)  # preallocated or zero-filled by the crash
            raise JournalCorrupt(f"no journal record at offset {pos} (found {bytes(magic)!r})")
        body_start = pos + HEADER.size
        body_end = body_start + length
        if body_end > n:
            return ScanResult(records, pos, n - pos)  # the body runs past the end: torn
        body = view[body_start:body_end]
        if zlib.crc32(body) != crc:
            if body_end == n:
                return ScanResult(records, pos, n - pos)  # the last record, half written: torn
            raise JournalCorrupt(f"journal record at offset {pos} fails its checksum "
                                 f"and {n - body_end} bytes follow it")
        if length < _META_LEN.size:
            raise JournalCorrupt(f"journal record at offset {pos} is {length} bytes, too short for its metadata")
        (meta_len,) = _META_LEN.unpack_from(body, 0)
        if _META_LEN.size + meta_len > length:
            raise JournalCorrupt(f"journal record at offset {pos}: metadata of {meta_len} bytes in a "
                                 f"{length}-byte body")
        try:
            meta = json.loads(bytes(body[_META_LEN.size:_META_LEN.size + meta_len]))
        except ValueError as exc:
            raise JournalCorrupt(f"journal record at offset {pos}: unreadable metadata ({exc})") from None
        if not isinstance(meta, dict):
            raise JournalCorrupt(f"journal record at offset {pos}: metadata is not an object")
        records.append(Record(pos, body_end, meta, body[_META_LEN.size + meta_len:]))
        pos = body_end
    return ScanResult(records, pos, 0)


def _only_zeros(view: memoryview) -> bool:
    return not any(bytes(view))
