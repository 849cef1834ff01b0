"""Every Flight/Barrage stream recorded from the real Deephaven server decodes, and matches decoded.txt."""
from __future__ import annotations

import ast
import re

import numpy as np
import pyarrow as pa
import pytest

from tickwire.protocol import barrage
from tickwire.protocol.batches import (
    HEADER_RECORD_BATCH,
    HEADER_SCHEMA,
    decode_record_batch,
    encode_record_batch,
    read_message_header,
)
from tickwire.protocol.flight import decode_flight_data, encode_flight_data
from tickwire.protocol.rowset import encode_rowset, encode_shifts, rowset_size
from tickwire.protocol.schema import read_schema_message, unwrap_list_schema
from tickwire.protocol.update import StreamDecoder

from .golden import GOLDEN, decoded_records, decoded_sections, flight_streams

pytestmark = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")

STREAMS = flight_streams() if GOLDEN.exists() else []
IDS = [f"{p.parent.name}/{p.stem}" for p, *_ in STREAMS]


def _call_number(path) -> int:
    return int(path.name.split("_", 1)[0])


def _mode(options):
    lst = bool(options is not None and getattr(options, "columns_as_list", False))
    dh = bool(options is not None and options.use_deephaven_nulls)
    return lst, dh


def test_all_golden_folders_are_covered():
    folders = {p.parent.name for p, *_ in STREAMS}
    assert {"barrage_java", "flight_doget", "pydeephaven", "ticking_append", "ticking_keyed", "ticking_sorted",
            "ticking_blink", "ticking_static_mixed", "flight_doget_big_static"} <= folders


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_metadata_reencodes_byte_identically(stream):
    path, _options, client_md, server = stream
    seen = 0
    for md in client_md + [decode_flight_data(r.payload).app_metadata for r in server]:
        if md is None:
            continue
        kind, obj = barrage.unwrap(md)
        assert barrage.BarrageMessageWrapper(msg_type=kind, payload=obj.to_bytes()).to_bytes() == md
        assert barrage.wrap(obj) == md
        seen += 1
    if server and "discovery" not in str(path):
        assert seen > 0


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_record_batches_reencode_identically(stream):
    path, options, _md, server = stream
    lst, dh = _mode(options)
    schema = None
    batches = 0
    for r in server:
        fd = decode_flight_data(r.payload)
        info = read_message_header(fd.data_header)
        if info.header_type == HEADER_SCHEMA:
            wire = read_schema_message(fd.data_header)
            schema = unwrap_list_schema(wire) if lst else wire
            assert fd.app_metadata is None and fd.data_body is None  # schema messages carry only the header
            continue
        assert info.header_type == HEADER_RECORD_BATCH
        assert fd.data_body is not None  # the body field is always present on record batches
        cols = decode_record_batch(info, fd.data_body, list(schema), columns_as_list=lst)
        enc = encode_record_batch(cols, [f.type for f in schema], use_deephaven_nulls=dh, columns_as_list=lst)
        again = read_message_header(enc.header)
        np.testing.assert_array_equal(again.nodes, info.nodes)
        np.testing.assert_array_equal(again.buffers, info.buffers)
        assert again.length == info.length and again.body_length == info.body_length
        assert b"".join(bytes(p) for p in enc.body_parts) == bytes(fd.data_body)
        # the whole FlightData re-encodes: header, metadata, body in Deephaven's field order
        assert encode_flight_data(fd.data_header, fd.app_metadata, body_parts=enc.body_parts) == r.payload
        batches += 1
    if "discovery" not in str(path):
        assert batches > 0


COLUMN_LINE = re.compile(r"^        (\w+): len=(\d+) nulls=(\d+) (\[.*\])(?: \.\.\.)?$", re.M)
HEADER_LINE = re.compile(r"data_header: RecordBatch length=(\d+) body_length=(\d+) nodes\(len,nulls\)=(\[.*?\])")


def _raw_values(arr: pa.Array, n: int):
    if pa.types.is_timestamp(arr.type) or pa.types.is_date64(arr.type) or pa.types.is_time64(arr.type) \
            or pa.types.is_duration(arr.type):
        arr = arr.view(pa.int64())
    return arr.slice(0, n).to_pylist()


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_values_match_decoded_txt(stream):
    path, options, _md, server = stream
    lst, _dh = _mode(options)
    records = decoded_records(decoded_sections(path.parent)[_call_number(path)])
    schema = None
    checked = 0
    # decoded.txt lists client records too; keep the server ones (they have Arrow data headers)
    server_texts = [records[n] for n in sorted(records)
                    if re.search(r"data_header: (Message|RecordBatch)", records[n])]
    assert len(server_texts) == len(server), (len(server_texts), len(server))
    for r, text in zip(server, server_texts):
        fd = decode_flight_data(r.payload)
        info = read_message_header(fd.data_header)
        if info.header_type == HEADER_SCHEMA:
            wire = read_schema_message(fd.data_header)
            schema = unwrap_list_schema(wire) if lst else wire
            assert f"Schema {len(wire)} fields" in text
            for f in wire:
                assert f"        {f.name}: " in text
            continue
        m = HEADER_LINE.search(text)
        assert m, text[:200]
        assert int(m.group(1)) == info.length and int(m.group(2)) == info.body_length
        shown = ast.literal_eval(m.group(3))  # decoded.txt may cut long node lists short
        assert shown == [tuple(x) for x in info.nodes.tolist()][: len(shown)] and len(shown) >= min(8, len(info.nodes))
        cols = decode_record_batch(info, fd.data_body, list(schema), columns_as_list=lst)
        by_name = dict(zip(schema.names, cols))
        for name, length, nulls, values in COLUMN_LINE.findall(text):
            expected = ast.literal_eval(values)
            arr = by_name[name]
            if lst:
                # shown as the one list of the wrapper: [[v1, v2, v3, '...']] or [[]]
                inner = [v for v in expected[0] if v != "..."] if expected else []
                assert _raw_values(arr, len(inner)) == inner, name
            else:
                assert len(arr) == int(length) and arr.null_count == int(nulls), name
                want = expected[: len(arr)]
                assert _raw_values(arr, len(want)) == want, name
            checked += 1
        if fd.app_metadata is not None:
            _check_metadata_text(barrage.unwrap(fd.app_metadata)[1], text)
    if server:
        assert checked > 0


