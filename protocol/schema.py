"""Schemas with Deephaven's metadata, and the Arrow <-> Deephaven type mapping (BARRAGE-WIRE.md §5).

Outgoing: `to_deephaven_schema` turns any Arrow schema into the one Deephaven's clients expect
(wire types, `deephaven:type` and friends, table attributes), and `to_wire_array` converts a
column's values to that wire type (timestamps to ns UTC, dates to Date(ms), decimals to
Deephaven's BigDecimal binary encoding, large types to 32-bit offsets).

Incoming: `deephaven_type_for` names the Deephaven type of a foreign Arrow type (§5.4) and
`from_wire_array` turns wire values back into natural Arrow values using `deephaven:type`.
"""
from __future__ import annotations

import struct
from typing import Mapping, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.protocol.errors import ProtocolError

__all__ = [
    "DH_TYPE",
    "DH_COMPONENT_TYPE",
    "deephaven_type_for",
    "wire_type_for",
    "to_deephaven_schema",
    "list_wrapped_schema",
    "unwrap_list_schema",
    "to_wire_array",
    "from_wire_array",
    "schema_message",
    "ipc_encapsulated_schema",
    "read_schema_message",
    "attributes_from_schema",
]

DH_TYPE = b"deephaven:type"
DH_COMPONENT_TYPE = b"deephaven:componentType"
_SORTABLE = b"deephaven:isSortable"

_ATTRIBUTE_TYPES = {
    bool: "java.lang.Boolean",
    int: "java.lang.Long",
    float: "java.lang.Double",
    str: "java.lang.String",
}
_PRIMITIVE_ARRAY_NAMES = {
    "byte": "byte[]", "short": "short[]", "int": "int[]", "long": "long[]", "float": "float[]",
    "double": "double[]", "char": "char[]", "java.lang.Boolean": "java.lang.Boolean[]",
}


def deephaven_type_for(t: pa.DataType) -> str:
    """The Deephaven column type (Java canonical name) for an Arrow type (§5.3 / §5.4)."""
    if pa.types.is_int8(t):
        return "byte"
    if pa.types.is_int16(t) or pa.types.is_uint8(t):
        return "short"
    if pa.types.is_int32(t):
        return "int"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "long"
    if pa.types.is_uint16(t):
        return "char"
    if pa.types.is_uint64(t):
        return "java.math.BigInteger"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_boolean(t):
        return "java.lang.Boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "java.lang.String"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "byte[]"
    if pa.types.is_timestamp(t):
        return "java.time.Instant" if t.tz in (None, "UTC", "Z", "+00:00", "Etc/UTC") else "java.time.ZonedDateTime"
    if pa.types.is_date(t):
        return "java.time.LocalDate"
    if pa.types.is_time(t):
        return "java.time.LocalTime"
    if pa.types.is_duration(t):
        return "java.time.Duration"
    if pa.types.is_decimal(t):
        return "java.math.BigDecimal"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = deephaven_type_for(t.value_type)
        return _PRIMITIVE_ARRAY_NAMES.get(inner, inner + "[]")
    if t == pa.month_day_nano_interval():
        return "org.apache.arrow.vector.PeriodDuration"
    raise ProtocolError(f"no Deephaven type for Arrow type {t}")


