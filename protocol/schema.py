"""Schemas with Deephaven's metadata, the Arrow <-> Deephaven type mapping, value conversion and
null sentinels (docs/schema.md).

Outgoing: `to_deephaven_schema` turns any Arrow schema into the one Deephaven's clients expect:
wire types (docs/schema.md#type-mapping), `deephaven:type` and its companions on every field
(docs/schema.md#column-metadata), table attributes as schema metadata
(docs/schema.md#table-attributes). `to_wire_array` / `to_wire_arrays` convert column values to those wire
types (timestamps to ns UTC, dates to Date(ms), times to ns, durations to ns, decimals to
Deephaven's BigDecimal binary, uint64 to BigInteger binary, large and fixed-size types to their
32-bit-offset forms).

Incoming: `deephaven_type_for` names the Deephaven type of a foreign Arrow type (docs/schema.md#incoming-types),
`arrow_type_for_deephaven` gives the wire Arrow type of a Deephaven type name, and
`from_wire_array` / `from_wire_arrays` turn wire values back into natural Arrow values using
`deephaven:type` (BigDecimal binary -> decimal, LocalDate -> date32, ...).

Schema messages: `schema_message` is the raw Message flatbuffer carried by FlightData.data_header,
`ipc_encapsulated_schema` the `FF FF FF FF`-framed form of FlightInfo.schema, SchemaResult and
ExportedTableCreationResponse.schema_header; `read_schema_message` reads both.

Nulls (docs/schema.md#null-sentinels): `sentinel_for`, `fill_sentinels` (Arrow nulls -> sentinel
values in the data buffer, validity kept) and `sentinels_to_nulls` (the reading of `use_deephaven_nulls`).

Everything on a data path works on whole columns with numpy / pyarrow compute; the BigDecimal and
BigInteger codecs do multi-word arithmetic on 32-bit limbs, looping over limbs and digits, never
over rows.
"""
from __future__ import annotations

import struct
from typing import Iterable, Mapping, Optional, Sequence, Union

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import BytesLike

__all__ = [
    "DH_TYPE",
    "DH_COMPONENT_TYPE",
    "DH_IS_SORTABLE",
    "deephaven_type_for",
    "arrow_type_for_deephaven",
    "wire_type_for",
    "BARRAGE_SCHEMA",
    "keeps_upload_type",
    "is_upload_only_type",
    "served_types",
    "is_sortable_type",
    "to_deephaven_schema",
    "check_wire_schema",
    "attributes_from_schema",
    "list_wrapped_schema",
    "unwrap_list_schema",
    "is_list_wrapper_field",
    "to_wire_array",
    "to_wire_arrays",
    "from_wire_array",
    "from_wire_arrays",
    "decimal_to_deephaven_binary",
    "deephaven_binary_to_decimal",
    "schema_message",
    "ipc_encapsulated_schema",
    "read_schema_message",
    "sentinel_for",
    "has_sentinel",
    "fill_sentinels",
    "sentinels_to_nulls",
    "with_list_values",
    "empty_array",
    "java_strings",
]

DH_TYPE = b"deephaven:type"
DH_COMPONENT_TYPE = b"deephaven:componentType"
DH_IS_SORTABLE = b"deephaven:isSortable"
#: a partitioning column of a table read from partitioned storage (kept from the field's own metadata)
DH_IS_PARTITIONING = b"deephaven:isPartitioning"
_TRUE = b"true"

ROW_STYLE_COLUMN = "__ROW__TABLE_STYLE_FORMAT"
_STYLE_SUFFIX = "__TABLE_STYLE_FORMAT"
_NUMBER_FORMAT_SUFFIX = "__TABLE_NUMBER_FORMAT"
_DATE_FORMAT_SUFFIX = "__TABLE_DATE_FORMAT"

BIG_DECIMAL = "java.math.BigDecimal"
BIG_INTEGER = "java.math.BigInteger"
LOCAL_DATE = "java.time.LocalDate"
_STRING, _OBJECT, _MAP = "java.lang.String", "java.lang.Object", "java.util.Map"

_TS_NS_UTC = pa.timestamp("ns", "UTC")
_UTC_NAMES = (None, "UTC", "Z", "+00:00", "Etc/UTC", "GMT", "Etc/GMT")

# Deephaven type name -> wire Arrow type (docs/schema.md#type-mapping)
_SCALAR_WIRE_TYPES: dict[str, pa.DataType] = {
    "byte": pa.int8(), "java.lang.Byte": pa.int8(),
    "short": pa.int16(), "java.lang.Short": pa.int16(),
    "int": pa.int32(), "java.lang.Integer": pa.int32(),
    "long": pa.int64(), "java.lang.Long": pa.int64(),
    "char": pa.uint16(), "java.lang.Character": pa.uint16(),
    "float": pa.float32(), "java.lang.Float": pa.float32(),
    "double": pa.float64(), "java.lang.Double": pa.float64(),
    "boolean": pa.bool_(), "java.lang.Boolean": pa.bool_(),
    "java.lang.String": pa.string(),
    "java.time.Instant": _TS_NS_UTC,
    "java.time.ZonedDateTime": _TS_NS_UTC,
    LOCAL_DATE: pa.date64(),
    "java.time.LocalTime": pa.time64("ns"),
    "java.time.Duration": pa.duration("ns"),
    "org.apache.arrow.vector.PeriodDuration": pa.month_day_nano_interval(),
    BIG_DECIMAL: pa.binary(),
    BIG_INTEGER: pa.binary(),
    "byte[]": pa.binary(),
}

# io.deephaven.vector.<X>Vector -> element type name
_VECTOR_COMPONENTS = {
    "io.deephaven.vector.ByteVector": "byte",
    "io.deephaven.vector.ShortVector": "short",
    "io.deephaven.vector.IntVector": "int",
    "io.deephaven.vector.LongVector": "long",
    "io.deephaven.vector.CharVector": "char",
    "io.deephaven.vector.FloatVector": "float",
    "io.deephaven.vector.DoubleVector": "double",
}
_OBJECT_VECTOR = "io.deephaven.vector.ObjectVector"

# types that are primitive or implement java.lang.Comparable (get deephaven:isSortable)
_SORTABLE = frozenset([
    "byte", "short", "int", "long", "char", "float", "double", "boolean",
    "java.lang.Byte", "java.lang.Short", "java.lang.Integer", "java.lang.Long", "java.lang.Character",
    "java.lang.Float", "java.lang.Double", "java.lang.Boolean", "java.lang.String",
    "java.time.Instant", "java.time.ZonedDateTime", "java.time.LocalDate", "java.time.LocalTime",
    "java.time.Duration", BIG_DECIMAL, BIG_INTEGER,
])

