"""Hand-built Arrow record batches (tickwire.protocol.batches): layout, round trips, pyarrow
compatibility, golden captures, batch sizing and malformed input."""
from __future__ import annotations

import ast
import decimal
import random
import re
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol.batches import (
    HEADER_RECORD_BATCH,
    HEADER_SCHEMA,
    INITIAL_BATCH_SIZE,
    BatchSizer,
    decode_record_batch,
    encode_batches,
    encode_record_batch,
    read_message_header,
    split_rows,
)
from tickwire.protocol.flight import decode_flight_data
from tickwire.protocol.schema import (
    ipc_encapsulated_schema,
    is_list_wrapper_field,
    list_wrapped_schema,
    read_schema_message,
    sentinels_to_nulls,
    to_deephaven_schema,
    to_wire_array,
)

from .golden import GOLDEN, captures, decoded_records, decoded_sections, read_cap

golden = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")

TS = pa.timestamp("ns", "UTC")
DAY_MS = 86_400_000


def wire_columns(n: int, seed: int = 0, nulls: bool = True) -> dict[str, pa.Array]:
    """One column of every wire type tickwire maps, n rows, every third row null when `nulls`."""
    rng = np.random.default_rng(seed)
    mask = (np.arange(n) % 3 == 1) if nulls else None

    def m(values, t):
        return pa.array(values, type=t, mask=mask)

    def ints(lo, hi):
        return rng.integers(lo, hi, n)

    strs = [f"s{i}-{'é' * (i % 3)}" for i in range(n)]
    decs = [decimal.Decimal(int(v)).scaleb(-3) for v in ints(-10**9, 10**9)]
    return {
        "i8": m(ints(-127, 128), pa.int8()),
        "i16": m(ints(-32767, 32768), pa.int16()),
        "i32": m(ints(-2**31 + 1, 2**31), pa.int32()),
        "i64": m(ints(-2**62, 2**62), pa.int64()),
        "ch": m(ints(0, 0xFFFF), pa.uint16()),
        "f32": m(rng.normal(size=n).astype(np.float32), pa.float32()),
        "f64": m(rng.normal(size=n), pa.float64()),
        "bool": m(rng.integers(0, 2, n).astype(bool), pa.bool_()),
        "str": m(strs, pa.string()),
        "bin": m([s.encode() * 2 for s in strs], pa.binary()),
        "ts": m(ints(0, 2**62), TS),
        "date": pa.array(ints(-10**5, 10**5) * DAY_MS, pa.int64(), mask=mask).view(pa.date64()),
        "time": m(ints(0, DAY_MS * 1_000_000), pa.time64("ns")),
        "dur": m(ints(-2**62, 2**62), pa.duration("ns")),
        "dec": to_wire_array(pa.array(decs, pa.decimal128(18, 3), mask=mask)),
        "li": pa.array([None if nulls and i % 5 == 2 else list(range(i % 4)) for i in range(n)],
                       pa.list_(pa.field("", pa.int32()))),
        "ls": pa.array([None if nulls and i % 4 == 3 else [f"x{j}" if j % 2 else None for j in range(i % 3)]
                        for i in range(n)], pa.list_(pa.field("", pa.string()))),
    }


def ipc_read(schema: pa.Schema, batches) -> pa.Table:
    """Frames Schema + RecordBatch messages as an Arrow IPC stream and reads it with pyarrow."""
    out = [ipc_encapsulated_schema(schema)]
    for enc in batches:
        pad = (8 - len(enc.header) % 8) % 8
        out += [b"\xff\xff\xff\xff", struct.pack("<i", len(enc.header) + pad), enc.header, b"\x00" * pad, enc.body()]
    out.append(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    return pa.ipc.open_stream(pa.py_buffer(b"".join(out))).read_all()


def schema_of(cols: dict[str, pa.Array]) -> pa.Schema:
    return pa.schema([pa.field(k, v.type) for k, v in cols.items()])


def buffers_of(enc) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in b) for b in read_message_header(enc.header).buffers]


