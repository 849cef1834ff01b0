"""Record batches, types and nulls, schemas, and logical updates split into batches."""
from __future__ import annotations

import datetime
import decimal
import struct

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.batches import decode_record_batch, encode_batches, encode_record_batch, read_message_header
from tickwire.protocol.flight import decode_flight_data
from tickwire.protocol.schema import (
    deephaven_type_for,
    fill_sentinels,
    from_wire_array,
    ipc_encapsulated_schema,
    list_wrapped_schema,
    read_schema_message,
    schema_message,
    sentinels_to_nulls,
    to_deephaven_schema,
    to_wire_array,
)
from tickwire.protocol.update import StreamDecoder, encode_schema, encode_update


def sample_table(n: int = 7) -> pa.Table:
    rng = np.random.default_rng(n)
    mask = np.arange(n) % 3 == 0
    def m(values, t):
        return pa.array(values, type=t, mask=mask)
    return pa.table({
        "i8": m(rng.integers(-100, 100, n), pa.int8()),
        "i16": m(rng.integers(-1000, 1000, n), pa.int16()),
        "i32": m(rng.integers(-10**6, 10**6, n), pa.int32()),
        "i64": m(rng.integers(-10**12, 10**12, n), pa.int64()),
        "ch": m(rng.integers(65, 90, n), pa.uint16()),
        "f32": m(rng.random(n), pa.float32()),
        "f64": m(rng.random(n), pa.float64()),
        "b": m(rng.random(n) > 0.5, pa.bool_()),
        "s": m([f"s{i}" * (i % 4) for i in range(n)], pa.string()),
        "bin": m([bytes([i % 256]) * (i % 3) for i in range(n)], pa.binary()),
        "ts": m(rng.integers(0, 2**60, n), pa.timestamp("ns", "UTC")),
        "d": m(rng.integers(0, 40_000, n) * 86_400_000, pa.date64()),
        "t": m(rng.integers(0, 86_400 * 10**9, n), pa.time64("ns")),
        "dur": m(rng.integers(0, 2**50, n), pa.duration("ns")),
        "li": pa.array([None if i % 4 == 1 else list(range(i % 5)) for i in range(n)], pa.list_(pa.int32())),
        "ls": pa.array([None if i % 4 == 2 else [f"x{j}" for j in range(i % 3)] for i in range(n)],
                       pa.list_(pa.string())),
    })


def columns(t: pa.Table) -> list[pa.Array]:
    return [c.combine_chunks() for c in t.columns]


def body(enc) -> bytes:
    return b"".join(bytes(p) for p in enc.body_parts)


def ipc_stream(schema: pa.Schema, encs) -> bytes:
    def frame(h):
        pad = (8 - len(h) % 8) % 8
        return b"\xff\xff\xff\xff" + struct.pack("<i", len(h) + pad) + h + b"\x00" * pad
    out = ipc_encapsulated_schema(schema)
    for e in encs:
        out += frame(e.header) + body(e)
    return out + b"\xff\xff\xff\xff\x00\x00\x00\x00"


@pytest.mark.parametrize("sliced", [False, True])
def test_full_batch_is_readable_by_plain_pyarrow_ipc(sliced):
    t = sample_table(40)
    if sliced:
        t = t.slice(3, 29)
    enc = encode_record_batch(columns(t), [f.type for f in t.schema])
    got = ipc.open_stream(ipc_stream(t.schema, [enc])).read_all()
    assert got.equals(t)


@pytest.mark.parametrize("dh_nulls", [False, True])
@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("n", [0, 1, 7, 130])
def test_round_trip_every_type(dh_nulls, as_list, n):
    t = sample_table(n)
    enc = encode_record_batch(columns(t), [f.type for f in t.schema], use_deephaven_nulls=dh_nulls,
                              columns_as_list=as_list)
    info = read_message_header(enc.header)
    assert info.length == (1 if as_list else n)
    assert all(off % 8 == 0 and ln % 8 == 0 for off, ln in info.buffers.tolist())
    out = decode_record_batch(info, body(enc), list(t.schema), columns_as_list=as_list)
    if dh_nulls:
        out = [sentinels_to_nulls(a) for a in out]
    assert pa.Table.from_arrays(out, schema=t.schema).equals(t)