_F32_NULL = float(-np.finfo(np.float32).max)
_F64_NULL = float(-np.finfo(np.float64).max)

# Deephaven type name -> null sentinel (docs/schema.md#null-sentinels); the boxed types share their primitive's sentinel
_DH_SENTINELS: dict[str, object] = {
    "byte": -(2**7), "java.lang.Byte": -(2**7),
    "short": -(2**15), "java.lang.Short": -(2**15),
    "int": -(2**31), "java.lang.Integer": -(2**31),
    "long": -(2**63), "java.lang.Long": -(2**63),
    "char": 0xFFFF, "java.lang.Character": 0xFFFF,
    "float": _F32_NULL, "java.lang.Float": _F32_NULL,
    "double": _F64_NULL, "java.lang.Double": _F64_NULL,
    "java.time.Instant": -(2**63), "java.time.ZonedDateTime": -(2**63), LOCAL_DATE: -(2**63),
    "java.time.LocalTime": -(2**63), "java.time.Duration": -(2**63),
}


# ----------------------------------------------------------------------------------------------
# type mapping
# ----------------------------------------------------------------------------------------------

def numpy_storage_dtype(t: pa.DataType) -> Optional[np.dtype]:
    """The numpy dtype that holds a fixed-width Arrow type's values (booleans unpacked; dates,
    times, timestamps and durations as their integer storage), or None for other types."""
    if pa.types.is_boolean(t):
        return np.dtype(bool)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        dtype: np.dtype = np.dtype(t.to_pandas_dtype())
        return dtype
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    return None


def _is_any_list(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
                or pa.types.is_list_view(t) or pa.types.is_large_list_view(t))


def deephaven_type_for(t: pa.DataType, *, nullable: bool = True, allow_large: bool = True) -> str:
    """The Deephaven column type (Java canonical name) for an Arrow type without `deephaven:type`
    (docs/schema.md#incoming-types).

    List types map to `<component>[]` (`int[]`, `java.lang.String[]`, `int[][]`). A non-nullable
    Bool maps to `boolean`. With `allow_large=False`, LargeUtf8/LargeBinary/LargeList are rejected
    the way Deephaven rejects them on input. Unsupported types raise ProtocolError."""
    if pa.types.is_dictionary(t):
        raise ProtocolError(f"dictionary-encoded type {t} has no Deephaven column type (decode it first)")
    if not allow_large and (pa.types.is_large_string(t) or pa.types.is_large_binary(t) or pa.types.is_large_list(t)):
        raise ProtocolError(f"Arrow type {t} is not accepted by Deephaven (64-bit offsets)")
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
        return BIG_INTEGER
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "float"
    if pa.types.is_float64(t):
        return "double"
    if pa.types.is_boolean(t):
        return "java.lang.Boolean" if nullable else "boolean"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "java.lang.String"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) \
            or pa.types.is_binary_view(t):
        return "byte[]"
    if pa.types.is_timestamp(t):
        return "java.time.Instant" if t.tz in _UTC_NAMES else "java.time.ZonedDateTime"
    if pa.types.is_date(t):
        return LOCAL_DATE
    if pa.types.is_time(t):
        return "java.time.LocalTime"
    if pa.types.is_duration(t):
        return "java.time.Duration"
    if pa.types.is_decimal(t):
        return BIG_DECIMAL
    if t == pa.month_day_nano_interval():
        return "org.apache.arrow.vector.PeriodDuration"
    if _is_any_list(t):
        return deephaven_type_for(t.value_type, allow_large=allow_large) + "[]"
    if pa.types.is_map(t):
        return "java.util.Map"
    if pa.types.is_null(t) or pa.types.is_union(t):
        return "java.lang.Object"
    raise ProtocolError(f"no Deephaven column type for Arrow type {t}")


def arrow_type_for_deephaven(dh_type: str, component_type: Optional[str] = None) -> pa.DataType:
    """The Arrow wire type Deephaven uses for a column of Deephaven type `dh_type` (docs/schema.md#type-mapping).

    Arrays (`int[]`, `java.lang.String[]`) and vectors (`io.deephaven.vector.IntVector`, or
    `ObjectVector` with `component_type`) are Lists whose child is named "" and nullable; `byte[]`
    is Binary. Any other class name is sent as its `toString()`, i.e. Utf8. `java.time.Period`
    (Interval YEAR_MONTH) has no pyarrow type and raises ProtocolError."""
    t = _SCALAR_WIRE_TYPES.get(dh_type)
    if t is not None:
        return t
    if dh_type == "java.time.Period":
        raise ProtocolError("java.time.Period (Arrow Interval YEAR_MONTH) has no pyarrow type")
    if dh_type.endswith("[]"):
        inner = dh_type[:-2]
        return pa.list_(pa.field("", arrow_type_for_deephaven(inner), nullable=True))
    if dh_type in _VECTOR_COMPONENTS:
        return pa.list_(pa.field("", arrow_type_for_deephaven(_VECTOR_COMPONENTS[dh_type]), nullable=True))
    if dh_type == _OBJECT_VECTOR:
        inner = component_type or "java.lang.String"
        return pa.list_(pa.field("", arrow_type_for_deephaven(inner), nullable=True))
    return pa.string()


def wire_type_for(t: pa.DataType) -> pa.DataType:
    """The Arrow type Deephaven's clients receive for a column of Arrow type `t` (docs/schema.md#type-mapping)."""
    if pa.types.is_dictionary(t):
        return wire_type_for(t.value_type)
    if pa.types.is_timestamp(t):
        return _TS_NS_UTC
    if pa.types.is_date(t):
        return pa.date64()
    if pa.types.is_time(t):
        return pa.time64("ns")
    if pa.types.is_duration(t):
        return pa.duration("ns")
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t) \
            or pa.types.is_decimal(t) or pa.types.is_uint64(t):
        return pa.binary()
    if pa.types.is_uint8(t):
        return pa.int16()
    if pa.types.is_uint32(t):
        return pa.int64()
    if pa.types.is_float16(t):
        return pa.float32()
    if _is_any_list(t):
        return pa.list_(pa.field("", wire_type_for(t.value_type), nullable=True))
    if pa.types.is_map(t) or pa.types.is_union(t) or pa.types.is_null(t):
        # Java objects (java.util.Map, java.lang.Object) of a table that no longer has its upload's
        # schema (Deephaven's head, view, ...): sent as their toString()
        return pa.string()
    if (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_string(t)
            or pa.types.is_binary(t) or t == pa.month_day_nano_interval()):
        return t
    raise ProtocolError(f"Arrow type {t} has no Barrage wire mapping")


#: The table attribute holding the Arrow schema a DoPut created the table with. As in Deephaven,
#: such a table is served with the uploaded Arrow types (docs/types.md) where `keeps_upload_type`
#: says so; the attribute itself is announced as `deephaven:unsent.attribute.BarrageSchema`.
BARRAGE_SCHEMA = "BarrageSchema"