def wire_type_for(t: pa.DataType) -> pa.DataType:
    """The Arrow type Deephaven's clients receive for a column of Arrow type `t`."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("ns", "UTC")
    if pa.types.is_date(t):
        return pa.date64()
    if pa.types.is_time(t):
        return pa.time64("ns")
    if pa.types.is_duration(t):
        return pa.duration("ns")
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_decimal(t):
        return pa.binary()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_uint64(t):
        return pa.binary()
    if pa.types.is_float16(t):
        return pa.float32()
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(pa.field("", wire_type_for(t.value_type), nullable=True))
    return t


def _field_metadata(f: pa.Field, names: set[str]) -> dict[bytes, bytes]:
    md = dict(f.metadata or {})
    dh = md.get(DH_TYPE, b"").decode() or deephaven_type_for(f.type)
    md[DH_TYPE] = dh.encode()
    t = f.type
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        md.setdefault(DH_COMPONENT_TYPE, deephaven_type_for(t.value_type).encode())
    elif not dh.endswith("[]") and dh != "byte[]":
        md.setdefault(_SORTABLE, b"true")
    name = f.name
    if name == "__ROW__TABLE_STYLE_FORMAT":
        md[b"deephaven:isRowStyle"] = b"true"
    if name.endswith("__TABLE_STYLE_FORMAT"):
        md[b"deephaven:isStyle"] = b"true"
    if name.endswith("__TABLE_NUMBER_FORMAT"):
        md[b"deephaven:isNumberFormat"] = b"true"
    if name.endswith("__TABLE_DATE_FORMAT"):
        md[b"deephaven:isDateFormat"] = b"true"
    for suffix, key in (("__TABLE_STYLE_FORMAT", b"deephaven:styleColumn"),
                        ("__TABLE_NUMBER_FORMAT", b"deephaven:numberFormatColumn"),
                        ("__TABLE_DATE_FORMAT", b"deephaven:dateFormatColumn")):
        if name + suffix in names:
            md[key] = (name + suffix).encode()
    return md


def to_deephaven_schema(schema: pa.Schema, attributes: Optional[Mapping[str, object]] = None) -> pa.Schema:
    """The schema Deephaven's clients expect for a table of `schema` (wire types + metadata)."""
    names = set(schema.names)
    fields = []
    for f in schema:
        fields.append(pa.field(f.name, wire_type_for(f.type), nullable=True, metadata=_field_metadata(f, names)))
    md: dict[bytes, bytes] = {}
    for key, value in (attributes or {}).items():
        java = _ATTRIBUTE_TYPES.get(type(value))
        if java is None:
            md[f"deephaven:unsent.attribute.{key}".encode()] = b""
            continue
        text = ("true" if value else "false") if isinstance(value, bool) else str(value)
        md[f"deephaven:attribute.{key}".encode()] = text.encode()
        md[f"deephaven:attribute_type.{key}".encode()] = java.encode()
    return pa.schema(fields, metadata=md or None)


def attributes_from_schema(schema: pa.Schema) -> dict[str, object]:
    """Typed table attributes from `deephaven:attribute.*` metadata."""
    md = schema.metadata or {}
    out: dict[str, object] = {}
    for k, v in md.items():
        key = k.decode()
        if not key.startswith("deephaven:attribute."):
            continue
        name = key[len("deephaven:attribute."):]
        java = md.get(f"deephaven:attribute_type.{name}".encode(), b"java.lang.String").decode()
        text = v.decode()
        if java == "java.lang.Boolean":
            out[name] = text == "true"
        elif java in ("java.lang.Byte", "java.lang.Short", "java.lang.Integer", "java.lang.Long"):
            out[name] = int(text)
        elif java in ("java.lang.Float", "java.lang.Double"):
            out[name] = float(text)
        else:
            out[name] = text
    return out


