"""Row-set, shift and bitset codecs: spec vectors, a reference transliteration, golden bytes, fuzzing."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol import rowset as rs
from tickwire.protocol.rowset import (
    decode_bitset,
    decode_rowset,
    decode_shifts,
    encode_bitset,
    encode_rowset,
    encode_shifts,
    keys_to_ranges,
    merge_ranges,
    ranges_to_keys,
)

from .golden import GOLDEN, golden_dirs

I64_MAX = 2**63 - 1


def R(*pairs):
    return np.array(pairs, dtype=np.int64).reshape(-1, 2)


def K(*keys):
    return keys_to_ranges(np.array(keys, dtype=np.int64))


# BARRAGE-WIRE.md §3.4: every worked example (set, bytes).
SPEC_EXAMPLES = [
    (R(), "20"),
    (K(0), "0c 00 20"),
    (K(5), "0c 05 20"),
    (K(127), "0c 7f 20"),
    (K(128), "09 80 00 20"),
    (K(32766), "09 fe 7f 20"),
    (K(32767), "09 ff 7f 20"),
    (K(32768), "0a 00 80 00 00 20"),
    (K(2**31 - 1), "0a ff ff ff 7f 20"),
    (K(2**31), "0b 00 00 00 80 00 00 00 00 20"),
    (K(I64_MAX), "0b ff ff ff ff ff ff ff 7f 20"),
    (R((0, 3)), "1c 02 00 fd 20"),
    (R((0, 9)), "1c 02 00 f7 20"),
    (R((0, 156)), "14 02 00 00 64 ff 20"),
    (R((157, 166)), "09 9d 00 0c f7 20"),
    (R((10, 20), (30, 40)), "1c 04 0a f6 0a f6 20"),
    (K(0, 2, 4, 6, 8, 10), "1c 06 00 02 02 02 02 02 20"),
    (K(1, 3), "1c 02 01 02 20"),
    (K(200, 205), "09 c8 00 0c 05 20"),
    (K(5, 305), "14 02 05 00 2c 01 20"),
    (K(1000, 1002, 1004, 1006, 2000), "14 05 e8 03 02 00 02 00 02 00 e2 03 20"),
    (K(1000, 2000, 2002, 2004, 2006, 2008, 3000), "14 02 e8 03 e8 03 1c 04 02 02 02 02 09 e0 03 20"),
    (K(1, 3, 6, 10, 310), "1c 04 01 02 03 04 09 2c 01 20"),
    (R((0, 32766)), "14 02 00 00 02 80 20"),
    (R((0, 32767)), "0c 00 09 01 80 20"),
    (R((100, 40100)), "0c 64 0a c0 63 ff ff 20"),
    (R((0, 999999)), "0c 00 0a c1 bd f0 ff 20"),
    (R((1638, 999999)), "09 66 06 0a 27 c4 f0 ff 20"),
    (R((2**31 - 1, 2**31 + 1)), "0a ff ff ff 7f 0c fe 20"),
    (R((0, 2**31)), "0c 00 0a 00 00 00 80 20"),
    (R((2**63 - 10, I64_MAX)), "0b f6 ff ff ff ff ff ff 7f 0c f7 20"),
    (R((1073741812, 1073741850)), "0a f4 ff ff 3f 0c da 20"),
    (R((1073741710, 1073741711), (1073741770, 1073741770), (1073741781, 1073741781),
       (1073741834, 1073741836), (1073741842, 1073741844)),
     "0a 8e ff ff 3f 1c 07 ff 3b 0b 35 fe 06 fe 20"),
    (keys_to_ranges(np.arange(0, 260, 2)), "19 82 00 00" + " 02" * 129 + " 20"),
]


@pytest.mark.parametrize("ranges,hexbytes", SPEC_EXAMPLES, ids=[f"ex{i + 1}" for i in range(len(SPEC_EXAMPLES))])
def test_spec_examples(ranges, hexbytes):
    expected = bytes.fromhex(hexbytes)
    assert encode_rowset(ranges) == expected
    np.testing.assert_array_equal(decode_rowset(expected), ranges)
    # both decoder paths agree
    np.testing.assert_array_equal(_decode_vectorized(expected), ranges)


SHIFT_EXAMPLES = [
    (([], [], []), "20 20 20"),
    (([0], [10], [-5]), "0c 05 20 0c 0a 20 0c 00 20"),
    (([100, 200], [199, 200], [101, 202]), "1c 02 64 64 20 09 c7 00 0c ff 20 1c 02 65 65 20"),
    (([1073741710], [1073741711], [1073741708]), "0a 8e ff ff 3f 20 0a 8f ff ff 3f 20 0a 8c ff ff 3f 20"),
]


@pytest.mark.parametrize("shift,hexbytes", SHIFT_EXAMPLES)
def test_shift_examples(shift, hexbytes):
    starts, ends, dests = (np.array(x, dtype=np.int64) for x in shift)
    assert encode_shifts(starts, ends, dests) == bytes.fromhex(hexbytes)


def test_shift_example_clamped_decodes_to_clamped_start():
    s, e, d = decode_shifts(bytes.fromhex("0c 05 20 0c 0a 20 0c 00 20"))
    assert (s.tolist(), e.tolist(), d.tolist()) == ([5], [10], [0])


def test_shift_example_5_golden_sorted():
    # BARRAGE-WIRE.md §4.1 example 5 (from ticking_sorted)
    base = 1073741000
    shifts = [(696, 698, -2), (699, 699, -1), (702, 702, -1), (705, 706, -1), (717, 718, -1), (735, 735, -1),
              (771, 772, 1)]
    starts = np.array([base + a for a, _, _ in shifts])
    ends = np.array([base + b for _, b, _ in shifts])
    dests = np.array([base + a + d for a, _, d in shifts])
    expected = "0a80ffff3f1c060303030c122420" "0a82ffff3f1c06ff03040c112520" "0a7effff3f1c060403030c122620"
    assert encode_shifts(starts, ends, dests).hex() == expected
    s, e, d = decode_shifts(bytes.fromhex(expected))
    np.testing.assert_array_equal(s, starts)
    np.testing.assert_array_equal(e, ends)
    np.testing.assert_array_equal(d, dests)


@pytest.mark.parametrize(
    "indices,hexbytes",
    [([0, 1, 2], "07"), (list(range(5)), "1f"), (list(range(10)), "ff03"), ([0, 9], "0102"), ([8], "0001"),
     (list(range(16)), "ffff"), ([], "")],
)
def test_bitset_examples(indices, hexbytes):
    assert encode_bitset(indices).hex() == hexbytes
    assert decode_bitset(bytes.fromhex(hexbytes)).tolist() == indices


# ----------------------------------------------------------------------------------------------
# A line-by-line reference of the encoder in BARRAGE-WIRE.md §3.3, independent of the vectorized one.
# ----------------------------------------------------------------------------------------------

def _ref_width(v: int) -> tuple[int, int, str]:
    if -128 <= v <= 127:
        return 4, 1, "b"
    if -32768 <= v <= 32767:
        return 1, 2, "<h"
    if -(2**31) <= v <= 2**31 - 1:
        return 2, 4, "<i"
    return 3, 8, "<q"


def _ref_offset(out: bytearray, kind: int, v: int) -> None:
    code, nbytes, _ = _ref_width(v)
    out.append(kind | code)
    out += v.to_bytes(nbytes, "little", signed=True)


def reference_encode(ranges) -> bytes:
    out = bytearray()
    pend: list[int] = []

    def group(shorts, bytes_):
        if len(shorts) == 1:
            _ref_offset(out, 0x08, shorts[0])
        elif len(shorts) > 1:
            _ref_offset(out, 0x10, len(shorts))
            for x in shorts:
                out.extend(x.to_bytes(2, "little", signed=True))
        if len(bytes_) == 1:
            _ref_offset(out, 0x08, bytes_[0])
        elif len(bytes_) > 1:
            _ref_offset(out, 0x18, len(bytes_))
            for x in bytes_:
                out.extend(x.to_bytes(1, "little", signed=True))

    def flush():
        start = run = 0
        for i, x in enumerate(pend):
            if -128 <= x <= 127:
                run += 1
                continue
            if run >= 4:
                group(pend[start:i - run], pend[i - run:i])
                start = i
            run = 0
        group(pend[start:len(pend) - run], pend[len(pend) - run:])
        pend.clear()

    def put(d):
        if abs(d) >= 32767:
            flush()
            _ref_offset(out, 0x08, d)
        else:
            pend.append(d)

    last = 0
    for s, e in ranges:
        s, e = int(s), int(e)
        put(s - last)
        last = s
        if e > s:
            put(-(e - s))
            last = e
    flush()
    out.append(0x20)
    return bytes(out)


def _decode_vectorized(data: bytes) -> np.ndarray:
    values, end = rs._decode_commands_vectorized(np.frombuffer(data, dtype=np.uint8), 0)
    assert end == len(data)
    return rs._deltas_to_ranges(values)


def _decode_scan(data: bytes) -> np.ndarray:
    values, end = rs._scan_commands(np.frombuffer(data, dtype=np.uint8), 0)
    assert end == len(data)
    return rs._deltas_to_ranges(values)


GAP = st.one_of(
    st.integers(1, 3), st.integers(4, 200), st.integers(120, 140), st.integers(32760, 32775),
    st.integers(1, 2**20), st.integers(2**31 - 5, 2**31 + 5), st.integers(1, 2**40),
)
LEN = st.one_of(st.integers(0, 3), st.integers(0, 200), st.integers(32760, 32775), st.integers(0, 2**33))


@st.composite
def rowsets(draw, max_ranges=60):
    n = draw(st.integers(0, max_ranges))
    first = draw(st.one_of(st.just(0), st.integers(0, 300), st.integers(0, 2**40)))
    out = []
    pos = first
    for i in range(n):
        if i:
            pos += draw(GAP) + 1  # at least one missing key between ranges
        length = draw(LEN)
        if pos > I64_MAX:
            break
        end = min(pos + length, I64_MAX)
        out.append((pos, end))
        pos = end
        if pos >= I64_MAX - 1:
            break
    return np.array(out, dtype=np.int64).reshape(-1, 2)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rowsets())
def test_encoder_matches_reference_and_round_trips(ranges):
    data = encode_rowset(ranges)
    assert data == reference_encode(ranges)
    np.testing.assert_array_equal(decode_rowset(data), ranges)
    np.testing.assert_array_equal(_decode_vectorized(data), ranges)
    np.testing.assert_array_equal(_decode_scan(data), ranges)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5000), max_size=400, unique=True))
def test_dense_small_key_sets_match_reference(keys):
    r = keys_to_ranges(np.sort(np.array(keys, dtype=np.int64)))
    data = encode_rowset(r)
    assert data == reference_encode(r)
    np.testing.assert_array_equal(_decode_vectorized(data), r)


def test_large_sets_round_trip_both_paths():
    rng = np.random.default_rng(7)
    keys = np.unique(rng.integers(0, 10**9, 200_000))
    r = keys_to_ranges(keys)
    data = encode_rowset(r)
    assert data == reference_encode(r)
    np.testing.assert_array_equal(decode_rowset(data), r)
    np.testing.assert_array_equal(_decode_scan(data), r)
    np.testing.assert_array_equal(ranges_to_keys(decode_rowset(data)), keys)


def test_adjacent_input_ranges_are_merged_like_deephaven():
    assert encode_rowset(R((0, 4), (5, 9))) == encode_rowset(R((0, 9)))


@pytest.mark.parametrize("bad", [R((5, 4)), R((0, 5), (3, 9)), R((10, 12), (0, 1)), R((-1, 3))])
def test_encoder_rejects_invalid_ranges(bad):
    with pytest.raises(ValueError):
        encode_rowset(bad)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**4), st.integers(-10**4, 10**4)), max_size=30))
def test_shifts_round_trip(raw):
    # build normalized, non-overlapping shifts with order-preserving destinations
    starts, ends, dests = [], [], []
    cursor = 0
    prev_dest_end = -1
    for gap, length, delta in raw:
        s = cursor + gap
        e = s + length
        if delta == 0:
            delta = 1
        lo = max(s + delta, prev_dest_end + 1, 0)
        d = lo
        if d - s == 0:
            d += 1
        starts.append(s)
        ends.append(e)
        dests.append(d)
        prev_dest_end = d + (e - s)
        cursor = e + 1 + max(0, prev_dest_end - e)
    s, e, d = (np.array(x, dtype=np.int64) for x in (starts, ends, dests))
    data = encode_shifts(s, e, d)
    s2, e2, d2 = decode_shifts(data)
    np.testing.assert_array_equal(s2, s)
    np.testing.assert_array_equal(e2, e)
    np.testing.assert_array_equal(d2, d)


@settings(max_examples=300, deadline=None)
@given(st.sets(st.integers(0, 3000), max_size=200))
def test_bitset_round_trip(indices):
    idx = np.array(sorted(indices), dtype=np.int64)
    data = encode_bitset(idx)
    assert not data or data[-1] != 0  # no trailing zero bytes
    np.testing.assert_array_equal(decode_bitset(data), idx)


# ----------------------------------------------------------------------------------------------
# Golden row sets: every `raw:` line of decoded.txt re-encodes byte-identically
# ----------------------------------------------------------------------------------------------

RAW = re.compile(r"raw: (.*)$")


def _golden_raw_rowsets():
    found = []
    for d in golden_dirs():
        for line in (d / "decoded.txt").read_text().splitlines():
            m = RAW.search(line)
            if not m:
                continue
            for item in m.group(1).split():
                name, _, value = item.partition("=")
                if value.endswith("None"):
                    value = value[: -len("None")]
                if value:
                    found.append((d.name, name, bytes.fromhex(value)))
    return found


GOLDEN_RAW = _golden_raw_rowsets() if GOLDEN.exists() else []


@pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")
def test_golden_raw_rowsets_reencode_identically():
    assert len(GOLDEN_RAW) > 300
    shifts = 0
    for where, name, data in GOLDEN_RAW:
        if name == "shift":
            s, e, d = decode_shifts(data)
            assert encode_shifts(s, e, d) == data, (where, name, data.hex())
            shifts += int(s.size > 0)
        else:
            r = decode_rowset(data)
            assert encode_rowset(r) == data, (where, name, data.hex())
            np.testing.assert_array_equal(_decode_vectorized(data), r)
    assert shifts > 0  # the sorted table's captures carry real shifts


# ----------------------------------------------------------------------------------------------
# Malformed input: one documented exception type
# ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "hexbytes,what",
    [
        ("", "no data"),
        ("0c 05", "truncated"),
        ("0a 00 80", "truncated"),
        ("1c 05 01 02", "past the end"),
        ("07 20", "bad command"),
        ("28 20", "bad command"),
        ("8c 05 20", "bad command"),
        ("0c fb 20", "without a range start"),
        ("1c 03 01 fe fe 20", "without a range start"),
        ("1c 02 05 00 20", "zero delta"),
        ("0c 05 20 00", "unexpected byte"),
        ("0b ff ff ff ff ff ff ff 7f 0c 05 20", "overflow"),
        ("1a ff ff ff ff 20", "negative array length"),
    ],
)
def test_malformed_rowsets_raise_protocol_error(hexbytes, what):
    data = bytes.fromhex(hexbytes)
    with pytest.raises(ProtocolError, match=what):
        decode_rowset(data)
    if data:
        padded = data + b"\x00" * 600  # force the vectorized path on the same prefix
        with pytest.raises(ProtocolError):
            rs.decode_rowset_at(padded, 0) if what != "unexpected byte" else decode_rowset(padded)


def test_shift_data_with_unequal_sizes_is_rejected():
    with pytest.raises(ProtocolError, match="differ in size"):
        decode_shifts(bytes.fromhex("1c 02 00 05 20 0c 01 20 0c 02 20"))


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_random_bytes_only_protocol_error(data):
    for decode in (decode_rowset, decode_shifts, _decode_vectorized_checked):
        try:
            decode(data)
        except ProtocolError:
            pass


def _decode_vectorized_checked(data: bytes):
    if data:
        values, _ = rs._decode_commands_vectorized(np.frombuffer(data, dtype=np.uint8), 0)
        rs._deltas_to_ranges(values)


@settings(max_examples=500, deadline=None)
@given(rowsets(max_ranges=20), st.data())
def test_fuzz_mutations_of_valid_rowsets(ranges, data):
    raw = bytearray(encode_rowset(ranges))
    op = data.draw(st.sampled_from(["truncate", "flip", "insert"]))
    if op == "truncate":
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    elif op == "flip":
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= 1 << data.draw(st.integers(0, 7))
    else:
        raw.insert(data.draw(st.integers(0, len(raw))), data.draw(st.integers(0, 255)))
    for decode in (decode_rowset, _decode_vectorized_checked):
        try:
            out = decode(bytes(raw))
        except ProtocolError:
            continue
        if out is not None:
            # whatever decodes is a valid canonical range set
            assert np.all(out[:, 1] >= out[:, 0])
            assert np.all(out[1:, 0] > out[:-1, 1] + 1)


def test_merge_ranges_sorts_and_joins_overlapping_and_adjacent_ranges():
    got = merge_ranges([[10, 12], [0, 3], [4, 5], [11, 20], [30, 30], [2, 2]])
    assert got.tolist() == [[0, 5], [10, 20], [30, 30]]
    assert merge_ranges(np.empty((0, 2), dtype=np.int64)).shape == (0, 2)
    rng = np.random.default_rng(7)
    for _ in range(50):
        starts = rng.integers(0, 200, 12)
        r = np.stack([starts, starts + rng.integers(0, 15, 12)], axis=1)
        keys = np.unique(np.concatenate([np.arange(a, b + 1) for a, b in r]))
        assert merge_ranges(r).tolist() == keys_to_ranges(keys).tolist()


def test_the_three_command_scanners_and_both_delta_paths_agree_on_random_and_corrupted_row_sets():
    """decode_rowset picks a scanner by input size (direct, header scan, pointer doubling) and
    reads deltas by a fast path when nothing is unusual: every choice gives the same values, and
    each refuses what the others refuse."""
    from tickwire.protocol import rowset as r

    rng = np.random.default_rng(11)
    for _ in range(1500):
        space = int(rng.choice([100, 10**4, 10**7, 2**40, 2**62]))
        keys = np.unique(rng.integers(0, space, int(rng.integers(1, 400))))
        ranges, last = [], -2
        for a, w in zip(keys.tolist(), (rng.integers(0, 3, keys.size) * (rng.random(keys.size) < 0.3)).tolist()):
            if a > last + 1:
                ranges.append((a, min(a + w, 2**62)))
                last = ranges[-1][1]
        want = r.normalize_ranges(np.array(ranges, dtype=np.int64).reshape(-1, 2))
        raw = r.encode_rowset(want)
        buf = np.frombuffer(raw, dtype=np.uint8)
        outs = [fn(buf, 0) for fn in (r._scan_commands, r._scan_headers, r._decode_commands_vectorized)]
        assert all(np.array_equal(o[0], outs[0][0]) and o[1] == len(raw) for o in outs)
        assert np.array_equal(r._deltas_to_ranges(outs[0][0]), want)
        assert np.array_equal(r.decode_rowset(raw), want)
        deltas = rng.integers(-50, 50, int(rng.integers(1, 30)))
        if rng.random() < 0.3:  # starts only (scattered keys), runs of 1 (adjacent keys) among them
            deltas = np.where(rng.random(deltas.size) < 0.3, 1, np.abs(deltas) + (rng.random(deltas.size) < 0.9))
        got = []
        for fn in (r._deltas_to_ranges, r._deltas_to_ranges_checked):
            try:
                got.append(fn(deltas))
            except ProtocolError as exc:
                got.append(str(exc))
        assert (isinstance(got[0], str) and got[0] == got[1]) or np.array_equal(got[0], got[1])
        bad = bytearray(raw)
        bad[int(rng.integers(0, len(bad)))] = int(rng.integers(0, 256))
        bad_buf = np.frombuffer(bytes(bad), dtype=np.uint8)
        results = []
        for fn in (r._scan_commands, r._scan_headers):
            try:
                results.append(fn(bad_buf, 0))
            except ProtocolError:
                results.append(None)
        assert (results[0] is None) == (results[1] is None)
        if results[0] is not None:
            assert np.array_equal(results[0][0], results[1][0]) and results[0][1] == results[1][1]


def _encode_vectorized(ranges: np.ndarray) -> bytes:
    r = rs.normalize_ranges(ranges)
    return rs.EMPTY_ROWSET_BYTES if r.shape[0] == 0 else rs._encode_deltas(rs._deltas(r)).tobytes()


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rowsets(max_ranges=rs._SMALL_RANGES), st.data())
def test_the_scan_of_few_ranges_encodes_as_the_vectorized_encoder(ranges, data):
    """Row sets of up to _SMALL_RANGES ranges (a viewport, a few runs of rows) are encoded by a
    scan in Python; it gives the vectorized encoder's bytes, adjacent ranges included."""
    if ranges.shape[0] > 1 and data.draw(st.booleans()):
        # make some ranges adjacent to the one before (one range once merged)
        adjacent = np.array(data.draw(st.lists(st.booleans(), min_size=ranges.shape[0] - 1,
                                               max_size=ranges.shape[0] - 1)))
        ranges = ranges.copy()
        ranges[1:, 0] = np.where(adjacent, ranges[:-1, 1] + 1, ranges[1:, 0])
        ranges = ranges[np.r_[True, ranges[1:, 0] <= ranges[1:, 1]]]
        ranges = ranges[np.r_[True, ranges[1:, 0] > ranges[:-1, 1]]]
    assert 0 < ranges.shape[0] <= rs._SMALL_RANGES or ranges.shape[0] == 0
    assert encode_rowset(ranges) == _encode_vectorized(ranges)


@pytest.mark.parametrize("bad", [R((5, 4)), R((0, 5), (3, 9)), R((10, 12), (0, 1)), R((-1, 3)),
                                 R((0, 5), (3, 9), (12, 11)), R((0, 5), (5, 9))])
def test_the_scan_of_few_ranges_refuses_what_the_vectorized_encoder_refuses(bad):
    with pytest.raises(ValueError) as scan:
        encode_rowset(bad)
    with pytest.raises(ValueError) as vectorized:
        _encode_vectorized(bad)
    assert str(scan.value) == str(vectorized.value)