def keeps_upload_type(t: pa.DataType) -> bool:
    """Whether a column uploaded with Arrow type `t` is served with that same type, as Deephaven
    42.7 serves it (docs/types.md): decimal128/256, timestamps of any unit and zone, dates, times
    and durations of any unit, unsigned integers (uint8 as `short`, uint16 as `char`, uint32 as
    `long`, uint64 as BigInteger), float16 (`float`), fixed_size_binary (`byte[]`), null
    (`java.lang.Object`), and fixed-size lists, lists and list_views (child name, nullability and
    all), maps (`java.util.Map`) and dense or sparse unions (`java.lang.Object`, type codes kept) of
    types that are kept or are sent unchanged anyway. Other types are served as `wire_type_for` says."""
    if (pa.types.is_decimal128(t) or pa.types.is_decimal256(t) or pa.types.is_timestamp(t)
            or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t)
            or pa.types.is_unsigned_integer(t) or pa.types.is_float16(t) or pa.types.is_fixed_size_binary(t)):
        return True
    if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t):
        return _kept_child(t.value_type)
    if pa.types.is_null(t):
        return True
    if pa.types.is_map(t):
        return _kept_child(t.key_type) and _kept_child(t.item_type)
    if pa.types.is_union(t):
        return all(_kept_child(t.field(i).type) for i in range(t.num_fields))
    return False


def _kept_child(v: pa.DataType) -> bool:
    """Whether a list element, map key or value, or union member of type `v` is kept as uploaded."""
    if keeps_upload_type(v):
        return True
    try:
        return not pa.types.is_nested(v) and not pa.types.is_dictionary(v) and wire_type_for(v) == v
    except ProtocolError:
        return False


def is_upload_only_type(t: pa.DataType) -> bool:
    """Types only a DoPut upload gives a table (Deephaven keeps them from the upload's Arrow schema
    and has no column type that is sent as them otherwise): map, dense and sparse union, list_view
    and null, at any depth of lists."""
    if pa.types.is_map(t) or pa.types.is_union(t) or pa.types.is_null(t) or pa.types.is_list_view(t):
        return True
    return bool(_is_any_list(t)) and is_upload_only_type(t.value_type)


def served_types(schema: pa.Schema, attributes: Optional[Mapping[str, object]] = None) -> list[pa.DataType]:
    """The Arrow type each column of a table is sent as: the type the table was uploaded with
    (its `BarrageSchema` attribute) where `keeps_upload_type` holds and the table still has that
    type, `wire_type_for` otherwise."""
    upload = (attributes or {}).get(BARRAGE_SCHEMA)
    kept = {}
    if isinstance(upload, pa.Schema):
        kept = {f.name: f.type for f in upload if keeps_upload_type(f.type)}
    return [f.type if kept.get(f.name) == f.type else wire_type_for(f.type) for f in schema]


def is_sortable_type(dh_type: str) -> bool:
    """Whether Deephaven marks a column of this type `isSortable` (primitive or Comparable)."""
    return dh_type in _SORTABLE


# ----------------------------------------------------------------------------------------------
# schemas
# ----------------------------------------------------------------------------------------------

def _field_metadata(f: pa.Field, names: set[str]) -> dict[bytes, bytes]:
    user = dict(f.metadata or {})
    explicit = user.get(DH_TYPE)
    dh = explicit.decode() if explicit else deephaven_type_for(f.type)
    md: dict[bytes, bytes] = {}
    if user.get(DH_IS_PARTITIONING) == _TRUE:
        md[DH_IS_PARTITIONING] = _TRUE
    if is_sortable_type(dh):
        md[DH_IS_SORTABLE] = _TRUE
    md[DH_TYPE] = dh.encode()
    if _is_any_list(f.type) and DH_COMPONENT_TYPE not in user:
        component = deephaven_type_for(f.type.value_type)
        # Deephaven 42.7 names java.lang.String the component of an uploaded list of nulls (Object[])
        # or of maps (java.util.Map[])
        md[DH_COMPONENT_TYPE] = (_STRING if component in (_OBJECT, _MAP) else component).encode()
    name = f.name
    for suffix, key in ((_STYLE_SUFFIX, b"deephaven:styleColumn"),
                        (_NUMBER_FORMAT_SUFFIX, b"deephaven:numberFormatColumn"),
                        (_DATE_FORMAT_SUFFIX, b"deephaven:dateFormatColumn")):
        if name + suffix in names:
            md[key] = (name + suffix).encode()
    if name == ROW_STYLE_COLUMN:
        md[b"deephaven:isRowStyle"] = _TRUE
    if name.endswith(_STYLE_SUFFIX):
        md[b"deephaven:isStyle"] = _TRUE
    if name.endswith(_NUMBER_FORMAT_SUFFIX):
        md[b"deephaven:isNumberFormat"] = _TRUE
    if name.endswith(_DATE_FORMAT_SUFFIX):
        md[b"deephaven:isDateFormat"] = _TRUE
    md.update(user)  # metadata already on the field wins (description, partitioning, input-table keys, ...)
    return md


def _attribute_entry(value: object) -> Optional[tuple[str, str]]:
    """(text, Java class) of an attribute value Deephaven sends as metadata, None otherwise."""
    if isinstance(value, (bool, np.bool_)):
        return ("true" if value else "false"), "java.lang.Boolean"
    if isinstance(value, np.integer):
        java = {1: "java.lang.Byte", 2: "java.lang.Short", 4: "java.lang.Integer"}.get(value.dtype.itemsize,
                                                                                      "java.lang.Long")
        return str(int(value)), java
    if isinstance(value, int):
        if -(2**63) <= value < 2**63:
            return str(value), "java.lang.Long"
        return None
    if isinstance(value, np.floating):
        return repr(float(value)), ("java.lang.Float" if value.dtype.itemsize == 4 else "java.lang.Double")
    if isinstance(value, float):
        return repr(value), "java.lang.Double"
    if isinstance(value, str):
        return value, "java.lang.String"
    return None