def list_wrapped_schema(schema: pa.Schema) -> pa.Schema:
    """The `columns_as_list` schema: each field becomes a non-nullable List of itself (§5.6)."""
    fields = [pa.field(f.name, pa.list_(f), nullable=False, metadata=f.metadata) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def unwrap_list_schema(schema: pa.Schema) -> pa.Schema:
    fields = []
    for f in schema:
        if not pa.types.is_list(f.type):
            raise ProtocolError(f"column {f.name!r} is not list-wrapped ({f.type})")
        child = f.type.value_field
        fields.append(pa.field(f.name, child.type, nullable=True, metadata=child.metadata or f.metadata))
    return pa.schema(fields, metadata=schema.metadata)


# ----------------------------------------------------------------------------------------------
# values
# ----------------------------------------------------------------------------------------------

def _decimal_to_dh_binary(arr: pa.Array) -> pa.Array:
    """Decimal values -> Deephaven's BigDecimal bytes: int32 LE scale (trailing zeros stripped),
    then the unscaled value as minimal big-endian two's complement."""
    if pa.types.is_decimal128(arr.type) and arr.type.precision <= 18:
        return _decimal64_to_dh_binary(arr)
    return _decimal_to_dh_binary_any(arr)


def _decimal64_to_dh_binary(arr: pa.Array) -> pa.Array:
    """Vectorized form for precisions up to 18, whose unscaled values fit in int64."""
    n = len(arr)
    words = np.frombuffer(arr.buffers()[1], dtype="<i8", count=2 * (arr.offset + n))[2 * arr.offset:]
    v = words[0::2].copy()  # low 64 bits hold the whole value when precision <= 18
    scale = np.full(n, arr.type.scale, dtype=np.int64)
    for _ in range(arr.type.scale + 18):
        strip = (v % 10 == 0) & (v != 0)
        if not strip.any():
            break
        v = np.where(strip, v // 10, v)
        scale = np.where(strip, scale - 1, scale)
    scale = np.where(v == 0, 0, scale)
    k = np.ones(n, dtype=np.int64)
    for j in range(1, 8):
        k += (v >= (1 << (8 * j - 1))) | (v < -(1 << (8 * j - 1)))
    rows = np.empty((n, 12), dtype=np.uint8)
    rows[:, :4] = scale.astype("<i4").view(np.uint8).reshape(n, 4)
    rows[:, 4:] = v.astype(">i8").view(np.uint8).reshape(n, 8)
    keep = (np.arange(12) < 4) | (np.arange(12) >= (12 - k)[:, None])
    data = rows[keep]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(4 + k, out=offsets[1:])
    validity = None if arr.null_count == 0 else pa.compute.is_valid(arr).buffers()[1]
    out = pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                null_count=arr.null_count)
    if arr.null_count:
        # null slots carry no bytes (offsets repeat), as Deephaven writes them
        out = pa.compute.if_else(pa.compute.is_valid(arr), out, pa.scalar(None, pa.binary()))
    return out


def _decimal_to_dh_binary_any(arr: pa.Array) -> pa.Array:
    out = []
    for v in arr.to_pylist():
        if v is None:
            out.append(None)
            continue
        sign, digits, exp = v.normalize().as_tuple()
        unscaled = int("".join(map(str, digits))) if digits else 0
        if sign:
            unscaled = -unscaled
        scale = -exp
        nbytes = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
        out.append(struct.pack("<i", scale) + unscaled.to_bytes(nbytes, "big", signed=True))
    return pa.array(out, type=pa.binary())


def _dh_binary_to_decimal(arr: pa.Array) -> pa.Array:
    import decimal

    vals = []
    for b in arr.to_pylist():
        if b is None:
            vals.append(None)
            continue
        if len(b) < 5:
            raise ProtocolError(f"BigDecimal value of {len(b)} bytes is too short")
        scale = struct.unpack("<i", b[:4])[0]
        unscaled = int.from_bytes(b[4:], "big", signed=True)
        vals.append(decimal.Decimal(unscaled).scaleb(-scale))
    return pa.array(vals)


def to_wire_array(arr: pa.Array) -> pa.Array:
    """Converts one column's values to the wire type `wire_type_for(arr.type)`."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    target = wire_type_for(t)
    if target == t:
        return arr
    if pa.types.is_decimal(t):
        return _decimal_to_dh_binary(arr)
    if pa.types.is_date32(t):
        return pc.cast(arr, pa.date64())
    if pa.types.is_timestamp(t):
        return pc.cast(arr, pa.timestamp("ns", t.tz)).view(pa.int64()).view(pa.timestamp("ns", "UTC"))
    if pa.types.is_uint64(t):
        raise ProtocolError("uint64 columns are not supported; cast them to int64 or decimal first")
    return pc.cast(arr, target)


def from_wire_array(arr: pa.Array, dh_type: Optional[str]) -> pa.Array:
    """Wire values back to a natural Arrow type (BigDecimal binary -> decimal); others unchanged."""
    if dh_type == "java.math.BigDecimal" and pa.types.is_binary(arr.type):
        return _dh_binary_to_decimal(arr)
    return arr


# ----------------------------------------------------------------------------------------------
# schema messages
# ----------------------------------------------------------------------------------------------

def ipc_encapsulated_schema(schema: pa.Schema) -> bytes:
    """FF FF FF FF, int32 length, the Schema Message flatbuffer, zero padding to 8 (§1.2)."""
    return schema.serialize().to_pybytes()


def schema_message(schema: pa.Schema) -> bytes:
    """The raw Schema Message flatbuffer, as FlightData.data_header carries it."""
    enc = schema.serialize().to_pybytes()
    length = struct.unpack_from("<i", enc, 4)[0]
    return enc[8:8 + length]


def read_schema_message(data) -> pa.Schema:
    """Reads a Schema message in either form (raw flatbuffer or IPC-encapsulated)."""
    raw = bytes(data)
    if raw[:4] != b"\xff\xff\xff\xff":
        pad = (8 - len(raw) % 8) % 8
        raw = b"\xff\xff\xff\xff" + struct.pack("<i", len(raw) + pad) + raw + b"\x00" * pad
    try:
        return pa.ipc.read_schema(pa.py_buffer(raw))
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ProtocolError(f"malformed Arrow Schema message: {exc}") from None