def test_deephaven_nulls_layout():
    arr = pa.array([None, 1, 2], pa.int32())
    enc = encode_record_batch([arr], [pa.int32()], use_deephaven_nulls=True)
    info = read_message_header(enc.header)
    assert info.nodes.tolist() == [[3, 0]]  # null_count 0, no validity buffer
    assert info.buffers.tolist() == [[0, 0], [0, 16]]
    assert body(enc)[:4] == b"\x00\x00\x00\x80"  # the sentinel sits in the data buffer
    enc = encode_record_batch([arr], [pa.int32()], use_deephaven_nulls=False)
    info = read_message_header(enc.header)
    assert info.nodes.tolist() == [[3, 1]] and info.buffers.tolist() == [[0, 8], [8, 16]]
    assert body(enc)[8:12] == b"\x00\x00\x00\x80"  # sentinel even with a validity bitmap (as Deephaven writes)
    # strings keep a validity bitmap in both modes; an empty string column has an empty offsets buffer
    enc = encode_record_batch([pa.array([], pa.string())], [pa.string()], use_deephaven_nulls=True)
    assert read_message_header(enc.header).buffers.tolist() == [[0, 0], [0, 0], [0, 0]]


def test_sentinels():
    assert fill_sentinels(pa.array([None, 5], pa.uint16())).buffers()[1].to_pybytes()[:2] == b"\xff\xff"
    f = fill_sentinels(pa.array([None, 1.0], pa.float32()))
    assert np.frombuffer(f.buffers()[1], np.float32)[0] == -np.finfo(np.float32).max
    ts = pa.array([None, 5], pa.timestamp("ns", "UTC"))
    assert sentinels_to_nulls(fill_sentinels(ts).fill_null(pa.scalar(-(2**63), pa.timestamp("ns", "UTC")))).equals(ts)


def test_ragged_mod_batch_and_unsent_columns():
    types = [pa.int64(), pa.string(), pa.float64()]
    enc = encode_record_batch([None, pa.array(["a", "b", "c"]), pa.array([1.0])], types)
    info = read_message_header(enc.header)
    assert info.length == 3
    assert info.nodes.tolist() == [[0, 0], [3, 0], [1, 0]]
    out = decode_record_batch(info, body(enc), [pa.field("a", t) for t in types])
    assert [len(a) for a in out] == [0, 3, 1]


# ----------------------------------------------------------------------------------------------
# logical updates
# ----------------------------------------------------------------------------------------------

def _update_round_trip(t, mods, *, as_list, dh, batch_size=0, max_message_size=0):
    schema = t.schema
    n = t.num_rows
    md = barrage.UpdateMetadata(first_seq=1, last_seq=2, added_rows=np.array([[0, n - 1]]) if n else
                                np.zeros((0, 2), np.int64), removed_rows=np.zeros((0, 2), np.int64),
                                shift_data=(np.zeros(0, np.int64),) * 3,
                                mod_column_nodes=[np.array([[100, 100 + len(m) - 1]]) if m is not None and len(m)
                                                  else np.zeros((0, 2), np.int64) for m in mods],
                                table_size=n)
    payloads = [encode_schema(schema, columns_as_list=as_list)] + encode_update(
        barrage.wrap(md), [f.type for f in schema], columns(t), mods, use_deephaven_nulls=dh,
        columns_as_list=as_list, batch_size=batch_size, max_message_size=max_message_size)
    dec = StreamDecoder(columns_as_list=as_list, use_deephaven_nulls=dh)
    ups = [u for u in (dec.feed(p) for p in payloads) if u]
    assert len(ups) == 1 and not dec.in_message
    return payloads, ups[0], dec


@pytest.mark.parametrize("as_list", [False, True])
@pytest.mark.parametrize("dh", [False, True])
def test_update_round_trip_with_ragged_mods(as_list, dh):
    t = sample_table(50)
    mods = [None] * t.num_columns
    mods[1] = t.column(1).combine_chunks().slice(0, 9)
    mods[8] = t.column(8).combine_chunks().slice(5, 30)
    payloads, up, dec = _update_round_trip(t, mods, as_list=as_list, dh=dh, batch_size=7)
    assert dec.schema == t.schema
    assert pa.Table.from_arrays(up.added, schema=t.schema).equals(t)
    assert up.modified[1].equals(mods[1]) and up.modified[8].equals(mods[8])
    assert all(len(up.modified[c]) == 0 for c in range(t.num_columns) if c not in (1, 8))
    # 50 add rows in batches of at most 7, then 30 mod rows in batches of at most 7
    assert len(payloads) == 1 + 8 + 5
    metas = [decode_flight_data(p).app_metadata for p in payloads[1:]]
    assert metas[0] is not None and all(m is None for m in metas[1:])