def to_deephaven_schema(schema: pa.Schema, attributes: Optional[Mapping[str, object]] = None) -> pa.Schema:
    """The schema Deephaven's clients expect for a table of `schema` (wire types + metadata).

    Every field becomes nullable with its wire type (docs/schema.md#type-mapping), or the type it
    was uploaded with when `attributes` hold a `BarrageSchema` (`served_types`), and gets `deephaven:type` (an explicit
    one on the input field wins), `isSortable` for primitive/Comparable types, `componentType` for
    lists, and the style/format markers of docs/schema.md#column-metadata. `attributes` become
    schema metadata (docs/schema.md#table-attributes):
    `deephaven:attribute.<Name>` + `deephaven:attribute_type.<Name>` for bool (Boolean), int
    (Long; numpy ints by width), float (Double; numpy float32 -> Float) and str (String) values,
    and `deephaven:unsent.attribute.<Name>` for anything else. Typical attributes: IsFlat,
    BlinkTable, AddOnly, AppendOnly. Schema metadata already present on `schema` is kept."""
    names = set(schema.names)
    fields = [pa.field(f.name, t, nullable=True, metadata=_field_metadata(f, names))
              for f, t in zip(schema, served_types(schema, attributes))]
    md: dict[bytes, bytes] = dict(schema.metadata or {})
    for key, value in (attributes or {}).items():
        entry = _attribute_entry(value)
        if entry is None:
            md[f"deephaven:unsent.attribute.{key}".encode()] = b""
            continue
        text, java = entry
        md[f"deephaven:attribute.{key}".encode()] = text.encode()
        md[f"deephaven:attribute_type.{key}".encode()] = java.encode()
    return pa.schema(fields, metadata=md or None)


def check_wire_schema(schema: pa.Schema, attributes: Optional[Mapping[str, object]] = None) -> None:
    """Raises ProtocolError naming the first column whose type cannot be served to Deephaven's
    clients (no Deephaven column type or no wire type: dictionary-encoded, struct, map, union,
    null). Call it before a table is made from a schema, so nothing unservable is registered.
    A column whose type the table keeps from its upload (`attributes` holding the `BarrageSchema`
    of a DoPut, `keeps_upload_type`) is served as that type: map, union and null columns included."""
    upload = (attributes or {}).get(BARRAGE_SCHEMA)
    kept = {f.name: f.type for f in upload if keeps_upload_type(f.type)} if isinstance(upload, pa.Schema) else {}
    for f in schema:
        if kept.get(f.name) != f.type and (pa.types.is_map(f.type) or pa.types.is_union(f.type)
                                           or pa.types.is_null(f.type)):
            raise ProtocolError(f"column {f.name!r} has type {f.type}, which cannot be served: only a table "
                                f"uploaded with it (DoPut) has such a column")
        if kept.get(f.name) == f.type:
            try:
                deephaven_type_for(f.type)
            except ProtocolError as exc:
                raise ProtocolError(f"column {f.name!r} has type {f.type}, which cannot be served: {exc}") from None
            continue
        try:
            wire_type_for(f.type)
            explicit = (f.metadata or {}).get(DH_TYPE)
            if not explicit:
                deephaven_type_for(f.type)
        except ProtocolError as exc:
            raise ProtocolError(f"column {f.name!r} has type {f.type}, which cannot be served: {exc}") from None


def attributes_from_schema(schema: pa.Schema) -> dict[str, object]:
    """Typed table attributes from `deephaven:attribute.*` / `deephaven:attribute_type.*` metadata."""
    md = schema.metadata or {}
    out: dict[str, object] = {}
    prefix = b"deephaven:attribute."
    for k, v in md.items():
        if not k.startswith(prefix):
            continue
        name = k[len(prefix):].decode()
        java = md.get(b"deephaven:attribute_type." + k[len(prefix):], b"java.lang.String").decode()
        text = v.decode()
        try:
            if java == "java.lang.Boolean":
                out[name] = text.lower() == "true"
            elif java in ("java.lang.Byte", "java.lang.Short", "java.lang.Integer", "java.lang.Long"):
                out[name] = int(text)
            elif java in ("java.lang.Float", "java.lang.Double"):
                out[name] = float(text)
            elif java == "java.lang.Character":
                out[name] = text[:1]
            else:
                out[name] = text
        except ValueError:
            raise ProtocolError(f"schema attribute {name!r}: {text!r} is not a valid {java}") from None
    return out


def list_wrapped_schema(schema: pa.Schema) -> pa.Schema:
    """The `columns_as_list` schema (docs/schema.md#list-wrapped-schemas): each field becomes a
    non-nullable List with the same name and metadata, whose single child is the original field."""
    fields = [pa.field(f.name, pa.list_(f), nullable=False, metadata=f.metadata) for f in schema]
    return pa.schema(fields, metadata=schema.metadata)


def is_list_wrapper_field(f: pa.Field) -> bool:
    """True for a `columns_as_list` wrapper: a non-nullable List whose child has the field's own name.
    (A real list column is nullable and its child is named "".)"""
    return pa.types.is_list(f.type) and not f.nullable and f.type.value_field.name == f.name


def unwrap_list_schema(schema: pa.Schema) -> pa.Schema:
    """The inverse of `list_wrapped_schema`: each List field is replaced by its child, keeping the name."""
    fields = []
    for f in schema:
        if not pa.types.is_list(f.type):
            raise ProtocolError(f"column {f.name!r} is not list-wrapped ({f.type})")
        child = f.type.value_field
        fields.append(pa.field(f.name, child.type, nullable=child.nullable, metadata=child.metadata or f.metadata))
    return pa.schema(fields, metadata=schema.metadata)


# ----------------------------------------------------------------------------------------------
# multi-word integers on 32-bit limbs: (n, L) uint64 arrays, limb 0 least significant
# ----------------------------------------------------------------------------------------------

