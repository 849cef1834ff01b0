"""Deephaven's simpler TableService operations: DropColumns, EmptyTable, TimeTable, Slice, Flatten,
MetaTable, Snapshot, SeekRow and ComputeColumnStatistics, each answered as Deephaven 42.7 answers
it (tests/test_basic_ops_conformance.py compares them with a real server).

The operations with a source table are builders registered with `table_ops.register`, so they are
served alone and as Batch steps like the others; EmptyTable and TimeTable have no source
(`SOURCELESS`, made by `make_sourceless`), SeekRow answers a row position (`seek_row`), and
Flatten of a flat table and DropColumns of no columns answer their source itself (`answers_source`).

- DropColumns: a view without those columns; a column the source lacks is refused.
- Slice: rows by position, `[first, last)`, negative positions counted from the end (see
  `slice_positions`); incremental on a ticking source.
- Flatten: the rows under the keys 0..n-1, incremental, with the shifts that implies.
- MetaTable: one row per column: Name, DataType (the column's Deephaven type, as clients see it),
  ColumnType ("Normal"), IsPartitioning (false).
- Snapshot: a static copy of the source at one cycle boundary.
- SeekRow: the position of the next (or previous) row whose value equals (or, for strings,
  contains; optionally ignoring case) a value, searching from a row and wrapping around; -1 when
  none does. A table sorted on the column (attribute SortedColumns) is searched by bisection, as
  Deephaven does.
- ComputeColumnStatistics: a one-row table whose columns depend on the column's type: numbers get
  COUNT, SIZE, SUM, SUM_ABS, SUM_SQRD (SQRD_SUM when it went floating), MIN, MAX, MIN_ABS,
  MAX_ABS, AVG, AVG_ABS, STD_DEV with Deephaven's arithmetic (sums in long until they overflow,
  then in double chunk by chunk of 2048 rows); instants COUNT, SIZE, MIN, MAX; strings, booleans
  and characters COUNT, SIZE, UNIQUE_VALUES and the most common values with their counts
  (UNIQUE_KEYS, UNIQUE_COUNTS; ties in the order Deephaven's hash map gives them).
"""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tickwire.server.engine import OperationError, Table, TableSpec
from tickwire.server.engine.publishing import TableWire
from tickwire.server.engine.synthetic import empty_table, time_table
from tickwire.server.services.dh_expr import ExpressionError, parse_instant
from tickwire.server.services.rpc import CallError
from tickwire.server.services.table_ops import TableOps, register

__all__ = ["SOURCELESS", "make_sourceless", "answers_source", "seek_row", "column_statistics", "meta_rows",
           "parse_duration_nanos"]

#: Batch op fields of the operations without a source table
SOURCELESS = ("empty_table", "time_table")

_PRIMITIVES = ("byte", "short", "int", "long", "float", "double", "char", "boolean")


# -- helpers ------------------------------------------------------------------------------------------
def _static(ops: TableOps, source: Optional[Table], op: str, data: pa.Table) -> Table:
    """A hidden static table of `data` (inside the engine's `writing()`)."""
    name = ops.name_for(source, op) if source is not None else ops.engine.unique_name(f"__export.{op}")
    if data.num_columns == 0:
        return empty_table(ops.engine, name, data.num_rows)
    table, _ = ops.engine.get_or_create(TableSpec(name, "static", data=data, hidden=True))
    return table


def _wire_types(table: Table) -> list[str]:
    """The Deephaven type of each column, as its clients see it."""
    return [(f.metadata or {}).get(b"deephaven:type", b"java.lang.Object").decode() for f in TableWire(table).schema]


def _java_class(dh_type: str) -> str:
    """`Class.toString()` of a Deephaven column type, as Deephaven's messages print it."""
    return dh_type if dh_type in _PRIMITIVES else f"class {dh_type}"


def _is_flat(table: Table) -> bool:
    if table.attributes.get("IsFlat"):
        return True
    rs = table.rowset
    return not table.is_refreshing and (rs.is_empty() or (rs.is_single_range and rs.first() == 0))