def test_empty_update_is_one_empty_batch():
    t = sample_table(0)
    payloads, up, _ = _update_round_trip(t, [None] * t.num_columns, as_list=False, dh=True)
    assert len(payloads) == 2
    fd = decode_flight_data(payloads[1])
    info = read_message_header(fd.data_header)
    assert info.length == 0 and fd.app_metadata is not None and fd.data_body is not None
    payloads, _, _ = _update_round_trip(t, [None] * t.num_columns, as_list=True, dh=True)
    assert read_message_header(decode_flight_data(payloads[1]).data_header).length == 1


def test_max_message_size_splits_batches():
    n = 20_000
    t = pa.table({"x": pa.array(np.arange(n, dtype=np.int64)), "s": pa.array(["y" * 40] * n)})
    limit = 64 * 1024
    payloads, up, _ = _update_round_trip(t, [None, None], as_list=False, dh=False, max_message_size=limit)
    assert pa.Table.from_arrays(up.added, schema=t.schema).equals(t)
    assert all(len(p) < limit for p in payloads)
    sizes = [read_message_header(decode_flight_data(p).data_header).length for p in payloads[1:]]
    assert sizes[0] <= 4096 and sum(sizes) == n and len(sizes) > 10


def test_single_row_over_the_limit_is_sent_anyway():
    t = pa.table({"s": pa.array(["z" * 10_000, "z"])})
    batches = list(encode_batches(columns(t), [pa.string()], max_message_size=1000))
    assert [b.rows for b in batches] == [1, 1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 120), st.integers(0, 40), st.integers(1, 50), st.booleans(), st.booleans())
def test_update_round_trip_property(n_add, n_mod, batch, as_list, dh):
    t = sample_table(max(n_add, n_mod)).slice(0, n_add)
    full = sample_table(max(n_add, n_mod) + 1)
    mods = [full.column(c).combine_chunks().slice(0, n_mod) if c % 2 else None for c in range(full.num_columns)]
    _p, up, _ = _update_round_trip(t, mods, as_list=as_list, dh=dh, batch_size=batch)
    assert pa.Table.from_arrays(up.added, schema=t.schema).equals(t)
    for c, m in enumerate(mods):
        assert up.modified[c].equals(m if m is not None else pa.array([], full.schema.field(c).type))


def test_stream_decoder_rejects_interleaved_metadata():
    t = sample_table(10)
    md = barrage.wrap(barrage.UpdateMetadata(added_rows=np.array([[0, 9]])))
    payloads = encode_update(md, [f.type for f in t.schema], columns(t), None, batch_size=4)
    dec = StreamDecoder()
    dec.feed(encode_schema(t.schema))
    dec.feed(payloads[0])
    with pytest.raises(ProtocolError, match="previous message was complete"):
        dec.feed(payloads[0])


@settings(max_examples=800, deadline=None)
@given(st.data())
def test_fuzz_record_batches_only_protocol_error(data):
    t = sample_table(12)
    enc = encode_record_batch(columns(t), [f.type for f in t.schema])
    header, b = bytearray(enc.header), bytearray(body(enc))
    target = data.draw(st.sampled_from(["header", "body"]))
    buf = header if target == "header" else b
    for _ in range(data.draw(st.integers(1, 3))):
        if data.draw(st.booleans()) and buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] = data.draw(st.integers(0, 255))
        else:
            del buf[data.draw(st.integers(0, len(buf))):]
    try:
        info = read_message_header(bytes(header))
        decode_record_batch(info, bytes(b), list(t.schema))
    except ProtocolError:
        pass


# ----------------------------------------------------------------------------------------------
# schema and types
# ----------------------------------------------------------------------------------------------

