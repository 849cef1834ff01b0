"""Spark SQL types -> the Arrow types of tickwire tables (and so of Deephaven's column types).

| Spark | table (Arrow) | Deephaven |
|---|---|---|
| string (any collation), char, varchar | string | java.lang.String |
| byte, short, int, long | int8, int16, int32, int64 | byte, short, int, long |
| float, double | float32, float64 | float, double |
| decimal(p, s) | decimal128(p, s) | java.math.BigDecimal |
| boolean | bool | java.lang.Boolean |
| timestamp | timestamp[us, UTC] | java.time.Instant |
| timestamp_ntz | timestamp[us, UTC] (the wall-clock reading taken as UTC) | java.time.Instant |
| date | date32 | java.time.LocalDate |
| time | time64[ns] | java.time.LocalTime |
| interval day to second | duration[us] | java.time.Duration |
| binary | binary | byte[] |
| array<T> (T any of the above, arrays included) | list<element: T> | T[] |

Strings and binaries keep 32-bit offsets (Deephaven rejects the 64-bit forms); timestamps stay in
microseconds, Spark's own resolution (the wire converts them to Deephaven's nanoseconds, and
nanoseconds would not hold Spark's years before 1677 or after 2262). Every other Spark type
(struct, map, year-month and calendar intervals, variant, null, user-defined and geospatial types)
is refused with an error that names the table and the column.
"""
from __future__ import annotations

from typing import Iterable, Optional

import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol.schema import deephaven_type_for, wire_type_for

__all__ = ["SparkSinkError", "arrow_type_for_spark", "arrow_schema_for_spark", "conform_arrow"]

UTC_US = pa.timestamp("us", "UTC")


class SparkSinkError(ValueError):
    """A Spark batch that a tickwire sink cannot take (unsupported type, changed schema, wrong
    table kind); the message names the table and, where one is at fault, the column."""


class _Unsupported(Exception):
    pass


def _simple(dt) -> str:
    try:
        return dt.simpleString()
    except Exception:  # noqa: BLE001 - a user-defined type without a simple form
        return type(dt).__name__


def arrow_type_for_spark(dt) -> pa.DataType:
    """The table's Arrow type for a Spark DataType; raises `_Unsupported` (caught by callers)."""
    from pyspark.sql import types as T

    if isinstance(dt, T.BooleanType):
        return pa.bool_()
    if isinstance(dt, T.ByteType):
        return pa.int8()
    if isinstance(dt, T.ShortType):
        return pa.int16()
    if isinstance(dt, T.IntegerType):
        return pa.int32()
    if isinstance(dt, T.LongType):
        return pa.int64()
    if isinstance(dt, T.FloatType):
        return pa.float32()
    if isinstance(dt, T.DoubleType):
        return pa.float64()
    if isinstance(dt, T.DecimalType):
        return pa.decimal128(dt.precision, dt.scale)
    if isinstance(dt, (T.StringType, T.CharType, T.VarcharType)):
        return pa.string()
    if isinstance(dt, T.BinaryType):
        return pa.binary()
    if isinstance(dt, T.DateType):
        return pa.date32()
    if isinstance(dt, (T.TimestampType, T.TimestampNTZType)):
        return UTC_US
    if isinstance(dt, T.DayTimeIntervalType):
        return pa.duration("us")
    if hasattr(T, "TimeType") and isinstance(dt, T.TimeType):
        return pa.time64("ns")
    if isinstance(dt, T.ArrayType):
        return pa.list_(pa.field("element", arrow_type_for_spark(dt.elementType), nullable=True))
    raise _Unsupported(_simple(dt))


def arrow_schema_for_spark(spark_schema, table: str, exclude: Iterable[str] = ()) -> pa.Schema:
    """The table schema for a Spark StructType (columns in `exclude` left out); raises
    SparkSinkError naming the table and the first unsupported column."""
    skip = set(exclude)
    names = [f.name for f in spark_schema.fields]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        raise SparkSinkError(f"tickwire sink into table {table!r}: the batch has column {dup!r} more than once")
    fields = []
    for f in spark_schema.fields:
        if f.name in skip:
            continue
        try:
            t = arrow_type_for_spark(f.dataType)
            deephaven_type_for(t)  # both raise for anything Deephaven's clients cannot read
            wire_type_for(t)
        except (_Unsupported, ProtocolError):
            raise SparkSinkError(
                f"tickwire sink into table {table!r}: column {f.name!r} has Spark type {_simple(f.dataType)}, "
                f"which has no Deephaven column type (supported: strings, byte/short/int/long, float/double, "
                f"decimal, boolean, timestamp, timestamp_ntz, date, time, day-time interval, binary, and "
                f"arrays of these)") from None
        fields.append(pa.field(f.name, t, nullable=f.nullable))
    return pa.schema(fields)


def conform_arrow(data: Optional[pa.Table], schema: pa.Schema, table: str,
                  extra: Optional[pa.Schema] = None) -> pa.Table:
    """`data` (Spark's Arrow, None for no rows) with the table's types and one chunk per column;
    the columns of `extra` (e.g. a delete flag) are kept after the table's. Casts only where the
    types differ (timestamps relabelled to UTC, 64-bit offsets narrowed, list fields renamed)."""
    target = pa.schema(list(schema) + (list(extra) if extra is not None else []))
    if data is None:
        return target.empty_table()
    if data.column_names != target.names:
        missing = [n for n in target.names if n not in data.column_names]
        if missing:
            raise SparkSinkError(f"tickwire sink into table {table!r}: the batch has no column {missing[0]!r}")
        data = data.select(target.names)
    if any(a.type != b.type for a, b in zip(data.schema, target)):
        try:
            data = data.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            bad = next(f.name for f, g in zip(data.schema, target) if f.type != g.type)
            raise SparkSinkError(f"tickwire sink into table {table!r}: column {bad!r} cannot be converted to "
                                 f"{target.field(bad).type}: {exc}") from None
    if any(c.num_chunks != 1 for c in data.columns):
        data = data.combine_chunks()
    return data