def answers_source(kind: str, req, source: Table) -> bool:
    """True when operation `kind` answers with its source table itself, as Deephaven's does."""
    if kind == "drop_columns":
        return not req.column_names
    if kind == "flatten":
        return _is_flat(source)
    return False


# -- DropColumns, Slice, Flatten, Snapshot, MetaTable ----------------------------------------------------
def _drop_columns(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    names = source.schema.names
    unknown = [c for c in dict.fromkeys(req.column_names) if c not in names]
    if unknown:
        raise CallError(f"DropColumns: unknown column(s) {', '.join(map(repr, unknown))}; the table has "
                        f"{', '.join(names) or 'no columns'}", "INVALID_ARGUMENT")
    drop = set(req.column_names)
    keep = [n for n in names if n not in drop]

    def make() -> Table:
        t = source.view(keep, name=ops.name_for(source, "drop_columns"))
        if source.attributes.get("IsFlat"):
            t.attributes["IsFlat"] = True  # the same row keys
        return t
    return make


def _slice(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    first, last = int(req.first_position_inclusive), int(req.last_position_exclusive)
    if first >= 0 and 0 <= last < first:
        raise CallError("Cannot slice with a non-negative start position that is after a non-negative end position.",
                        "INVALID_ARGUMENT")
    if first < 0 and last < first:
        raise CallError("Cannot slice with a negative start position that is after a negative end position.",
                        "INVALID_ARGUMENT")
    if source.attributes.get("BlinkTable"):
        raise CallError("slice is not supported for blink tables", "INVALID_ARGUMENT")
    return lambda: source._derive("slice", ops.name_for(source, "slice"), first, last)  # noqa: SLF001


def _flatten(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    return lambda: source._derive("flatten", ops.name_for(source, "flatten"))  # noqa: SLF001


def _snapshot(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    def make() -> Table:
        _step, data = ops.engine.snapshot(source)  # at this cycle boundary (make runs inside writing())
        if source.schema.names:
            return _static(ops, source, "snapshot", data)
        return empty_table(ops.engine, ops.name_for(source, "snapshot"), source.size)
    return make


def meta_rows(table: Table) -> pa.Table:
    """Deephaven's meta table of `table`."""
    names = table.schema.names
    return pa.table({"Name": pa.array(names, pa.string()), "DataType": pa.array(_wire_types(table), pa.string()),
                     "ColumnType": pa.array(["Normal"] * len(names), pa.string()),
                     "IsPartitioning": pa.array([False] * len(names), pa.bool_())})


def _meta_table(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    def make() -> Table:
        t = _static(ops, source, "meta_table", meta_rows(source))
        t.attributes.clear()  # Deephaven's meta table has no attributes
        return t
    return make


# -- EmptyTable, TimeTable ---------------------------------------------------------------------------------
_DURATION = re.compile(r"^([-+]?)P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+)(?:\.(\d{0,9}))?S)?)?$", re.I)
_CLOCK_DURATION = re.compile(r"^([-+]?)PT(\d+):(\d{1,2}):(\d{0,2})(?:\.(\d{0,9}))?$", re.I)


def parse_duration_nanos(text: str) -> int:
    """Nanoseconds of an ISO-8601 duration (`PT1S`, `PT0.5S`, `P1DT2H`, `-PT1M`) or of the
    `PTHH:MM:SS.nnn` form Deephaven also reads; ValueError otherwise."""
    s = text.strip()
    m = _CLOCK_DURATION.match(s)
    if m:
        sign, h, mi, sec, frac = m.groups()
        n = ((int(h) * 60 + int(mi)) * 60 + int(sec or 0)) * 10 ** 9 + int((frac or "").ljust(9, "0") or 0)
        return -n if sign == "-" else n
    m = _DURATION.match(s)
    if not m or s.upper() in ("P", "PT", "-P", "+P") or s.upper().endswith("T"):
        raise ValueError(f"cannot parse duration {text!r}")
    sign, d, h, mi, sec, frac = m.groups()
    n = (((int(d or 0) * 24 + int(h or 0)) * 60 + int(mi or 0)) * 60 + int(sec or 0)) * 10 ** 9 \
        + int((frac or "").ljust(9, "0") or 0)
    return -n if sign == "-" else n


def _time_table_args(req) -> tuple[int, Optional[int], bool]:
    if req.WhichOneof("period") == "period_string":
        try:
            period = parse_duration_nanos(req.period_string)
        except ValueError as exc:
            raise CallError(f"TimeTable: {exc}", "INVALID_ARGUMENT") from None
    else:
        period = int(req.period_nanos)
    if period <= 0:
        raise CallError(f"periodNanos must be >= 0 (found: {period})", "FAILED_PRECONDITION")
    start: Optional[int]
    if req.WhichOneof("start_time") == "start_time_string":
        # as Deephaven's DateTimeUtils.parseInstant reads it ('2023-01-01T11:00 ET', ISO, epoch numbers);
        # the one text it reads as null (the minimum long) means "now", as there
        try:
            start = parse_instant(req.start_time_string)
        except ExpressionError as exc:
            raise CallError(f"TimeTable: {exc}", "INVALID_ARGUMENT") from None
    else:  # as Deephaven: zero or negative nanoseconds mean "now"
        start = int(req.start_time_nanos) if req.start_time_nanos > 0 else None
    return period, start, bool(req.blink_table)


def make_sourceless(ops: TableOps, kind: str, req) -> Table:
    """The session-owned table of a source-less operation (EmptyTable, TimeTable)."""
    if kind == "empty_table":
        if req.size < 0:
            raise CallError("Size must be greater than zero", "INVALID_ARGUMENT")

        def make() -> Table:
            return empty_table(ops.engine, ops.engine.unique_name("__export.empty_table"), int(req.size))
    elif kind == "time_table":
        period, start, blink = _time_table_args(req)

        def make() -> Table:
            return time_table(ops.engine, ops.engine.unique_name("__export.time_table"), period, start, blink)
    else:
        raise CallError(f"TableService operation {kind!r} is not supported", "UNIMPLEMENTED")
    try:
        with ops.engine.writing():
            return ops.adopt(make())
    except OperationError as exc:
        raise CallError(f"{kind}: {exc}", exc.code) from None


# -- SeekRow ---------------------------------------------------------------------------------------------
_INTS = {"byte": 8, "short": 16, "int": 32, "long": 64}


def _wrap(v: int, bits: int) -> int:
    m = 1 << bits
    return ((v + (m >> 1)) % m) - (m >> 1)


def _d2i(d: float, bits: int) -> int:
    """Java's double to int (bits 32) or long (bits 64) conversion: saturating, NaN to 0."""
    if math.isnan(d):
        return 0
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if math.isinf(d):
        return hi if d > 0 else lo
    return max(lo, min(hi, int(d)))


def _seek_value(lit, dh_type: str) -> Any:
    """The seek value as Deephaven converts the request's literal for a column of `dh_type`."""
    which = lit.WhichOneof("value")
    if which == "string_value":
        if dh_type not in ("java.lang.String", "char", "java.lang.Character"):
            raise CallError(f"Invalid String type for seek: {_java_class(dh_type)}", "INVALID_ARGUMENT")
        return lit.string_value
    if which == "nano_time_value":
        if dh_type != "java.time.Instant":
            raise CallError(f"Invalid date type for seek: {_java_class(dh_type)}", "INVALID_ARGUMENT")
        return int(lit.nano_time_value)
    if which == "long_value" and dh_type in (*_INTS, "float", "double"):
        v = int(lit.long_value)
        return _wrap(v, _INTS[dh_type]) if dh_type in _INTS else float(np.float32(v) if dh_type == "float" else v)
    if which == "double_value" and dh_type in (*_INTS, "float", "double"):
        d = float(lit.double_value)
        if dh_type in ("byte", "short"):
            return _wrap(_d2i(d, 32), _INTS[dh_type])
        if dh_type in ("int", "long"):
            return _d2i(d, _INTS[dh_type])
        return float(np.float32(d)) if dh_type == "float" else d
    if which == "bool_value":
        return bool(lit.bool_value)
    raise CallError(f"Invalid column type for seek: {_java_class(dh_type)}", "INVALID_ARGUMENT")


def _matches(values: pa.Array, dh_type: str, seek: Any, insensitive: bool, contains: bool) -> np.ndarray:
    """Which rows Deephaven's linear seek accepts (`equals`, or `contains` for strings)."""
    n = len(values)
    valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    if isinstance(seek, str):
        strs = values if dh_type == "java.lang.String" else pc.cast(values, pa.uint32())
        if dh_type != "java.lang.String":  # a char's toString is the character
            strs = pa.array([None if c is None else chr(c) for c in strs.to_pylist()], pa.string())
        want = seek
        if insensitive:
            strs, want = pc.utf8_lower(strs), seek.lower()
        hit = pc.match_substring(strs, want) if contains else pc.equal(strs, want)
        return np.asarray(hit.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    if contains and valid.any():  # Deephaven casts the value to a String: it refuses
        raise CallError(f"SeekRow: contains needs a string column and a string value (column type {dh_type})",
                        "INVALID_ARGUMENT")
    if isinstance(seek, bool):
        if dh_type not in ("java.lang.Boolean", "boolean"):
            return np.zeros(n, dtype=bool)
        vals = np.asarray(values.fill_null(not seek).to_numpy(zero_copy_only=False), dtype=bool)
        return valid & (vals == seek)
    if dh_type == "java.time.Instant":
        vals = values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        return valid & (vals == seek)
    if dh_type in ("float", "double"):  # Double.equals: NaN equals NaN, -0.0 is not 0.0
        ft = np.float32 if dh_type == "float" else np.float64
        it = np.int32 if dh_type == "float" else np.int64
        vals = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=ft)
        bits = np.where(np.isnan(vals), it(-1), vals.view(it))
        sv = np.array([seek], dtype=ft)
        sbits = it(-1) if np.isnan(sv[0]) else sv.view(it)[0]
        return valid & (bits == sbits)
    vals = np.asarray(values.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return valid & (vals == int(seek))


def _sorted_order(table: Table, column: str) -> Optional[str]:
    """"Ascending"/"Descending" when the table's SortedColumns attribute names `column`."""
    attr = table.attributes.get("SortedColumns")
    if not isinstance(attr, str):
        return None
    for part in attr.split(","):
        name, _, order = part.partition("=")
        if name.strip() == column and order.strip() in ("Ascending", "Descending"):
            return order.strip()
    return None


def _bisect_seek(values: list, seek: Any, start: int, backward: bool, ascending: bool, insensitive: bool) -> int:
    """Deephaven's seek on a column the table is sorted on (binary search for an edge occurrence)."""
    def cmp(a, b) -> int:
        if a is b or (a is None and b is None):
            return 0
        if a is None:
            return -1
        if b is None:
            return 1
        if insensitive:
            a, b = str(a).lower(), str(b).lower()
        return (a > b) - (a < b)

    n = len(values)

    def get(i: int):
        return values[i] if 0 <= i < n else None

    def edge(lo: int, hi: int, first: bool) -> int:
        found = -1
        while lo <= hi:
            mid = lo + (hi - lo) // 2
            c = cmp(get(mid), seek)
            if c == 0:
                found = mid
                if first:
                    hi = mid - 1
                else:
                    lo = mid + 1
            elif (c < 0 and ascending) or (c > 0 and not ascending):
                lo = mid + 1
            else:
                hi = mid - 1
        return found

    c = cmp(get(start), seek)
    if backward:
        if c == 0 and start > 0:
            if cmp(get(start - 1), seek) == 0:
                return start - 1
        elif (c > 0 and ascending) or (c < 0 and not ascending):
            return edge(0, start, False)
        return edge(start, n - 1, False)
    if c == 0 and start < n - 1:
        if cmp(get(start + 1), seek) == 0:
            return start + 1
    elif (c < 0 and ascending) or (c > 0 and not ascending):
        return edge(start, n - 1, True)
    return edge(0, start, True)


def seek_row(ops: TableOps, table: Table, req) -> int:
    """Deephaven's SeekRow on `table` (reads it at one cycle boundary; runs off the event loop)."""
    column = req.column_name
    if column not in table.schema.names:
        raise CallError(f"SeekRow: unknown column {column!r}", "INVALID_ARGUMENT")
    dh_type = _wire_types(table)[table.schema.names.index(column)]
    seek = _seek_value(req.seek_value, dh_type)
    start = max(0, int(req.starting_row))
    back = bool(req.is_backward)
    _step, data = ops.engine.snapshot(table, [column])
    values = data.column(0).combine_chunks()
    n = len(values)
    order = _sorted_order(table, column)
    if order is not None:
        return _bisect_seek(values.to_pylist() if dh_type != "java.time.Instant" else
                            values.cast(pa.int64()).to_pylist(), seek, start, back, order == "Ascending",
                            bool(req.insensitive) and isinstance(seek, str))
    hit = _matches(values, dh_type, seek, bool(req.insensitive), bool(req.contains))
    at = _wrap(start, 32)  # Deephaven narrows the starting row to an int
    pos = np.flatnonzero(hit)
    if back:
        first, second = pos[(pos < max(0, at))], pos[pos >= max(0, at)]
        for part in (first, second):
            if part.size:
                return int(part[-1])
    else:
        first, second = pos[pos > at], pos[pos <= at]
        for part in (first, second):
            if part.size:
                return int(part[0])
    del n
    return -1


# -- ComputeColumnStatistics -----------------------------------------------------------------------------
_CHUNK = 2048
_DEFAULT_UNIQUE = 20
_MAX_UNIQUE = 200
_MAX_UNIQUE_TO_COLLECT = 1_000_000
_INT_TYPES = {"byte": pa.int8(), "short": pa.int16(), "int": pa.int32(), "long": pa.int64()}


def _chunk_sums(vals: np.ndarray, valid: np.ndarray, first_row: int = 0) -> float:
    """Deephaven's double sum: each chunk of 2048 rows summed in order from 0.0, the chunk sums
    added in order; only rows from `first_row` on count."""
    x = np.where(valid, vals, 0.0).astype(np.float64)
    x[:first_row] = 0.0
    n = x.size
    if n == 0:
        return 0.0
    pad = (-n) % _CHUNK
    chunks = np.concatenate((x, np.zeros(pad))).reshape(-1, _CHUNK)
    per_chunk = np.cumsum(chunks, axis=1)[:, -1]
    return float(np.cumsum(per_chunk)[-1])


def _first_overflow(terms: np.ndarray, exact_ok: np.ndarray) -> int:
    """Index of the first term whose addition overflows a running long sum (or that is itself
    not exact: `exact_ok` False), or -1."""
    bad = np.flatnonzero(~exact_ok)
    limit = int(bad[0]) if bad.size else terms.size
    run = np.cumsum(terms[:limit])  # wraps at the first overflow
    prev = np.concatenate(([0], run[:-1])) if limit else run
    over = np.flatnonzero(((terms[:limit] > 0) & (run < prev)) | ((terms[:limit] < 0) & (run > prev)))
    if over.size:
        return int(over[0])
    return limit if bad.size else -1


def _long_sum(terms: np.ndarray, exact_ok: np.ndarray, rows: np.ndarray, valid: np.ndarray,
              as_double: np.ndarray) -> tuple[bool, Any]:
    """A running long sum that turns to double at its first overflow, as Deephaven's statistics
    keep it: (went floating, value). `terms` are the non-null values' terms, `rows` their row
    positions, `as_double` every row's term as a double (for the floating part)."""
    i = _first_overflow(terms, exact_ok)
    if i < 0:
        return False, int(np.sum(terms, dtype=np.int64)) if terms.size else 0
    before = int(np.sum(terms[:i], dtype=np.int64)) if i else 0
    row = int(rows[i])
    start_chunk = row - row % _CHUNK
    x = np.where(valid, as_double, 0.0)
    x[:row] = 0.0
    rest = _chunk_sums(x[start_chunk:], np.ones(x.size - start_chunk, dtype=bool))
    return True, float(before) + rest


def _numeric_stats(values: pa.Array, dh_type: str, size: int) -> pa.Table:
    valid = ~np.asarray(values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    rows = np.flatnonzero(valid)
    count = int(rows.size)
    if dh_type in _INT_TYPES:
        typ = _INT_TYPES[dh_type]
        allv = np.asarray(values.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        v = allv[rows]
        absv = np.abs(v)
        ok = np.ones(v.size, dtype=bool)
        floating_sum, s = _long_sum(v, ok, rows, valid, allv.astype(np.float64))
        floating_abs, sa = _long_sum(absv, ok, rows, valid, np.abs(allv).astype(np.float64))
        if dh_type == "long":
            sq_ok = absv <= 3037000499  # Math.multiplyExact(long, long)
        elif dh_type == "int":
            sq_ok = absv <= 46340  # Math.multiplyExact(int, int)
        else:
            sq_ok = np.ones(v.size, dtype=bool)
        sq = np.where(sq_ok, v * np.where(sq_ok, v, 0), 0)
        dbl = allv.astype(np.float64)
        floating_sq, ss = _long_sum(sq, sq_ok, rows, valid, dbl * dbl)
        abs_before = sa
        if floating_abs:  # Deephaven's AVG_ABS reads the long sum, which stopped at the overflow
            i = _first_overflow(absv, ok)
            abs_before = int(np.sum(absv[:i], dtype=np.int64))
        mn = int(v.min()) if count else None
        mx = int(v.max()) if count else None
        amn = int(absv.min()) if count else None
        amx = int(absv.max()) if count else None
        fs, fss = float(s), float(ss)
        cols = {
            "COUNT": pa.array([count], pa.int64()), "SIZE": pa.array([size], pa.int64()),
            "SUM": pa.array([s], pa.float64() if floating_sum else pa.int64()),
            "SUM_ABS": pa.array([sa], pa.float64() if floating_abs else pa.int64()),
            ("SQRD_SUM" if floating_sq else "SUM_SQRD"): pa.array([ss], pa.float64() if floating_sq else pa.int64()),
            "MIN": pa.array([mn], typ), "MAX": pa.array([mx], typ),
            "MIN_ABS": pa.array([amn], typ), "MAX_ABS": pa.array([amx], typ),
            "AVG": pa.array([fs / count if count else None], pa.float64()),
            "AVG_ABS": pa.array([float(abs_before) / count if count else None], pa.float64()),
            "STD_DEV": pa.array([_std(count, fs, fss)], pa.float64()),
        }
        return pa.table(cols)
    typ = pa.float32() if dh_type == "float" else pa.float64()
    allv = np.asarray(values.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False), dtype=np.float64)
    s = _chunk_sums(allv, valid)
    sa = _chunk_sums(np.abs(allv), valid)
    ss = _chunk_sums(allv * allv, valid)
    v = allv[rows]

    def edge(x: np.ndarray, smallest: bool) -> Optional[float]:
        """The first value, then replaced only by a strictly smaller (larger) one: NaN first
        stays; otherwise NaN never wins, and of equal values (0.0, -0.0) the first stays."""
        if x.size == 0:
            return None
        if np.isnan(x[0]):
            return math.nan
        finite = x[~np.isnan(x)]
        m = finite.min() if smallest else finite.max()
        return float(x[np.flatnonzero(x == m)[0]])

    cols = {
        "COUNT": pa.array([count], pa.int64()), "SIZE": pa.array([size], pa.int64()),
        "SUM": pa.array([s], pa.float64()), "SUM_ABS": pa.array([sa], pa.float64()),
        "SUM_SQRD": pa.array([ss], pa.float64()),
        "MIN": pa.array([edge(v, True)], typ), "MAX": pa.array([edge(v, False)], typ),
        "MIN_ABS": pa.array([edge(np.abs(v), True)], typ), "MAX_ABS": pa.array([edge(np.abs(v), False)], typ),
        "AVG": pa.array([s / count if count else None], pa.float64()),
        "AVG_ABS": pa.array([sa / count if count else None], pa.float64()),
        "STD_DEV": pa.array([_std(count, s, ss)], pa.float64()),
    }
    return pa.table(cols)


def _std(count: int, s: float, ss: float) -> Optional[float]:
    if count <= 1:
        return None
    with np.errstate(all="ignore"):
        return float(np.sqrt(np.float64((ss - s * s / count) / (count - 1))))


def _java_string_hashes(strings: list[str]) -> np.ndarray:
    """`String.hashCode()` of each string (over its UTF-16 code units), as uint32."""
    out = np.zeros(len(strings), dtype=np.uint32)
    if not strings:
        return out
    units = [np.frombuffer(s.encode("utf-16-le"), dtype=np.uint16).astype(np.uint32) for s in strings]
    longest = max((u.size for u in units), default=0)
    pow31 = np.ones(max(longest, 1), dtype=np.uint32)
    with np.errstate(over="ignore"):  # Java's String.hashCode wraps around 32 bits
        for i in range(1, longest):
            pow31[i] = pow31[i - 1] * np.uint32(31)
        for i, u in enumerate(units):
            if u.size:
                out[i] = np.sum(u * pow31[:u.size][::-1], dtype=np.uint32)
    return out


def _mix(h: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = h.astype(np.uint32) * np.uint32(0x9E3779B9)
    return x ^ (x >> np.uint32(16))


def _hash_order(hashes: np.ndarray) -> np.ndarray:
    """The order (indices into `hashes`, given in insertion order) in which Deephaven's open hash
    map (fastutil, load factor 0.75, 16 expected entries) iterates its keys: from the highest slot
    down, after linear probing and the rehashes of its growth."""
    mixed = _mix(hashes).astype(np.int64).tolist()

    def size_for(expected: int) -> int:
        return max(2, 1 << max(0, math.ceil(expected / 0.75) - 1).bit_length())

    n = size_for(16)
    slots: list[int] = [-1] * n
    max_fill = min(math.ceil(n * 0.75), n - 1)
    size = 0
    for idx, h in enumerate(mixed):
        mask = n - 1
        pos = h & mask
        while slots[pos] != -1:
            pos = (pos + 1) & mask
        slots[pos] = idx
        size += 1
        if size - 1 >= max_fill:
            new_n = size_for(size + 1)
            new_slots = [-1] * new_n
            new_mask = new_n - 1
            for old in range(n - 1, -1, -1):
                k = slots[old]
                if k == -1:
                    continue
                p = mixed[k] & new_mask
                while new_slots[p] != -1:
                    p = (p + 1) & new_mask
                new_slots[p] = k
            n, slots = new_n, new_slots
            max_fill = min(math.ceil(n * 0.75), n - 1)
    return np.array([k for k in reversed(slots) if k != -1], dtype=np.int64)


def _object_stats(values: pa.Array, dh_type: str, size: int, limit: int) -> pa.Table:
    valid = values.drop_null()
    count = len(valid)
    if dh_type in ("java.lang.Boolean", "boolean"):
        keys_arr = pc.if_else(valid, "true", "false") if count else pa.array([], pa.string())
    elif dh_type in ("char", "java.lang.Character"):
        keys_arr = pa.array([chr(c) for c in valid.cast(pa.uint32()).to_pylist()], pa.string())
    else:
        keys_arr = valid.cast(pa.string())
    enc = keys_arr.dictionary_encode() if count else None
    uniques: list[str] = enc.dictionary.to_pylist() if enc is not None else []
    counts = np.bincount(np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64),
                         minlength=len(uniques)) if enc is not None else np.zeros(0, dtype=np.int64)
    if len(uniques) > _MAX_UNIQUE_TO_COLLECT:
        return pa.table({"COUNT": pa.array([count], pa.int64()), "SIZE": pa.array([size], pa.int64()),
                         "UNIQUE_VALUES": pa.array([len(uniques)], pa.int32())})
    if dh_type in ("java.lang.Boolean", "boolean"):
        hashes = np.array([1231 if u == "true" else 1237 for u in uniques], dtype=np.uint32)
    elif dh_type in ("char", "java.lang.Character"):
        hashes = np.array([ord(u) for u in uniques], dtype=np.uint32)
    else:
        hashes = _java_string_hashes(uniques)
    order = _hash_order(hashes)
    order = order[np.argsort(-counts[order], kind="stable")]
    shown = order[:max(0, limit)]
    return pa.table({
        "COUNT": pa.array([count], pa.int64()), "SIZE": pa.array([size], pa.int64()),
        "UNIQUE_VALUES": pa.array([len(uniques)], pa.int32()),
        "UNIQUE_KEYS": pa.array([[uniques[i] for i in shown]], pa.list_(pa.string())),
        "UNIQUE_COUNTS": pa.array([counts[shown].tolist()], pa.list_(pa.int64())),
    })


def column_statistics(table: Table, data: pa.Table, column: str, dh_type: str, limit: Optional[int]) -> pa.Table:
    """Deephaven's column statistics of `column` (values `data`, read at one cycle boundary)."""
    values = data.column(column).combine_chunks()
    size = len(values)
    if dh_type in _INT_TYPES or dh_type in ("float", "double"):
        return _numeric_stats(values, dh_type, size)
    if dh_type == "java.time.Instant":
        ns = values.cast(pa.int64())
        mn, mx = pc.min(ns).as_py(), pc.max(ns).as_py()
        return pa.table({"COUNT": pa.array([size - values.null_count], pa.int64()),
                         "SIZE": pa.array([size], pa.int64()),
                         "MIN": pa.array([mn], pa.int64()).cast(pa.timestamp("ns", "UTC")),
                         "MAX": pa.array([mx], pa.int64()).cast(pa.timestamp("ns", "UTC"))})
    if dh_type in ("java.lang.String", "java.lang.Boolean", "boolean", "char", "java.lang.Character"):
        if limit is not None and limit < 0:
            raise CallError(f"ComputeColumnStatistics: unique_value_limit must be >= 0, got {limit}",
                            "INVALID_ARGUMENT")
        shown = _DEFAULT_UNIQUE if limit is None else min(limit, _MAX_UNIQUE)
        return _object_stats(values, dh_type, size, shown)
    raise CallError(f"ComputeColumnStatistics: statistics of {dh_type} columns are not supported "
                    f"(numbers, instants, strings, booleans and characters are)", "UNIMPLEMENTED")


def _column_statistics(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    column = req.column_name
    if column not in source.schema.names:
        raise CallError("Table doesn't have a column with the specified name", "INVALID_ARGUMENT")
    dh_type = _wire_types(source)[source.schema.names.index(column)]
    limit = int(req.unique_value_limit) if req.HasField("unique_value_limit") else None

    def make() -> Table:
        _step, data = ops.engine.snapshot(source, [column])
        t = _static(ops, source, "column_statistics", column_statistics(source, data, column, dh_type, limit))
        t.attributes.clear()
        return t
    return make


register("DropColumns", "drop_columns", _drop_columns)
register("Slice", "slice", _slice)
register("Flatten", "flatten", _flatten)
register("Snapshot", "snapshot", _snapshot)
register("MetaTable", "meta_table", _meta_table)
register("ComputeColumnStatistics", "column_statistics", _column_statistics)


def _no_source(ops: TableOps, req, source: Table) -> Callable[[], Table]:
    raise CallError("a source-less operation is made by make_sourceless", "INTERNAL")


# the source-less ones are made by table_service through make_sourceless (their requests have no source)
register("EmptyTable", "empty_table", _no_source)
register("TimeTable", "time_table", _no_source)