def test_deephaven_schema_metadata_and_wire_types():
    src = pa.schema([
        ("sym", pa.large_string()), ("px", pa.float64()), ("ts", pa.timestamp("us", "America/New_York")),
        ("day", pa.date32()), ("amt", pa.decimal128(12, 3)), ("tags", pa.list_(pa.string())), ("c", pa.uint16()),
    ])
    s = to_deephaven_schema(src, {"AppendOnly": True, "SortedColumns": "px=Ascending"})
    types = {f.name: f.metadata[b"deephaven:type"].decode() for f in s}
    assert types == {"sym": "java.lang.String", "px": "double", "ts": "java.time.ZonedDateTime",
                     "day": "java.time.LocalDate", "amt": "java.math.BigDecimal", "tags": "java.lang.String[]",
                     "c": "char"}
    assert s.field("ts").type == pa.timestamp("ns", "UTC")
    assert s.field("day").type == pa.date64() and s.field("amt").type == pa.binary()
    assert s.field("tags").metadata[b"deephaven:componentType"] == b"java.lang.String"
    assert b"deephaven:isSortable" not in s.field("tags").metadata
    assert s.field("px").metadata[b"deephaven:isSortable"] == b"true"
    assert s.metadata[b"deephaven:attribute.AppendOnly"] == b"true"
    assert s.metadata[b"deephaven:attribute_type.AppendOnly"] == b"java.lang.Boolean"
    assert all(f.nullable for f in s)
    wrapped = list_wrapped_schema(s)
    assert not wrapped.field("px").nullable and wrapped.field("px").type.value_type == pa.float64()
    assert read_schema_message(schema_message(s)) == s
    assert read_schema_message(ipc_encapsulated_schema(s)) == s
    assert ipc_encapsulated_schema(s)[:4] == b"\xff\xff\xff\xff" and len(ipc_encapsulated_schema(s)) % 8 == 0


def test_wire_value_conversions():
    ts = pa.array([datetime.datetime(2024, 1, 2, 3, 4, 5, 6)], pa.timestamp("us", "Asia/Tokyo"))
    w = to_wire_array(ts)
    assert w.type == pa.timestamp("ns", "UTC")
    assert w.view(pa.int64())[0].as_py() == ts.view(pa.int64())[0].as_py() * 1000
    d = to_wire_array(pa.array([datetime.date(1970, 1, 2)], pa.date32()))
    assert d.type == pa.date64() and d.view(pa.int64())[0].as_py() == 86_400_000
    dec = pa.array([decimal.Decimal("1.2300"), None, decimal.Decimal("-5"), decimal.Decimal("128")],
                   pa.decimal128(10, 4))
    b = to_wire_array(dec)
    # int32 LE scale after stripping trailing zeros, then big-endian two's complement unscaled
    assert b[0].as_py() == struct.pack("<i", 2) + (123).to_bytes(1, "big")
    assert b[2].as_py() == struct.pack("<i", 0) + (-5).to_bytes(1, "big", signed=True)
    assert b[3].as_py() == struct.pack("<i", 0) + b"\x00\x80"
    back = from_wire_array(b, "java.math.BigDecimal").to_pylist()
    assert back[1] is None and [back[0], back[2], back[3]] == [decimal.Decimal("1.23"), -5, 128]
    assert deephaven_type_for(pa.timestamp("ns")) == "java.time.Instant"


def test_malformed_schema_message():
    with pytest.raises(ProtocolError, match="Schema"):
        read_schema_message(b"\x01\x02\x03\x04")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.none() | st.decimals(min_value=-10**13, max_value=10**13, places=4, allow_nan=False),
                max_size=30), st.integers(0, 3))
def test_decimal_wire_encoding_matches_a_per_value_reference(values, cut):
    from tickwire.protocol.schema import decimal_to_deephaven_binary

    def reference(v):
        if v is None:
            return None
        sign, digits, exp = v.normalize().as_tuple()
        unscaled = int("".join(map(str, digits))) * (-1 if sign else 1)
        scale = -exp
        if unscaled == 0:
            scale = 0
        nbytes = max(1, (unscaled + (unscaled < 0)).bit_length() // 8 + 1)
        return struct.pack("<i", scale) + unscaled.to_bytes(nbytes, "big", signed=True)

    arr = pa.array(values, pa.decimal128(18, 4)).slice(min(cut, len(values)))
    assert decimal_to_deephaven_binary(arr).to_pylist() == [reference(v) for v in arr.to_pylist()]