def _ranges_text(r) -> str:
    if r is None:
        return "None"
    parts = [f"{s}" if s == e else f"{s}-{e}" for s, e in r.tolist()]
    return "{" + ", ".join(parts) + "}"


def _check_metadata_text(md: barrage.UpdateMetadata, text: str) -> None:
    m = re.search(r"first_seq=(-?\d+) last_seq=(-?\d+) is_snapshot=(\w+) table_size=(-?\d+)", text)
    assert m, text[:300]
    assert (md.first_seq, md.last_seq, md.is_snapshot, md.table_size) == (
        int(m.group(1)), int(m.group(2)), m.group(3) == "True", int(m.group(4)))
    m = re.search(r"added_rows=(\{[^}]*\}|None)(?: size=(\d+))?", text)
    if m and m.group(2):
        assert rowset_size(md.added_rows) == int(m.group(2))
    m = re.search(r"raw: (.*)$", text, re.M)
    if m:
        for item in m.group(1).split():
            name, _, value = item.partition("=")
            field = {"added": "added_rows", "removed": "removed_rows", "included": "added_rows_included",
                     "shift": "shift_data"}[name]
            decoded = getattr(md, field)
            assert (decoded is not None) == (value != "None"), (field, value)
            if decoded is not None:
                again = encode_shifts(*decoded) if field == "shift_data" else encode_rowset(decoded)
                assert again.hex() == value, (field, value)


@pytest.mark.parametrize("stream", STREAMS, ids=IDS)
def test_streams_decode_into_complete_updates(stream):
    path, options, _md, server = stream
    lst, dh = _mode(options)
    dec = StreamDecoder(columns_as_list=lst, use_deephaven_nulls=dh)
    updates = [u for u in (dec.feed(r.payload) for r in server) if u is not None]
    if "big_static" in path.parent.name:
        assert dec.in_message  # the capture was truncated after 3 batches
        return
    assert not dec.in_message
    for u in updates:
        md = u.metadata
        assert md is not None
        assert all(len(a) == md.num_adds() for a in u.added)
        for c, a in enumerate(u.modified):
            assert len(a) == (md.mod_counts()[c] if md.mod_column_nodes is not None else 0)


def test_java_full_subscription_static_mixed_values():
    # barrage_java call 3: full subscription of static_mixed with use_deephaven_nulls
    stream = next(s for s in STREAMS if s[0].parent.name == "barrage_java" and s[0].name.startswith("0003_"))
    path, options, _md, server = stream
    assert options.use_deephaven_nulls and not options.columns_as_list
    dec = StreamDecoder(use_deephaven_nulls=True)
    (update,) = [u for u in (dec.feed(r.payload) for r in server) if u]
    md = update.metadata
    assert md.is_snapshot and md.table_size == 1000 and md.first_seq == -1
    assert md.effective_viewport is None
    assert md.effective_column_set.tolist() == list(range(10))
    np.testing.assert_array_equal(md.added_rows, [[0, 999]])
    assert md.removed_rows.shape == (0, 2) and md.shift_data[0].size == 0
    assert len(md.mod_column_nodes) == 10
    t = update.added_table(dec.schema)
    assert t.column("I8").to_pylist()[:3] == [None, -49, -48]  # sentinel -128 became null
    assert t.column("Str").to_pylist()[:3] == [None, "s1", "s2"]
    assert t.column("Ch").to_pylist()[:3] == [None, 66, 67]
    assert t.column("F32").to_pylist()[1:3] == [0.125, 0.25]
    assert t.column("Bool").null_count == 77 and t.column("Str").null_count == 91


def test_sorted_table_shifts_decode():
    stream = next(s for s in STREAMS if s[0].parent.name == "ticking_sorted")
    _p, options, _md, server = stream
    dec = StreamDecoder(columns_as_list=True, use_deephaven_nulls=True)
    updates = [u for u in (dec.feed(r.payload) for r in server) if u]
    shifted = [u for u in updates if u.metadata.shift_data is not None and u.metadata.shift_data[0].size]
    assert shifted
    for u in shifted:
        s, e, d = u.metadata.shift_data
        assert np.all(e >= s) and np.all(d >= 0)
