"""Deephaven null sentinels (BARRAGE-WIRE.md §5.5).

Deephaven stores a null of a primitive column as a reserved value: the minimum of each signed
integer type, 0xFFFF for char, and -MAX for floats. Everything carried as int64 on the wire
(timestamps, durations, Date(ms), Time(ns)) uses the int64 sentinel. The data buffer always holds
the sentinel at a null slot; with `use_deephaven_nulls` there is no validity bitmap for these
types and the reader turns sentinels back into nulls.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["sentinel_for", "has_sentinel", "fill_sentinels", "sentinels_to_nulls"]

_F32_MIN = float(-np.finfo(np.float32).max)
_F64_MIN = float(-np.finfo(np.float64).max)


def _storage_int_width(t: pa.DataType) -> Optional[int]:
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return 64
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return 32
    return None


def sentinel_for(t: pa.DataType):
    """The sentinel stored at a null slot of an array of Arrow type `t`, or None (no sentinel)."""
    if pa.types.is_int8(t):
        return -(2**7)
    if pa.types.is_int16(t):
        return -(2**15)
    if pa.types.is_int32(t):
        return -(2**31)
    if pa.types.is_int64(t):
        return -(2**63)
    if pa.types.is_uint16(t):  # char
        return 0xFFFF
    if pa.types.is_float32(t):
        return _F32_MIN
    if pa.types.is_float64(t):
        return _F64_MIN
    w = _storage_int_width(t)
    if w is not None:
        return -(2 ** (w - 1))
    return None


def has_sentinel(t: pa.DataType) -> bool:
    return sentinel_for(t) is not None


def _as_storage(arr: pa.Array) -> tuple[pa.Array, pa.DataType]:
    """A view of a temporal array as its integer storage type (no copy)."""
    w = _storage_int_width(arr.type)
    if w is None:
        return arr, arr.type
    it = pa.int64() if w == 64 else pa.int32()
    return arr.view(it), arr.type


def fill_sentinels(arr: pa.Array) -> pa.Array:
    """Returns `arr` with every null slot's value replaced by the type's sentinel (nulls kept)."""
    if arr.null_count == 0 or not has_sentinel(arr.type):
        return arr
    storage, original = _as_storage(arr)
    sentinel = sentinel_for(storage.type)
    filled = pc.fill_null(storage, pa.scalar(sentinel, type=storage.type))
    validity = pc.is_valid(arr).buffers()[1]
    out = pa.Array.from_buffers(storage.type, len(arr), [validity, filled.buffers()[1]], null_count=arr.null_count,
                                offset=0)
    return out.view(original) if original != storage.type else out


def sentinels_to_nulls(arr: pa.Array) -> pa.Array:
    """Marks every slot that holds the type's sentinel as null (the Deephaven-nulls reading)."""
    if not has_sentinel(arr.type):
        return arr
    storage, original = _as_storage(arr)
    sentinel = sentinel_for(storage.type)
    is_null = pc.equal(storage, pa.scalar(sentinel, type=storage.type))
    if not pc.any(is_null).as_py():
        return arr
    out = pc.if_else(is_null, pa.scalar(None, type=storage.type), storage)
    return out.view(original) if original != storage.type else out