def nodes_of(enc) -> list[tuple[int, int]]:
    return [tuple(int(x) for x in b) for b in read_message_header(enc.header).nodes]


# ----------------------------------------------------------------------------------------------
# pyarrow compatibility and round trips
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 7, 64, 65, 200])
def test_plain_pyarrow_reads_full_length_batches(n):
    cols = wire_columns(n, seed=n)
    schema = schema_of(cols)
    enc = encode_record_batch(list(cols.values()), use_deephaven_nulls=False)
    table = ipc_read(schema, [enc])
    assert table.equals(pa.Table.from_arrays(list(cols.values()), schema=schema))
    assert table.num_rows == n


def test_plain_pyarrow_reads_deephaven_null_batches_as_sentinels():
    cols = wire_columns(50, seed=3)
    schema = schema_of(cols)
    enc = encode_record_batch(list(cols.values()), use_deephaven_nulls=True)
    table = ipc_read(schema, [enc])
    assert table.column("i8").null_count == 0 and table.column("i8")[1].as_py() == -128
    assert table.column("ch")[1].as_py() == 0xFFFF
    assert table.column("str").null_count == cols["str"].null_count  # variable width keeps its bitmap
    assert table.column("bool").null_count == cols["bool"].null_count
    for name, arr in cols.items():
        got = sentinels_to_nulls(table.column(name).combine_chunks())
        assert got.equals(arr), name


def test_pyarrow_reads_a_sliced_multi_batch_stream():
    cols = wire_columns(300, seed=9)
    schema = schema_of(cols)
    batches = list(encode_batches(list(cols.values()), batch_size=70))
    assert [b.rows for b in batches] == [70, 70, 70, 70, 20]
    assert ipc_read(schema, batches).equals(pa.Table.from_arrays(list(cols.values()), schema=schema))


@pytest.mark.parametrize("dh_nulls", [False, True])
@pytest.mark.parametrize("as_list", [False, True])
def test_round_trip_every_type_ragged_and_sliced(dh_nulls, as_list):
    full = wire_columns(40, seed=5)
    names = list(full)
    # ragged: column i carries a different slice of its values, one column is not sent at all
    cols = []
    for i, name in enumerate(names):
        if i == 4:
            cols.append(None)
        else:
            cols.append(full[name].slice(i % 5, 35 - 2 * (i % 7)))
    types = [full[n].type for n in names]
    enc = encode_record_batch(cols, types, use_deephaven_nulls=dh_nulls, columns_as_list=as_list)
    info = read_message_header(enc.header)
    assert info.header_type == HEADER_RECORD_BATCH and info.version == 4
    assert info.body_length == enc.body_length == sum(memoryview(p).nbytes for p in enc.body_parts)
    assert info.length == (1 if as_list else max(len(c) for c in cols if c is not None))
    schema = pa.schema([pa.field(n, t) for n, t in zip(names, types)])
    for s in ([schema, list_wrapped_schema(schema)] if as_list else [schema, types]):
        out = decode_record_batch(enc.header, enc.body(), s, columns_as_list=as_list)
        for name, col, got, t in zip(names, cols, out, types):
            expected = pa.array([], t) if col is None else col
            if dh_nulls:
                got = sentinels_to_nulls(got)
            assert got.type == t and got.equals(expected), name


def test_decoded_arrays_reference_the_body():
    cols = wire_columns(20, nulls=False)
    enc = encode_record_batch(list(cols.values()))
    body = pa.py_buffer(enc.body())
    out = decode_record_batch(enc.header, body, schema_of(cols))
    lo, hi = body.address, body.address + body.size
    for arr in out:
        data = arr.buffers()[-1] if not pa.types.is_list(arr.type) else arr.buffers()[1]
        assert lo <= data.address < hi