_M32 = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def _limbs_from_le(raw: np.ndarray) -> np.ndarray:
    """(n, 4L) little-endian bytes -> (n, L) limbs."""
    raw = np.ascontiguousarray(raw)
    n, w = raw.shape
    return raw.view("<u4").reshape(n, w // 4).astype(np.uint64)


def _limbs_to_le(limbs: np.ndarray) -> np.ndarray:
    """(n, L) limbs -> (n, 4L) little-endian bytes."""
    n, L = limbs.shape
    return np.ascontiguousarray(limbs.astype("<u4")).view(np.uint8).reshape(n, 4 * L)


def _negate_rows(limbs: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Two's complement negation (mod 2^(32L)) of the rows selected by the bool mask `rows`."""
    out: np.ndarray = limbs.copy()
    if not rows.any():
        return out
    sub = (~limbs[rows]) & _M32
    carry = np.ones(sub.shape[0], dtype=np.uint64)
    for i in range(sub.shape[1]):
        cur = sub[:, i] + carry
        sub[:, i] = cur & _M32
        carry = cur >> _S32
    out[rows] = sub
    return out


def _divmod10(mag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    q = np.empty_like(mag)
    r = np.zeros(mag.shape[0], dtype=np.uint64)
    for i in range(mag.shape[1] - 1, -1, -1):
        cur = (r << _S32) | mag[:, i]
        q[:, i] = cur // np.uint64(10)
        r = cur % np.uint64(10)
    return q, r


def _mul10(mag: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    out = np.empty_like(mag)
    carry = np.zeros(mag.shape[0], dtype=np.uint64)
    for i in range(mag.shape[1]):
        cur = mag[:, i] * np.uint64(10) + carry
        out[:, i] = cur & _M32
        carry = cur >> _S32
    return out, carry


def _bit_length(mag: np.ndarray) -> np.ndarray:
    n, L = mag.shape
    nz = mag != 0
    has = nz.any(axis=1)
    top = L - 1 - np.argmax(nz[:, ::-1], axis=1)
    top_limb = mag[np.arange(n), top]
    bits = np.frexp(top_limb.astype(np.float64))[1].astype(np.int64)  # exact below 2^53
    return np.where(has, 32 * top.astype(np.int64) + bits, 0)


def _pow10_limbs(p: int, L: int) -> np.ndarray:
    v = 10 ** p
    return np.array([(v >> (32 * i)) & 0xFFFFFFFF for i in range(L)], dtype=np.uint64)


def _less_than(mag: np.ndarray, const: np.ndarray) -> np.ndarray:
    lt = np.zeros(mag.shape[0], dtype=bool)
    eq = np.ones(mag.shape[0], dtype=bool)
    for i in range(mag.shape[1] - 1, -1, -1):
        lt |= eq & (mag[:, i] < const[i])
        eq &= mag[:, i] == const[i]
    return lt


def _validity_buffer(valid: np.ndarray) -> tuple[Optional[pa.Buffer], int]:
    nulls = int(valid.size - np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _valid_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.ones(len(arr), dtype=bool)
    valid: np.ndarray = pc.is_valid(arr).to_numpy(zero_copy_only=False)
    return valid


def _signed_to_min_bytes(neg: np.ndarray, mag: np.ndarray, valid: np.ndarray,
                         scale: Optional[np.ndarray]) -> pa.Array:
    """Binary values: [int32 LE scale] + minimal big-endian two's complement of (-1)^neg * mag,
    as Java's `BigInteger.toByteArray`. Null rows get no bytes."""
    n, L = mag.shape
    mag = np.concatenate([mag, np.zeros((n, 1), dtype=np.uint64)], axis=1)  # room for the sign bit
    L += 1
    # bytes needed: bitLength(v >= 0 ? v : -v - 1) / 8 + 1
    for_len = mag.copy()
    dec = neg & valid
    if dec.any():
        # mag - 1 for negative rows (mag >= 1 there)
        sub = for_len[dec]
        borrow = np.ones(sub.shape[0], dtype=np.uint64)
        for i in range(L):
            cur = sub[:, i] - borrow
            new_borrow = (sub[:, i] < borrow).astype(np.uint64)
            sub[:, i] = cur & _M32
            borrow = new_borrow
        for_len[dec] = sub
    k = _bit_length(for_len) // 8 + 1
    twos = _negate_rows(mag, dec)
    be = _limbs_to_le(twos)[:, ::-1]
    width = 4 * L
    prefix = 0 if scale is None else 4
    rows = np.empty((n, prefix + width), dtype=np.uint8)
    if scale is not None:
        rows[:, :4] = np.ascontiguousarray(scale.astype("<i4")).view(np.uint8).reshape(n, 4)
    rows[:, prefix:] = be
    k = np.where(valid, k, 0)
    cols = np.arange(prefix + width)
    keep = ((cols < prefix)[None, :] & valid[:, None]) | (cols[None, :] >= (prefix + width - k)[:, None])
    data = rows[keep]
    offsets = np.zeros(n + 1, dtype=np.int32)
    lengths = np.where(valid, prefix + k, 0)
    np.cumsum(lengths, out=offsets[1:])
    validity, nulls = _validity_buffer(valid)
    return pa.Array.from_buffers(pa.binary(), n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _decimal_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(negative, magnitude limbs, valid) of a decimal32/64/128/256 array."""
    n = len(arr)
    width = arr.type.bit_width // 8
    raw = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=(arr.offset + n) * width)[arr.offset * width:]
    raw = raw.reshape(n, width)
    limbs = _limbs_from_le(raw)
    valid = _valid_mask(arr)
    neg = ((raw[:, -1] & 0x80) != 0) & valid
    mag = _negate_rows(limbs, neg)
    mag[~valid] = 0
    return neg, mag, valid


def decimal_to_deephaven_binary(arr: pa.Array) -> pa.Array:
    """Decimal values -> Deephaven's BigDecimal wire bytes: int32 LE scale of the value with trailing
    zeros stripped (0 for zero, negative for e.g. 100 -> 1E+2), then the unscaled value as minimal
    big-endian two's complement. Nulls stay null with no bytes."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if not pa.types.is_decimal(arr.type):
        raise TypeError(f"expected a decimal array, got {arr.type}")
    neg, mag, valid = _decimal_parts(arr)
    n = len(arr)
    scale = np.full(n, arr.type.scale, dtype=np.int64)
    nonzero = mag.any(axis=1)
    scale[~nonzero] = 0
    active = np.flatnonzero(nonzero & valid)
    while active.size:
        q, r = _divmod10(mag[active])
        strip = r == 0
        done = active[strip]
        mag[done] = q[strip]
        scale[done] -= 1
        active = done
    return _signed_to_min_bytes(neg, mag, valid, scale)


def _unsigned_to_biginteger(arr: pa.Array) -> pa.Array:
    n = len(arr)
    valid = _valid_mask(arr)
    v = np.frombuffer(arr.buffers()[1], dtype="<u8", count=arr.offset + n)[arr.offset:].copy()
    v[~valid] = 0
    mag = np.stack([v & _M32, v >> _S32], axis=1)
    return _signed_to_min_bytes(np.zeros(n, dtype=bool), mag, valid, None)


def _parse_min_bytes(arr: pa.Array, with_scale: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Inverse of `_signed_to_min_bytes`: (negative, magnitude limbs, scale, valid)."""
    what = "BigDecimal" if with_scale else "BigInteger"
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise ProtocolError(f"{what} column must be Binary on the wire, got {arr.type}")
    n = len(arr)
    odt = np.int32 if pa.types.is_binary(arr.type) else np.int64
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=odt, count=arr.offset + n + 1)[arr.offset:].astype(np.int64) \
        if n else np.zeros(1, dtype=np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    valid = _valid_mask(arr)
    lengths = np.diff(offsets)
    prefix = 4 if with_scale else 0
    short = valid & (lengths < prefix + 1)
    if short.any():
        i = int(np.flatnonzero(short)[0])
        raise ProtocolError(f"{what} value {i} has {int(lengths[i])} bytes, needs at least {prefix + 1}")
    u = np.where(valid, lengths - prefix, 0)
    L = max(1, int(-(-int(u.max(initial=0)) // 4)))
    width = 4 * L
    starts = offsets[:-1] + prefix
    neg = np.zeros(n, dtype=bool)
    has = u > 0
    neg[has] = (data[starts[has]] & 0x80) != 0
    be = np.zeros((n, width), dtype=np.uint8)
    be[neg] = 0xFF
    total = int(u.sum())
    if total:
        row = np.repeat(np.arange(n), u)
        within = np.arange(total) - np.repeat(np.cumsum(u) - u, u)
        be[row, np.repeat(width - u, u) + within] = data[np.repeat(starts, u) + within]
    limbs = _limbs_from_le(be[:, ::-1])
    mag = _negate_rows(limbs, neg)
    scale = np.zeros(n, dtype=np.int64)
    if with_scale and valid.any():
        idx = offsets[:-1][valid][:, None] + np.arange(4)
        scale[valid] = np.ascontiguousarray(data[idx]).view("<i4").reshape(-1)
    return neg, mag, scale, valid


def _assemble_decimal(neg: np.ndarray, mag: np.ndarray, scale: np.ndarray, valid: np.ndarray,
                      target: Optional[pa.DataType], what: str) -> pa.Array:
    n = mag.shape[0]
    nonzero = mag.any(axis=1) & valid
    if target is not None:
        out_scale = target.scale
    else:
        out_scale = max(0, int(scale[nonzero].max(initial=0)))
    exp = np.where(nonzero, out_scale - scale, 0)
    if (exp < 0).any():
        i = int(np.flatnonzero(exp < 0)[0])
        raise ProtocolError(f"{what} value {i} has scale {int(scale[i])}, more than the target scale {out_scale}")
    if int(exp.max(initial=0)) > 76:
        raise ProtocolError(f"{what} values span more than 76 decimal digits of scale")
    work = np.concatenate([mag, np.zeros((n, max(0, 9 - mag.shape[1])), dtype=np.uint64)], axis=1)
    for step in range(int(exp.max(initial=0))):
        rows = np.flatnonzero(exp > step)
        prod, carry = _mul10(work[rows])
        if carry.any():
            raise ProtocolError(f"{what} value too large for a decimal256")
        work[rows] = prod
    if target is None:
        precision = 38 if _less_than(work, _pow10_limbs(38, work.shape[1])).all() else 76
        target = pa.decimal128(38, out_scale) if precision == 38 else pa.decimal256(76, out_scale)
    if not _less_than(work, _pow10_limbs(target.precision, work.shape[1])).all():
        raise ProtocolError(f"{what} value does not fit {target}")
    out_limbs = target.bit_width // 32
    twos = _negate_rows(work[:, :out_limbs], neg & valid)
    twos[~valid] = 0
    validity, nulls = _validity_buffer(valid)
    return pa.Array.from_buffers(target, n, [validity, pa.py_buffer(_limbs_to_le(twos))], null_count=nulls)


def deephaven_binary_to_decimal(arr: pa.Array, target: Optional[pa.DataType] = None) -> pa.Array:
    """Deephaven BigDecimal wire bytes -> a decimal array. Without `target`, the scale is the
    largest value scale (at least 0) and the type decimal128(38, s), or decimal256(76, s) when a
    value needs more digits. Values that would need rounding or do not fit raise ProtocolError."""
    if target is not None and not pa.types.is_decimal(target):
        raise TypeError(f"target must be a decimal type, got {target}")
    neg, mag, scale, valid = _parse_min_bytes(arr, True)
    return _assemble_decimal(neg, mag, scale, valid, target, "BigDecimal")


def _biginteger_to_arrow(arr: pa.Array, target: Optional[pa.DataType]) -> pa.Array:
    neg, mag, scale, valid = _parse_min_bytes(arr, False)
    dec_target = target if target is not None and pa.types.is_decimal(target) else None
    out = _assemble_decimal(neg, mag, scale, valid, dec_target, "BigInteger")
    if target is not None and not pa.types.is_decimal(target):
        try:
            out = pc.cast(out, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ProtocolError(f"BigInteger values do not fit {target}: {exc}") from None
    return out


# ----------------------------------------------------------------------------------------------
# value conversion
# ----------------------------------------------------------------------------------------------

def _rebuild_list(arr: pa.Array, values: pa.Array) -> pa.Array:
    """A List array with `arr`'s offsets and validity over new child `values`."""
    t = pa.list_(pa.field("", values.type, nullable=True))
    validity = arr.buffers()[0] if arr.null_count else None
    return pa.Array.from_buffers(t, len(arr), [validity, arr.buffers()[1]], null_count=arr.null_count,
                                 offset=arr.offset, children=[values])


def to_wire_array(arr: Union[pa.Array, pa.ChunkedArray], wire_type: Optional[pa.DataType] = None) -> pa.Array:
    """Converts one column's values to `wire_type_for(arr.type)` (docs/schema.md#type-mapping); wire-typed input is
    returned unchanged (no copy). With `wire_type` (one of `served_types`), values already of that
    type are returned unchanged too (an uploaded type the table keeps)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if wire_type is not None and t == wire_type:
        return arr
    if pa.types.is_dictionary(t):
        return to_wire_array(arr.dictionary_decode())
    target = wire_type_for(t)
    if pa.types.is_list(t):
        values = arr.values
        wire_values = to_wire_array(values)
        if wire_values is values and t.value_field.name == "" and t.value_field.nullable \
                and not t.value_field.metadata:
            return arr
        return _rebuild_list(arr, wire_values)
    if pa.types.is_list_view(t):
        # (pyarrow's cast of a list_view to a list gives an offsets buffer one entry short)
        lengths = pc.fill_null(pc.list_value_length(arr), 0).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(arr) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        validity = pc.is_valid(arr).buffers()[1] if arr.null_count else None
        listed = pa.Array.from_buffers(pa.list_(t.value_field), len(arr), [validity, pa.py_buffer(offsets)],
                                       null_count=arr.null_count, children=[pc.list_flatten(arr)])
        return to_wire_array(listed)
    if _is_any_list(t):
        return to_wire_array(pc.cast(arr, pa.list_(t.value_field)))
    if target == t:
        return arr
    if pa.types.is_map(t) or pa.types.is_union(t) or pa.types.is_null(t):
        return java_strings(arr)
    if pa.types.is_decimal(t):
        return decimal_to_deephaven_binary(arr)
    if pa.types.is_uint64(t):
        return _unsigned_to_biginteger(arr)
    if pa.types.is_timestamp(t):
        return pc.cast(arr, pa.timestamp("ns", t.tz)).view(pa.int64()).view(_TS_NS_UTC)
    return pc.cast(arr, target)


def java_strings(arr: pa.Array, *, in_container: bool = False) -> pa.Array:
    """The Java toString() of each value, as Deephaven sends an Object column (utf8): integers and
    strings as they are, booleans `true`/`false`, integral floats with `.0` (others as Arrow prints
    them), maps `{k=v, k2=null}`, a union's member value, nulls null (`null` inside a map). Whole-array
    operations: a cast per member or child, no per-row Python. Raises ProtocolError for values
    without such a text here (lists, binaries, temporal values inside a map or union)."""
    t = arr.type
    n = len(arr)
    if pa.types.is_null(t):
        out = pa.nulls(n, pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        out = pc.cast(arr, pa.string())
    elif pa.types.is_boolean(t) or pa.types.is_integer(t):
        out = pc.cast(arr, pa.string())
    elif pa.types.is_floating(t):
        text = pc.cast(arr, pa.string())
        f = pc.cast(arr, pa.float64())
        integral = pc.and_(pc.equal(f, pc.floor(f)), pc.less(pc.abs(f), 1e7))
        out = pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)
    elif pa.types.is_map(t):
        entries = arr.values
        keys = java_strings(entries.field(0), in_container=True)
        items = java_strings(entries.field(1), in_container=True)
        pairs = pc.binary_join_element_wise(keys, items, "=")
        validity = arr.buffers()[0] if arr.null_count else None
        lists = pa.Array.from_buffers(pa.list_(pa.string()), n, [validity, arr.buffers()[1]],
                                      null_count=arr.null_count, offset=arr.offset, children=[pairs])
        out = pc.binary_join_element_wise("{", pc.binary_join(lists, ", "), "}", "")
    elif pa.types.is_union(t):
        bufs = arr.buffers()  # (pyarrow's type_codes and offsets accessors ignore a slice's offset)
        codes = pa.Array.from_buffers(pa.int8(), n, [None, bufs[1]], offset=arr.offset)
        offsets = pa.Array.from_buffers(pa.int32(), n, [None, bufs[2]], offset=arr.offset) \
            if t.mode == "dense" else None
        out = pa.nulls(n, pa.string())
        for i, code in enumerate(t.type_codes):
            member = java_strings(arr.field(i))
            if offsets is not None:
                member = member.take(pc.if_else(pc.equal(codes, code), offsets, 0)) if len(member) else \
                    pa.nulls(n, pa.string())
            out = pc.if_else(pc.equal(codes, pa.scalar(code, pa.int8())), member, out)
        return out
    else:
        raise ProtocolError(f"no Java text for {t} values here")
    return pc.fill_null(out, "null") if in_container else out


def to_wire_arrays(data: Union[pa.Table, pa.RecordBatch, Sequence[pa.Array]]) -> list[pa.Array]:
    """`to_wire_array` for every column of a Table, RecordBatch or sequence of arrays."""
    if isinstance(data, (pa.Table, pa.RecordBatch)):
        data = data.columns
    return [to_wire_array(c) for c in data]


def _component_of(dh_type: Optional[str], component: Optional[str]) -> Optional[str]:
    if component:
        return component
    if dh_type is None:
        return None
    if dh_type.endswith("[]"):
        return dh_type[:-2]
    return _VECTOR_COMPONENTS.get(dh_type)


def from_wire_array(arr: Union[pa.Array, pa.ChunkedArray], dh_type: Optional[str] = None, *,
                    component_type: Optional[str] = None, target_type: Optional[pa.DataType] = None) -> pa.Array:
    """Wire values back to natural Arrow values, guided by the Deephaven type.

    BigDecimal binary -> decimal (see `deephaven_binary_to_decimal`), BigInteger binary -> decimal
    with scale 0, LocalDate Date(ms) -> date32; list children are converted by their component
    type. With `target_type` the result is cast to that type (e.g. back to a user schema's
    timestamp unit or zone, uint8, date64). Other values are returned unchanged (no copy).
    Sentinels are left alone (see `sentinels_to_nulls`)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    t = arr.type
    if dh_type == BIG_DECIMAL and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        dec_target = target_type if target_type is not None and pa.types.is_decimal(target_type) else None
        out = deephaven_binary_to_decimal(arr, dec_target)
    elif dh_type == BIG_INTEGER and (pa.types.is_binary(t) or pa.types.is_large_binary(t)):
        return _biginteger_to_arrow(arr, target_type)
    elif dh_type == LOCAL_DATE and pa.types.is_date64(t) and target_type is None:
        return pc.cast(arr, pa.date32())
    elif pa.types.is_list(t):
        comp = _component_of(dh_type, component_type)
        child_target = target_type.value_type if target_type is not None and _is_any_list(target_type) else None
        child = arr.values
        values = from_wire_array(child, comp, target_type=child_target)
        # unchanged values keep the list as sent (its child's name: "item" in a kept upload type)
        out = arr if values is child else _rebuild_list(arr, values)
    else:
        out = arr
    if target_type is not None and out.type != target_type:
        try:
            out = pc.cast(out, target_type)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise ProtocolError(f"cannot convert {t} values to {target_type}: {exc}") from None
    return out


def from_wire_arrays(arrays: Sequence[pa.Array], schema: pa.Schema,
                     target_schema: Optional[pa.Schema] = None) -> list[pa.Array]:
    """`from_wire_array` for every column, with each field's `deephaven:type` and `componentType`
    (list-wrapped schemas are unwrapped first) and, optionally, the types of `target_schema`."""
    fields = [f.type.value_field if is_list_wrapper_field(f) else f for f in schema]
    if len(arrays) != len(fields):
        raise ValueError(f"{len(arrays)} arrays for a schema of {len(fields)} fields")
    out = []
    for i, (arr, f) in enumerate(zip(arrays, fields)):
        md = f.metadata or {}
        dh = md.get(DH_TYPE)
        comp = md.get(DH_COMPONENT_TYPE)
        target = target_schema.field(i).type if target_schema is not None else None
        out.append(from_wire_array(arr, dh.decode() if dh else None,
                                   component_type=comp.decode() if comp else None, target_type=target))
    return out


# ----------------------------------------------------------------------------------------------
# schema messages
# ----------------------------------------------------------------------------------------------

_CONTINUATION = b"\xff\xff\xff\xff"


def ipc_encapsulated_schema(schema: pa.Schema) -> bytes:
    """`FF FF FF FF`, int32 LE length, the Schema Message flatbuffer, zero padding to a multiple of 8
    (docs/messages.md#arrow-message-headers-and-encapsulated-schemas): the form of FlightInfo.schema,
    SchemaResult.schema and ExportedTableCreationResponse.schema_header."""
    raw: bytes = schema.serialize().to_pybytes()
    return raw


def schema_message(schema: pa.Schema) -> bytes:
    """The raw Schema Message flatbuffer (root offset first, no continuation, no length), as
    FlightData.data_header carries it."""
    enc: bytes = schema.serialize().to_pybytes()
    length = struct.unpack_from("<i", enc, 4)[0]
    return enc[8:8 + length]


def read_schema_message(data: BytesLike) -> pa.Schema:
    """Reads a Schema message in either form: raw flatbuffer or IPC-encapsulated."""
    raw = bytes(data)
    if len(raw) < 8:
        raise ProtocolError(f"Arrow Schema message of {len(raw)} bytes is too short")
    if raw[:4] == _CONTINUATION:
        length = struct.unpack_from("<i", raw, 4)[0]
        if length < 8 or length > len(raw) - 8:
            raise ProtocolError(f"IPC-encapsulated schema: length {length} does not fit in {len(raw) - 8} bytes")
        raw = raw[8:8 + length]
    pad = (8 - len(raw) % 8) % 8
    framed = _CONTINUATION + struct.pack("<i", len(raw) + pad) + raw + b"\x00" * pad
    try:
        schema = pa.ipc.read_schema(pa.py_buffer(framed))
    except (pa.ArrowException, ValueError, OSError, IndexError) as exc:
        raise ProtocolError(f"malformed Arrow Schema message: {exc}") from None
    try:
        _check_names(list(schema))
    except UnicodeDecodeError:
        raise ProtocolError("Arrow Schema message: a field name is not UTF-8") from None
    return schema


def _check_names(fields: Iterable[pa.Field]) -> None:
    """Reads every field name (nested ones too): names that are not UTF-8 raise here."""
    for f in fields:
        _ = f.name
        t = f.type
        _check_names([t.field(i) for i in range(t.num_fields)])


# ----------------------------------------------------------------------------------------------
# null sentinels
# ----------------------------------------------------------------------------------------------

def _int_storage(t: pa.DataType) -> Optional[pa.DataType]:
    """The integer type a temporal type is stored as, None for non-temporal types."""
    if pa.types.is_timestamp(t) or pa.types.is_duration(t) or pa.types.is_date64(t) or pa.types.is_time64(t):
        return pa.int64()
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return pa.int32()
    return None


def sentinel_for(t: pa.DataType) -> Union[int, float, None]:
    """The Deephaven null sentinel stored at a null slot of a column of Arrow wire type `t`, or None."""
    if pa.types.is_int8(t):
        return -(2**7)
    if pa.types.is_int16(t):
        return -(2**15)
    if pa.types.is_int32(t):
        return -(2**31)
    if pa.types.is_int64(t):
        return -(2**63)
    if pa.types.is_uint16(t):
        return 0xFFFF
    if pa.types.is_float32(t):
        return _F32_NULL
    if pa.types.is_float64(t):
        return _F64_NULL
    storage = _int_storage(t)
    if storage is not None:
        return sentinel_for(storage)
    return None


def has_sentinel(t: pa.DataType) -> bool:
    return sentinel_for(t) is not None


def _storage_view(arr: pa.Array) -> pa.Array:
    storage = _int_storage(arr.type)
    return arr if storage is None else arr.view(storage)


def fill_sentinels(arr: pa.Array) -> pa.Array:
    """`arr` with the type's sentinel written into the data buffer at every null slot; the nulls
    (validity) are kept. Types without a sentinel, and arrays without nulls, come back unchanged."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.null_count == 0 or not has_sentinel(arr.type):
        return arr
    storage = _storage_view(arr)
    filled = pc.fill_null(storage, pa.scalar(sentinel_for(storage.type), type=storage.type))
    if filled.offset:
        filled = pa.concat_arrays([filled])  # compacts to offset 0
    validity = pc.is_valid(arr).buffers()[1]
    out = pa.Array.from_buffers(storage.type, len(arr), [validity, filled.buffers()[1]],
                                null_count=arr.null_count)
    return out.view(arr.type) if storage.type != arr.type else out


def empty_array(t: pa.DataType) -> pa.Array:
    """A 0-row array of type `t`, unions included, in lists, maps or unions too (which pyarrow does
    not make from a Python list)."""
    if not _holds_union(t):
        return pa.array([], type=t)
    empty = pa.py_buffer(b"")
    children = [empty_array(t.field(i).type) for i in range(t.num_fields)]
    buffers: list[Optional[pa.Buffer]]
    if pa.types.is_union(t):
        buffers = [None, empty, empty] if t.mode == "dense" else [None, empty]
    elif pa.types.is_list(t) or pa.types.is_map(t):
        buffers = [None, pa.py_buffer(bytes(4))]  # one offset: 0
    elif pa.types.is_list_view(t):
        buffers = [None, empty, empty]
    else:  # fixed-size lists, structs (a map's entries)
        buffers = [None]
    return pa.Array.from_buffers(t, 0, buffers, children=children)


def _holds_union(t: pa.DataType) -> bool:
    return bool(pa.types.is_union(t)) or any(_holds_union(t.field(i).type) for i in range(t.num_fields))


def with_list_values(arr: pa.Array, values: pa.Array) -> pa.Array:
    """`arr`, a list, list_view, map or fixed-size list array, over the child `values` (its type,
    offsets, sizes and validity kept); `arr` itself when `values` is its child."""
    if values is arr.values:
        return arr
    validity = arr.buffers()[0] if arr.null_count else None
    t = arr.type
    buffers = [validity] if pa.types.is_fixed_size_list(t) else [validity, arr.buffers()[1]]
    if pa.types.is_list_view(t):
        buffers.append(arr.buffers()[2])
    return pa.Array.from_buffers(arr.type, len(arr), buffers, null_count=arr.null_count, offset=arr.offset,
                                 children=[values])


def sentinels_to_nulls(arr: pa.Array, dh_type: Optional[str] = None, *,
                       component_type: Optional[str] = None) -> pa.Array:
    """Marks every slot holding the Deephaven null sentinel as null (the `use_deephaven_nulls` reading).

    `dh_type` is the column's `deephaven:type`; without it the sentinel follows from the Arrow
    type. A type without a sentinel (Boolean, String, BigDecimal, unknown classes) is returned
    unchanged; array and vector types are converted in their elements. Existing nulls stay null."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    t = arr.type
    if pa.types.is_list(t):
        comp = _component_of(dh_type, component_type)
        return with_list_values(arr, sentinels_to_nulls(arr.values, comp))
    if dh_type is not None and dh_type not in _DH_SENTINELS:
        return arr
    if not has_sentinel(t) or len(arr) == 0:
        return arr
    storage = _storage_view(arr)
    is_null = pc.equal(storage, pa.scalar(sentinel_for(storage.type), type=storage.type))
    if not pc.any(is_null).as_py():
        return arr
    out = pc.if_else(is_null, pa.scalar(None, type=storage.type), storage)
    return out.view(t) if storage.type != t else out