_values = {
    pa.int8(): st.integers(-127, 127), pa.int16(): st.integers(-32767, 32767),
    pa.int32(): st.integers(-2**31 + 1, 2**31 - 1), pa.int64(): st.integers(-2**63 + 1, 2**63 - 1),
    pa.uint16(): st.integers(0, 0xFFFE), pa.float64(): st.floats(-1e300, 1e300),
    pa.float32(): st.floats(-2.0**100, 2.0**100, width=32), pa.bool_(): st.booleans(), pa.string(): st.text(max_size=8),
    pa.binary(): st.binary(max_size=8), TS: st.integers(-2**63 + 1, 2**63 - 1),
    pa.list_(pa.field("", pa.int32())): st.lists(st.none() | st.integers(-2**31 + 1, 2**31 - 1), max_size=4),
    pa.list_(pa.field("", pa.string())): st.lists(st.none() | st.text(max_size=4), max_size=4),
}
_types = list(_values)


@st.composite
def ragged_columns(draw):
    ncols = draw(st.integers(1, 5))
    cols, types = [], []
    for _ in range(ncols):
        t = draw(st.sampled_from(_types))
        types.append(t)
        if draw(st.integers(0, 5)) == 0:
            cols.append(None)
            continue
        vals = draw(st.lists(st.none() | _values[t], max_size=70))
        arr = pa.array(vals, t)
        start = draw(st.integers(0, len(vals)))
        cols.append(arr.slice(start, draw(st.integers(0, len(vals) - start))))
    return cols, types


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ragged_columns(), st.booleans(), st.booleans())
def test_round_trip_property(data, dh_nulls, as_list):
    cols, types = data
    enc = encode_record_batch(cols, types, use_deephaven_nulls=dh_nulls, columns_as_list=as_list)
    assert all(off % 8 == 0 and ln % 8 == 0 for off, ln in buffers_of(enc))
    out = decode_record_batch(enc.header, enc.body(), types, columns_as_list=as_list)
    for col, got, t in zip(cols, out, types):
        expected = pa.array([], t) if col is None else col
        if dh_nulls:
            got = sentinels_to_nulls(got)
        assert got.equals(expected)
    # and the bytes are those of the same data written from fresh (unsliced) arrays
    fresh = [None if c is None else pa.array(c.to_pylist(), t) for c, t in zip(cols, types)]
    again = encode_record_batch(fresh, types, use_deephaven_nulls=dh_nulls, columns_as_list=as_list)
    assert again.header == enc.header and again.body() == enc.body()


# ----------------------------------------------------------------------------------------------
# exact layout (§5.7, §6.6)
# ----------------------------------------------------------------------------------------------

def test_fixed_width_layout_in_both_null_modes():
    arr = pa.array([1, None, 3], pa.int32())
    plain = encode_record_batch([arr], use_deephaven_nulls=False)
    assert nodes_of(plain) == [(3, 1)]
    assert buffers_of(plain) == [(0, 8), (8, 16)]
    assert plain.body() == b"\x05" + b"\x00" * 7 + struct.pack("<3i", 1, -2**31, 3) + b"\x00" * 4
    dh = encode_record_batch([arr], use_deephaven_nulls=True)
    assert nodes_of(dh) == [(3, 0)]
    assert buffers_of(dh) == [(0, 0), (0, 16)]
    assert dh.body() == struct.pack("<3i", 1, -2**31, 3) + b"\x00" * 4
    no_nulls = encode_record_batch([pa.array([1, 2], pa.int32())])
    assert buffers_of(no_nulls) == [(0, 0), (0, 8)]


def test_validity_is_whole_words_with_clean_tail_bits():
    base = pa.array([None if i % 2 else i for i in range(130)], pa.int64())
    for sl in (base.slice(0, 70), base.slice(3, 70), base.slice(8, 65)):
        enc = encode_record_batch([sl])
        (voff, vlen), _data = buffers_of(enc)
        assert vlen == 16  # ceil(70/64) * 8, ceil(65/64) * 8
        bits = np.unpackbits(np.frombuffer(enc.body()[voff:voff + vlen], np.uint8), bitorder="little")
        assert bits[len(sl):].sum() == 0
        assert bits[:len(sl)].tolist() == [int(v is not None) for v in sl.to_pylist()]


def test_bool_layout_keeps_bitmap_under_deephaven_nulls():
    arr = pa.array([None, False, True, False, True, False, True, False, True, False])
    enc = encode_record_batch([arr], use_deephaven_nulls=True)
    assert nodes_of(enc) == [(10, 1)]
    assert buffers_of(enc) == [(0, 8), (8, 8)]
    body = enc.body()
    assert body[:8] == b"\xfe\x03" + b"\x00" * 6
    assert body[8:16] == b"\x54\x01" + b"\x00" * 6


@pytest.mark.parametrize("n, offsets_len", [(1, 8), (2, 16), (3, 16), (4, 24)])
def test_utf8_offsets_padding(n, offsets_len):
    arr = pa.array(["ab"] * n)
    enc = encode_record_batch([arr])
    assert buffers_of(enc) == [(0, 0), (0, offsets_len), (offsets_len, 8 * ((2 * n + 7) // 8))]
    offs = np.frombuffer(enc.body()[:offsets_len], np.int32)
    assert offs[:n + 1].tolist() == list(range(0, 2 * n + 1, 2)) and not offs[n + 1:].any()


def test_empty_and_unsent_columns():
    for col in (pa.array([], pa.string()), None):
        enc = encode_record_batch([col, pa.array([1.0])], [pa.string(), pa.float64()])
        assert nodes_of(enc) == [(0, 0), (1, 0)]
        assert buffers_of(enc) == [(0, 0), (0, 0), (0, 0), (0, 0), (0, 8)]
    lst = encode_record_batch([None], [pa.list_(pa.string())])
    assert nodes_of(lst) == [(0, 0), (0, 0)] and buffers_of(lst) == [(0, 0)] * 5
    with pytest.raises(ValueError):
        encode_record_batch([None])


def test_string_slice_offsets_are_rebased():
    arr = pa.array(["aaaa", "b", None, "cc", "ddd"]).slice(1, 3)
    enc = encode_record_batch([arr])
    body = enc.body()
    (v, vl), (o, ol), (d, dl) = buffers_of(enc)
    assert np.frombuffer(body[o:o + 16], np.int32).tolist() == [0, 1, 1, 3]
    assert body[d:d + dl] == b"bcc" + b"\x00" * 5
    assert decode_record_batch(enc.header, body, [pa.string()])[0].equals(arr)


def test_list_mode_wrapper_layout():
    cols = [pa.array([1, 2, 3], pa.int8()), pa.array(["x"]), None]
    types = [pa.int8(), pa.string(), pa.int64()]
    enc = encode_record_batch(cols, types, use_deephaven_nulls=True, columns_as_list=True)
    assert read_message_header(enc.header).length == 1
    assert nodes_of(enc) == [(1, 0), (3, 0), (1, 0), (1, 0), (1, 0), (0, 0)]
    bufs = buffers_of(enc)
    assert bufs[0][1] == 0 and bufs[1][1] == 8
    body = enc.body()
    assert np.frombuffer(body[bufs[1][0]:bufs[1][0] + 8], np.int32).tolist() == [0, 3]
    assert np.frombuffer(body[bufs[5][0]:bufs[5][0] + 8], np.int32).tolist() == [0, 1]
    assert np.frombuffer(body[bufs[10][0]:bufs[10][0] + 8], np.int32).tolist() == [0, 0]
    # pyarrow reads the wrapped form as a one-row table of lists
    schema = list_wrapped_schema(pa.schema([pa.field("a", pa.int8()), pa.field("b", pa.string()),
                                            pa.field("c", pa.int64())]))
    table = ipc_read(schema, [enc])
    assert table.to_pylist() == [{"a": [1, 2, 3], "b": ["x"], "c": []}]


def test_unsupported_types_are_rejected():
    # decimal32/64 have no Deephaven column type (Deephaven refuses their upload)
    for t in (pa.decimal32(5, 1), pa.decimal64(12, 1)):
        with pytest.raises(ProtocolError, match="to_wire_array"):
            encode_record_batch([pa.array([decimal.Decimal("1.5")], t)])
    with pytest.raises(ProtocolError):
        encode_record_batch([pa.array([{"a": 1}])])
    with pytest.raises(ProtocolError, match="schema says"):
        encode_record_batch([pa.array([1], pa.int32())], [pa.int64()])


def test_decimals_kept_from_an_upload_are_written_as_they_are():
    """decimal128/256 columns of a DoPut table are served in their own type (docs/types.md)."""
    for t in (pa.decimal128(10, 2), pa.decimal256(50, 5)):
        arr = pa.array([decimal.Decimal("1.25"), None, decimal.Decimal("-7.50")], t)
        enc = encode_record_batch([arr])
        table = ipc_read(pa.schema([pa.field("d", t)]), [enc])
        assert table.column("d").type == t and table.column("d").to_pylist() == arr.to_pylist()


# ----------------------------------------------------------------------------------------------
# batch sizing (§6.7)
# ----------------------------------------------------------------------------------------------

def test_split_rows_follows_deephavens_rules():
    assert split_rows(10_000, bytes_per_row=100) == [4096, 5904]
    assert split_rows(10_000, batch_size=3000, bytes_per_row=100) == [3000, 3000, 3000, 1000]
    # 4096 rows * 100 B >= 100 kB: retried with int(100000 // 100 * 0.9) = 900 rows
    assert split_rows(10_000, max_message_size=100_000, bytes_per_row=100) == [900] * 11 + [100]
    assert split_rows(3, max_message_size=10, bytes_per_row=100) == [1, 1, 1]  # single rows go anyway
    assert split_rows(0, bytes_per_row=10) == []


def test_batch_sizer_always_retries_smaller():
    sizer = BatchSizer(0, 1000)
    assert sizer.next_rows == INITIAL_BATCH_SIZE
    # a tiny per-row cost with a big fixed overhead would otherwise suggest more rows
    assert not sizer.accept(50, 1050)
    assert sizer.next_rows < 50
    assert sizer.accept(1, 10**9)


def test_encode_batches_respects_limits_and_rebuilds_the_data():
    vals = pa.array([("v" * (i % 50)) if i % 7 else None for i in range(20_000)])
    ints = pa.array(np.arange(20_000), pa.int64())
    limit = 64_000
    batches = list(encode_batches([vals, ints], max_message_size=limit, metadata_size=500))
    assert all(b.flight_data_size() < limit for b in batches)
    assert batches[0].flight_data_size(500) < limit
    assert sum(b.rows for b in batches) == 20_000 and len(batches) > 10
    assert max(b.rows for b in batches) < INITIAL_BATCH_SIZE
    parts = [decode_record_batch(b.header, b.body(), [pa.string(), pa.int64()]) for b in batches]
    assert pa.concat_arrays([p[0] for p in parts]).equals(vals)
    assert pa.concat_arrays([p[1] for p in parts]).equals(ints)


def test_encode_batches_ragged_mod_phase():
    a = pa.array([1, 2, 3, 4, 5], pa.int32())
    b = pa.array(["x", "y", "z"])
    batches = list(encode_batches([None, a, b], [pa.float64(), pa.int32(), pa.string()], batch_size=2))
    assert [x.rows for x in batches] == [2, 2, 1]
    assert [nodes_of(x) for x in batches] == [[(0, 0), (2, 0), (2, 0)], [(0, 0), (2, 0), (1, 0)],
                                              [(0, 0), (1, 0), (0, 0)]]
    assert list(encode_batches([None, pa.array([], pa.int32())], [pa.int8(), pa.int32()])) == []


def test_oversized_single_row_is_sent():
    big = pa.array(["x" * 5000])
    batches = list(encode_batches([big], max_message_size=1000))
    assert len(batches) == 1 and batches[0].rows == 1 and batches[0].flight_data_size() >= 1000


def test_encoded_batch_unpacks_and_frames():
    enc = encode_record_batch([pa.array([1, 2], pa.int16())])
    header, parts, length = enc
    assert header == enc.header and length == 8 and b"".join(parts) == enc.body()
    fd = decode_flight_data(enc.flight_data(b"meta"))
    assert fd.data_header == header and fd.app_metadata == b"meta" and bytes(fd.data_body) == enc.body()
    assert len(enc.flight_data(b"meta")) == enc.flight_data_size(4)


# ----------------------------------------------------------------------------------------------
# golden captures
# ----------------------------------------------------------------------------------------------

_HEADER_RE = re.compile(r"data_header: RecordBatch length=(\d+) body_length=(\d+) nodes\(len,nulls\)=\[(.*?)\]"
                        r"(\.\.\.)? buffers=(\d+)")
_COLUMN_RE = re.compile(r"^\s+(\S+): len=(\d+) nulls=(\d+) (\[.*\])(?: \.\.\.)?$", re.M)


def golden_batches():
    """(folder/call, record text, FlightData, wire schema) of every server RecordBatch in DoGet and
    DoExchange captures."""
    out = []
    for path in captures("FlightService_DoGet") + captures("FlightService_DoExchange"):
        call = int(path.name.split("_", 1)[0])
        records = decoded_records(decoded_sections(path.parent)[call])
        schema = None
        for i, rec in enumerate(read_cap(path), 1):
            if rec.direction != "S":
                continue
            fd = decode_flight_data(rec.payload)
            if not fd.data_header:
                continue
            info = read_message_header(fd.data_header)
            if info.header_type == HEADER_SCHEMA:
                schema = read_schema_message(fd.data_header)
            elif info.header_type == HEADER_RECORD_BATCH:
                out.append((f"{path.parent.name}/{path.stem}#{i}", records[i], fd, schema))
    return out


GOLDEN_BATCHES = golden_batches() if GOLDEN.exists() else []


def _as_py(arr: pa.Array) -> list:
    if pa.types.is_temporal(arr.type):
        return arr.view(pa.int64()).to_pylist()
    return arr.to_pylist()


@golden
def test_golden_batch_count():
    assert len(GOLDEN_BATCHES) >= 140
    assert any(is_list_wrapper_field(s[0]) for *_r, s in GOLDEN_BATCHES)


@golden
@pytest.mark.parametrize("item", GOLDEN_BATCHES, ids=[g[0] for g in GOLDEN_BATCHES])
def test_golden_batches_decode_like_decoded_txt(item):
    _name, text, fd, schema = item
    as_list = all(is_list_wrapper_field(f) for f in schema)
    info = read_message_header(fd.data_header)
    m = _HEADER_RE.search(text)
    assert m is not None
    assert info.length == int(m.group(1)) and info.body_length == int(m.group(2))
    listed = ast.literal_eval("[" + m.group(3) + "]")
    assert [tuple(int(x) for x in n) for n in info.nodes[:len(listed)]] == listed
    assert len(info.buffers) == int(m.group(5))
    cols = decode_record_batch(fd.data_header, fd.data_body, schema, columns_as_list=as_list)
    lines = _COLUMN_RE.findall(text)
    assert [ln[0] for ln in lines] == schema.names
    for (name, length, nulls, values), arr in zip(lines, cols):
        shown = ast.literal_eval(values)
        if as_list:
            assert (int(length), int(nulls)) == (1, 0)
            shown = [v for v in shown[0] if v != "..."]
        else:
            assert (int(length), int(nulls)) == (len(arr), arr.null_count)
        assert _as_py(arr.slice(0, len(shown))) == shown, name


@golden
@pytest.mark.parametrize("item", GOLDEN_BATCHES, ids=[g[0] for g in GOLDEN_BATCHES])
def test_golden_batches_reencode_byte_identically(item):
    _name, _text, fd, schema = item
    as_list = all(is_list_wrapper_field(f) for f in schema)
    info = read_message_header(fd.data_header)
    # Deephaven-null mode shows as fixed-width columns without validity but with sentinels; the
    # stream's options say which, and re-encoding in the other mode must differ when there are nulls
    cols = decode_record_batch(fd.data_header, fd.data_body, schema, columns_as_list=as_list)
    types = [f.type.value_type if as_list else f.type for f in schema]
    for dh_nulls in (False, True):
        enc = encode_record_batch(cols, types, use_deephaven_nulls=dh_nulls, columns_as_list=as_list)
        if enc.header == fd.data_header:
            assert enc.body() == bytes(fd.data_body)
            assert np.array_equal(read_message_header(enc.header).buffers, info.buffers)
            return
    pytest.fail("no null mode reproduces the recorded batch")


def _fresh(arr: pa.Array) -> pa.Array:
    """The same values in a new pyarrow-built array (null slots hold pyarrow's zeros, not sentinels)."""
    if pa.types.is_temporal(arr.type):
        return pa.array(arr.view(pa.int64()).to_pylist(), pa.int64()).view(arr.type)
    return pa.array(arr.to_pylist(), arr.type)


@golden
def test_worked_example_barrage_java_0006():
    item = next(g for g in GOLDEN_BATCHES if g[0] == "barrage_java/0006_FlightService_DoExchange#3")
    _n, _t, fd, schema = item
    cols = decode_record_batch(fd.data_header, fd.data_body, schema)
    # the user's view: nulls as Arrow nulls, in fresh arrays
    user = [_fresh(sentinels_to_nulls(c, (f.metadata or {}).get(b"deephaven:type", b"").decode() or None))
            for c, f in zip(cols, schema)]
    assert all(u.null_count == 1 and not u[0].is_valid for u in user)
    enc = encode_record_batch(user, [f.type for f in schema], use_deephaven_nulls=True)
    assert buffers_of(enc) == [
        (0, 0), (0, 16), (16, 0), (16, 24), (40, 0), (40, 40), (80, 0), (80, 80), (160, 0), (160, 40),
        (200, 0), (200, 80), (280, 8), (288, 8), (296, 8), (304, 48), (352, 24), (376, 0), (376, 80),
        (456, 0), (456, 24)]
    assert enc.body_length == 480
    body = enc.body()
    assert body[:2] == b"\x80\xcf" and body[160:164] == b"\xff\xff\x7f\xff" and body[456:458] == b"\xff\xff"
    assert body[280:282] == b"\xfe\x03" and body[288:290] == b"\x54\x01"
    assert body == bytes(fd.data_body)
    assert enc.header == fd.data_header


@golden
def test_flight_doget_batches_reencode_from_fresh_arrays():
    items = [g for g in GOLDEN_BATCHES if g[0].startswith("flight_doget/")]
    assert len(items) >= 5
    for _n, _t, fd, schema in items:
        cols = decode_record_batch(fd.data_header, fd.data_body, schema)
        enc = encode_record_batch([_fresh(c) for c in cols], [f.type for f in schema], use_deephaven_nulls=False)
        assert nodes_of(enc) == [tuple(int(x) for x in n) for n in read_message_header(fd.data_header).nodes]
        assert buffers_of(enc) == [tuple(int(x) for x in b) for b in read_message_header(fd.data_header).buffers]
        assert enc.body() == bytes(fd.data_body)
        assert enc.header == fd.data_header


@golden
def test_golden_static_mixed_from_a_user_table():
    """The DoGet stream of static_mixed rebuilt from a user-typed table (large strings, µs timestamps)."""
    items = [g for g in GOLDEN_BATCHES if g[0].startswith("flight_doget/0001")]
    user_cols = None
    for _n, _t, fd, schema in items:
        cols = decode_record_batch(fd.data_header, fd.data_body, schema)
        user = [c.cast(pa.large_string()) if pa.types.is_string(c.type) else
                (c.cast(pa.timestamp("us")) if pa.types.is_timestamp(c.type) else c) for c in cols]
        wire = [to_wire_array(_fresh(u)) for u in user]
        enc = encode_record_batch(wire, [f.type for f in schema])
        assert enc.body() == bytes(fd.data_body)
        user_cols = user
    assert to_deephaven_schema(pa.schema([pa.field(f.name, u.type) for f, u in zip(schema, user_cols)]),
                               {"IsFlat": True}).equals(schema, check_metadata=True)


# ----------------------------------------------------------------------------------------------
# malformed input
# ----------------------------------------------------------------------------------------------

def test_specific_malformations():
    cols = wire_columns(10)
    schema = schema_of(cols)
    enc = encode_record_batch(list(cols.values()))
    body = enc.body()
    with pytest.raises(ProtocolError, match="body has"):
        decode_record_batch(enc.header, body[:-8], schema)
    with pytest.raises(ProtocolError, match="left over"):
        decode_record_batch(enc.header, body, list(schema)[:-1])
    with pytest.raises(ProtocolError, match="no field node left"):
        decode_record_batch(enc.header, body, list(schema) + [pa.field("extra", pa.int8())])
    with pytest.raises(ProtocolError):
        decode_record_batch(enc.header, body, schema, columns_as_list=True)  # not a list-mode batch
    with pytest.raises(ProtocolError):
        decode_record_batch(enc.header, body, [pa.field("x", pa.struct([("a", pa.int8())]))] + list(schema)[1:])
    with pytest.raises(ProtocolError, match="not a record batch"):
        from tickwire.protocol.schema import schema_message
        decode_record_batch(schema_message(schema), b"", schema)
    bad_utf8 = encode_record_batch([pa.array([b"\xff\xfe"], pa.binary())])
    with pytest.raises(ProtocolError, match="invalid"):
        decode_record_batch(bad_utf8.header, bad_utf8.body(), [pa.string()])
    decreasing = bytearray(encode_record_batch([pa.array(["ab", "c"])]).body())
    decreasing[4:8] = struct.pack("<i", 3)
    decreasing[8:12] = struct.pack("<i", 1)
    with pytest.raises(ProtocolError, match="decreasing"):
        decode_record_batch(encode_record_batch([pa.array(["ab", "c"])]).header, bytes(decreasing), [pa.string()])


def test_fuzzed_headers_and_bodies_raise_only_protocol_error():
    rng = random.Random(11)
    cols = wire_columns(30, seed=2)
    schema = schema_of(cols)
    samples = [encode_record_batch(list(cols.values())),
               encode_record_batch(list(cols.values()), use_deephaven_nulls=True, columns_as_list=True)]
    wrapped = list_wrapped_schema(schema)
    for idx, enc in enumerate(samples):
        header, body = enc.header, enc.body()
        s, as_list = (schema, False) if idx == 0 else (wrapped, True)
        for trial in range(300):
            h, b = bytearray(header), bytearray(body)
            kind = trial % 4
            if kind == 0:
                h = h[: rng.randrange(len(h))]
            elif kind == 1:
                for _ in range(rng.randrange(1, 4)):
                    h[rng.randrange(len(h))] = rng.randrange(256)
            elif kind == 2:
                b = b[: rng.randrange(len(b))]
            else:
                for _ in range(rng.randrange(1, 6)):
                    b[rng.randrange(len(b))] = rng.randrange(256)
            try:
                out = decode_record_batch(bytes(h), bytes(b), s, columns_as_list=as_list)
            except ProtocolError:
                continue
            for arr in out:
                arr.validate()
