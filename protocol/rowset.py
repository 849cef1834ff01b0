"""Barrage row-set, shift-data and column-bitset codecs (docs/rowsets.md).

A row set is an ordered set of non-negative int64 values (row keys, or positions for viewports).
This module exchanges row sets as numpy ``(n, 2)`` int64 arrays of closed ranges ``[start, end]``,
sorted, disjoint and non-adjacent (maximal), and never as Python lists of keys.

The encoder produces the same bytes as Deephaven's server encoder
(``ExternalizableRowSetUtils.writeExternalCompressedDeltas``) for every set: adjacent ranges are
merged first, deltas of magnitude >= 32767 flush the pending small deltas and go out as a lone
OFFSET, runs of at least four byte-sized deltas between two-byte deltas become their own BYTE_ARRAY,
and trailing byte-sized deltas always go out as bytes.

Both directions are vectorized and linear in the number of ranges (decoding large inputs is
O(bytes * log(commands)) through pointer doubling over the command stream). Small inputs take a
direct scan both ways, which is faster for the few ranges and bytes most messages carry.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import numpy.typing as npt

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import BytesLike

__all__ = [
    "EMPTY_RANGES",
    "merge_ranges",
    "EMPTY_ROWSET_BYTES",
    "NO_SHIFTS_BYTES",
    "encode_rowset",
    "decode_rowset",
    "decode_rowset_at",
    "encode_shifts",
    "decode_shifts",
    "encode_bitset",
    "decode_bitset",
    "keys_to_ranges",
    "ranges_to_keys",
    "normalize_ranges",
    "rowset_size",
]

# Command kinds and value widths (docs/rowsets.md#command-bytes).
OFFSET = 0x08
SHORT_ARRAY = 0x10
BYTE_ARRAY = 0x18
END = 0x20
W_SHORT, W_INT, W_LONG, W_BYTE = 1, 2, 3, 4
_WIDTH_BYTES = np.array([0, 2, 4, 8, 1, 0, 0, 0], dtype=np.int64)  # indexed by width code

EMPTY_RANGES = np.zeros((0, 2), dtype=np.int64)
EMPTY_ROWSET_BYTES = b"\x20"
NO_SHIFTS_BYTES = b"\x20\x20\x20"

_I64_MAX = np.iinfo(np.int64).max
_SMALL_INPUT = 512  # bytes; below this a direct scan beats the vectorized decoder
_HEADER_SCAN_INPUT = 4096  # bytes; up to this the header scan, past it the pointer doubling


# ----------------------------------------------------------------------------------------------
# keys <-> ranges
# ----------------------------------------------------------------------------------------------

def keys_to_ranges(keys: npt.ArrayLike) -> np.ndarray:
    """Sorted, distinct non-negative keys -> maximal closed ranges, shape (n, 2)."""
    k = np.asarray(keys, dtype=np.int64).ravel()
    if k.size == 0:
        empty: np.ndarray = EMPTY_RANGES.copy()
        return empty
    if k[0] < 0:
        raise ValueError(f"row keys must be non-negative, got {int(k[0])}")
    d = np.diff(k)
    if d.size and d.min() <= 0:
        raise ValueError("row keys must be strictly ascending")
    return _runs(k, np.flatnonzero(d != 1))


def _runs(k: np.ndarray, breaks: np.ndarray) -> np.ndarray:
    """Ascending keys `k` as closed ranges, a range ending after each index in `breaks`."""
    out = np.empty((breaks.size + 1, 2), dtype=np.int64)
    out[0, 0] = k[0]
    out[1:, 0] = k[breaks + 1]
    out[:-1, 1] = k[breaks]
    out[-1, 1] = k[-1]
    return out


def ranges_to_keys(ranges: npt.ArrayLike) -> np.ndarray:
    """Closed ranges (n, 2) -> the 1-D int64 array of every key they hold, ascending."""
    r = _as_ranges(ranges)
    if r.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = r[:, 1] - r[:, 0] + 1
    total = int(lengths.sum())
    # key = start of its range + index within the range, built with one repeat and one arange
    offsets = np.repeat(r[:, 0] - (np.cumsum(lengths) - lengths), lengths)
    return offsets + np.arange(total, dtype=np.int64)


def rowset_size(ranges: npt.ArrayLike) -> int:
    """Number of keys in a range array."""
    r = _as_ranges(ranges)
    return int((r[:, 1] - r[:, 0] + 1).sum()) if r.shape[0] else 0


def _as_ranges(ranges: npt.ArrayLike) -> np.ndarray:
    r = np.asarray(ranges, dtype=np.int64)
    if r.size == 0:
        return EMPTY_RANGES
    if r.ndim != 2 or r.shape[1] != 2:
        raise ValueError(f"ranges must have shape (n, 2), got {r.shape}")
    return r


def merge_ranges(ranges: npt.ArrayLike) -> np.ndarray:
    """Closed ranges in any order, overlapping or adjacent, as sorted disjoint ones with the
    overlapping and adjacent ones joined (viewports: a client may name positions twice)."""
    r = _as_ranges(ranges)
    if r.shape[0] < 2:
        return r
    r = r[np.argsort(r[:, 0], kind="stable")]
    ends = np.maximum.accumulate(r[:, 1])
    # a range starts a new run when it begins after every earlier range ends (+1: adjacent joins)
    new = np.empty(r.shape[0], dtype=bool)
    new[0] = True
    new[1:] = r[1:, 0] > ends[:-1] + 1
    starts = r[new, 0]
    last_of_run = np.append(np.flatnonzero(new)[1:] - 1, r.shape[0] - 1)
    return np.ascontiguousarray(np.stack([starts, ends[last_of_run]], axis=1), dtype=np.int64)


def normalize_ranges(ranges: npt.ArrayLike) -> np.ndarray:
    """Validates sorted, disjoint, non-negative closed ranges and merges adjacent ones."""
    r = _as_ranges(ranges)
    n = r.shape[0]
    if n == 0:
        return EMPTY_RANGES
    s, e = r[:, 0], r[:, 1]
    if s[0] < 0:
        raise ValueError(f"row set values must be non-negative, got {int(s[0])}")
    if np.any(e < s):
        i = int(np.flatnonzero(e < s)[0])
        raise ValueError(f"range {i} has end {int(e[i])} before start {int(s[i])}")
    if n == 1:
        return r
    gaps = s[1:] - e[:-1]
    if np.any(gaps <= 0):
        i = int(np.flatnonzero(gaps <= 0)[0])
        raise ValueError(f"ranges must be sorted and disjoint: range {i + 1} starts at {int(s[i + 1])} "
                         f"but range {i} ends at {int(e[i])}")
    adjacent = gaps == 1
    if not adjacent.any():
        return r
    keep_start = np.concatenate(([True], ~adjacent))
    keep_end = np.concatenate((~adjacent, [True]))
    return np.stack((s[keep_start], e[keep_end]), axis=1)


# ----------------------------------------------------------------------------------------------
# encoding
# ----------------------------------------------------------------------------------------------

def _width_code(values: np.ndarray) -> np.ndarray:
    """Narrowest width code for each signed value: BYTE, SHORT, INT or LONG."""
    out = np.full(values.shape, W_LONG, dtype=np.int64)
    out[(values >= -(2 ** 31)) & (values <= 2 ** 31 - 1)] = W_INT
    out[(values >= -32768) & (values <= 32767)] = W_SHORT
    out[(values >= -128) & (values <= 127)] = W_BYTE
    return out


def _scatter(out: np.ndarray, positions: np.ndarray, values: np.ndarray, nbytes: int) -> None:
    """Writes each value little-endian with `nbytes` bytes at its byte position in `out`."""
    if positions.size == 0:
        return
    raw = np.ascontiguousarray(values, dtype="<i8").view(np.uint8).reshape(-1, 8)[:, :nbytes]
    idx = positions[:, None] + np.arange(nbytes, dtype=np.int64)
    out[idx] = raw


def _scatter_by_width(out: np.ndarray, positions: np.ndarray, values: np.ndarray, widths: np.ndarray) -> None:
    for code in (W_BYTE, W_SHORT, W_INT, W_LONG):
        sel = widths == code
        if sel.any():
            _scatter(out, positions[sel], values[sel], int(_WIDTH_BYTES[code]))


def _deltas(r: np.ndarray) -> np.ndarray:
    """The signed delta sequence of Deephaven's encoder for maximal ranges `r`."""
    s, e = r[:, 0], r[:, 1]
    prev_end = np.empty_like(e)
    prev_end[0] = 0
    prev_end[1:] = e[:-1]
    has_end = e > s
    count = r.shape[0] + int(has_end.sum())
    d = np.empty(count, dtype=np.int64)
    # position of each range's start delta: its index plus the number of end deltas before it
    start_pos = np.arange(r.shape[0], dtype=np.int64) + np.concatenate(([0], np.cumsum(has_end)[:-1]))
    d[start_pos] = s - prev_end
    d[start_pos[has_end] + 1] = -(e[has_end] - s[has_end])
    return d


def encode_rowset(ranges: npt.ArrayLike) -> bytes:
    """Encodes closed ranges as Deephaven's compressed-delta RowSet bytes (docs/rowsets.md#encoding-rules)."""
    r = _as_ranges(ranges)
    if 0 < r.shape[0] <= _SMALL_RANGES:
        return _encode_small(r.tolist())
    r = normalize_ranges(r)
    if r.shape[0] == 0:
        return EMPTY_ROWSET_BYTES
    return _encode_deltas(_deltas(r)).tobytes()


#: up to this many ranges a row set is encoded by a scan in Python: the vectorized encoder's fixed
#: cost (some seventy numpy calls, about 200 us) is most of a message's metadata, which most often
#: names a viewport or a few runs of rows
_SMALL_RANGES = 32
_WIDTH_OF = ((W_BYTE, 1), (W_SHORT, 2), (W_INT, 4))


def _width(v: int) -> tuple[int, int]:
    """The narrowest (width code, bytes) for a signed value."""
    for code, nbytes in _WIDTH_OF:
        if -(1 << (8 * nbytes - 1)) <= v < (1 << (8 * nbytes - 1)):
            return code, nbytes
    return W_LONG, 8


def _encode_small(ranges: list[list[int]]) -> bytes:
    """`encode_rowset` of a few ranges (a list of [start, end]), with the same validation and
    merging as `normalize_ranges` and the same bytes as `_encode_deltas`."""
    if ranges[0][0] < 0:
        raise ValueError(f"row set values must be non-negative, got {ranges[0][0]}")
    for i, (s, e) in enumerate(ranges):
        if e < s:
            raise ValueError(f"range {i} has end {e} before start {s}")
    d: list[int] = []   # the delta sequence (`_deltas`)
    prev_end, start, end = 0, ranges[0][0], ranges[0][0] - 1
    for i, (s, e) in enumerate(ranges):
        if i and s <= end:
            raise ValueError(f"ranges must be sorted and disjoint: range {i} starts at {s} "
                             f"but range {i - 1} ends at {end}")
        if i and s == end + 1:   # adjacent: one range
            end = e
            continue
        if i:
            d.append(start - prev_end)
            if end > start:
                d.append(start - end)
            prev_end = end
        start, end = s, e
    d.append(start - prev_end)
    if end > start:
        d.append(start - end)
    m = len(d)
    # labels as `_encode_deltas` gives them: 2 a big delta (alone), 1 a member of a run of
    # byte-sized deltas that goes out as a BYTE_ARRAY, 0 a member of a SHORT_ARRAY
    big = [abs(x) >= 32767 for x in d]
    label = [2 if b else 0 for b in big]
    i = 0
    while i < m:
        if big[i] or not -128 <= d[i] <= 127:
            i += 1
            continue
        j = i
        while j < m and not big[j] and -128 <= d[j] <= 127:
            j += 1
        if j == m or big[j] or j - i >= 4:
            label[i:j] = [1] * (j - i)
        i = j
    out = bytearray()
    i = 0
    while i < m:
        j = i + 1
        if label[i] != 2:
            while j < m and label[j] == label[i]:
                j += 1
        if j - i == 1:
            code, nbytes = _width(d[i])
            out.append(OFFSET | code)
            out += d[i].to_bytes(nbytes, "little", signed=True)
        else:
            code, nbytes = _width(j - i)
            out.append((BYTE_ARRAY if label[i] == 1 else SHORT_ARRAY) | code)
            out += (j - i).to_bytes(nbytes, "little", signed=True)
            size = 1 if label[i] == 1 else 2
            for v in d[i:j]:
                out += v.to_bytes(size, "little", signed=True)
        i = j
    out.append(END)
    return bytes(out)


def _encode_deltas(d: np.ndarray) -> np.ndarray:
    m = d.size
    mag = np.abs(d)
    big = mag >= 32767
    isbyte = (d >= -128) & (d <= 127) & ~big

    # Runs of byte-sized deltas. A run is split out as a BYTE_ARRAY when it ends its segment of
    # small deltas (next element is big or the end) or when it has at least 4 elements and a
    # two-byte delta follows it. Everything else that is small goes into SHORT groups.
    idx = np.arange(m, dtype=np.int64)
    b = isbyte.astype(np.int8)
    edges = np.diff(np.concatenate(([0], b, [0])))
    run_start = np.flatnonzero(edges == 1)
    run_end = np.flatnonzero(edges == -1)  # exclusive
    run_len = run_end - run_start
    follows_big_or_end = np.ones(run_end.shape, dtype=bool)
    inside = run_end < m
    follows_big_or_end[inside] = big[run_end[inside]]
    split = follows_big_or_end | (run_len >= 4)
    in_split: np.ndarray = np.zeros(m + 1, dtype=np.int64)
    np.add.at(in_split, run_start[split], 1)
    np.add.at(in_split, run_end[split], -1)
    in_split = np.cumsum(in_split[:m]) > 0

    # Group label per element: 0 = SHORT group member, 1 = BYTE group member, 2 = big OFFSET.
    label = np.where(big, 2, np.where(in_split, 1, 0)).astype(np.int8)
    new_group = np.ones(m, dtype=bool)
    new_group[1:] = (label[1:] != label[:-1]) | big[1:] | big[:-1]
    g_start = np.flatnonzero(new_group)
    g_count = np.diff(np.append(g_start, m))
    g_label = label[g_start]
    g_first = d[g_start]

    single = g_count == 1
    # header byte and payload layout per group
    count_w = _width_code(g_count)
    value_w = _width_code(g_first)
    header = np.where(
        single,
        OFFSET | value_w,
        np.where(g_label == 1, BYTE_ARRAY, SHORT_ARRAY) | count_w,
    )
    elem = np.where(g_label == 1, 1, 2)
    size = np.where(single, 1 + _WIDTH_BYTES[value_w], 1 + _WIDTH_BYTES[count_w] + g_count * elem)
    g_off = np.concatenate(([0], np.cumsum(size)))
    total = int(g_off[-1]) + 1

    out = np.zeros(total, dtype=np.uint8)
    out[g_off[:-1]] = header
    out[-1] = END
    # singleton values
    sp = g_off[:-1][single] + 1
    _scatter_by_width(out, sp, g_first[single], value_w[single])
    # array counts
    multi = ~single
    _scatter_by_width(out, g_off[:-1][multi] + 1, g_count[multi], count_w[multi])
    # array elements
    if multi.any():
        grp_of = np.repeat(np.arange(g_start.size), g_count)
        within = idx - g_start[grp_of]
        member = multi[grp_of]
        data_start = g_off[:-1] + 1 + _WIDTH_BYTES[count_w]
        pos = data_start[grp_of] + within * elem[grp_of]
        is_b = member & (label == 1)
        is_s = member & (label == 0)
        _scatter(out, pos[is_b], d[is_b], 1)
        _scatter(out, pos[is_s], d[is_s], 2)
    return out


# ----------------------------------------------------------------------------------------------
# decoding
# ----------------------------------------------------------------------------------------------

def decode_rowset(data: BytesLike) -> np.ndarray:
    """Decodes RowSet bytes into maximal closed ranges, shape (n, 2) int64.

    Raises ProtocolError for truncated input, unknown command bytes, trailing bytes after END,
    a range end with no start, zero or overflowing deltas.
    """
    ranges, end = decode_rowset_at(data, 0)
    if end != len(memoryview(data)):
        raise ProtocolError(f"row set: {len(memoryview(data)) - end} unexpected byte(s) after END at offset {end - 1}")
    return ranges


def decode_rowset_at(data: BytesLike, pos: int = 0) -> tuple[np.ndarray, int]:
    """Decodes one RowSet that starts at byte `pos`; returns (ranges, offset just past its END)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    if pos >= buf.size:
        raise ProtocolError(f"row set: no data at offset {pos} (input has {buf.size} bytes; missing END)")
    if buf.size - pos <= _SMALL_INPUT:
        values, end = _scan_commands(buf, pos)
    elif buf.size - pos <= _HEADER_SCAN_INPUT:
        values, end = _scan_headers(buf, pos)
    else:
        values, end = _decode_commands_vectorized(buf, pos)
    return _deltas_to_ranges(values), end


def _command_info() -> tuple[Optional[tuple[int, int]], ...]:
    """Per command byte: (element size, 0 for OFFSET; value width in bytes), None when invalid."""
    out: list[Optional[tuple[int, int]]] = []
    for cmd in range(256):
        kind, w = cmd & 0xF8, int(_WIDTH_BYTES[cmd & 0x07])
        elem = {OFFSET: 0, SHORT_ARRAY: 2, BYTE_ARRAY: 1}.get(kind)
        out.append(None if w == 0 or elem is None else (elem, w))
    return tuple(out)


_COMMAND_INFO = _command_info()


_OFFSET_SIZE = tuple(1 + info[1] if info is not None and info[0] == 0 else 0 for info in _COMMAND_INFO)
_SHORT_COUNT_ELEM = tuple(info[0] if info is not None and info[0] and info[1] == 1 else 0 for info in _COMMAND_INFO)
# per command byte: header bytes before its first value, each value's width, bytes between values
_FIRST_VALUE = np.array([1 if info is None or not info[0] else 1 + info[1] for info in _COMMAND_INFO], dtype=np.int64)
_VALUE_WIDTH = np.array([1 if info is None else (info[0] or info[1]) for info in _COMMAND_INFO], dtype=np.int64)
_STRIDE = np.array([0 if info is None else info[0] for info in _COMMAND_INFO], dtype=np.int64)
_ELEM = np.array([-1 if info is None else info[0] for info in _COMMAND_INFO], dtype=np.int64)
_WIDTH = np.array([0 if info is None else info[1] for info in _COMMAND_INFO], dtype=np.int64)


def _step_table() -> list[int]:
    """Per (command byte, next byte): the bytes to the next command when the header alone says it
    (an OFFSET, or an array with a one-byte count under 128); 0 for anything else."""
    out = [0] * 65536
    for cmd in range(256):
        off = _OFFSET_SIZE[cmd]
        if off:
            out[cmd << 8:(cmd + 1) << 8] = [off] * 256
        elem = _SHORT_COUNT_ELEM[cmd]
        if elem:
            out[cmd << 8:(cmd << 8) + 128] = [2 + count * elem for count in range(128)]
    return out


def _scan_headers(buf: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """The command stream followed header by header in Python, one table lookup a command (an
    OFFSET or an array with a one-byte count: what a row set of scattered keys is made of), every
    value then read in one vectorized pass: a row set of scattered keys is a few hundred commands
    over a few kilobytes, which this reads several times faster than the pointer doubling of
    `_decode_commands_vectorized` (O(bytes x log commands)). Anything unusual (a bad byte, a
    command past the end) is read again by `_scan_headers_checked`, which names the fault."""
    data = buf.tobytes() + b"\x00"
    n = buf.size
    step = _STEP
    heads: list[int] = []
    head = heads.append
    p = pos
    try:
        while True:
            s = step[(data[p] << 8) | data[p + 1]]
            if s:
                head(p)
                p += s
                continue
            cmd = data[p]
            if cmd == END and p < n:
                break
            got = _COMMAND_INFO[cmd]
            if got is None or p >= n:
                return _scan_headers_checked(buf, pos)
            elem, w = got   # an array with a wider count
            v = int.from_bytes(data[p + 1:p + 1 + w], "little", signed=True)
            if v < 0 or p + 1 + w + v * elem > n:
                return _scan_headers_checked(buf, pos)
            head(p)
            p += 1 + w + v * elem
    except IndexError:   # ran past the end
        return _scan_headers_checked(buf, pos)
    heads.append(p)
    bounds = np.array(heads, dtype=np.int64)
    at = bounds[:-1]
    cmds = buf[at]
    # each command's values from its length: after `_FIRST_VALUE` header bytes, values of
    # `_VALUE_WIDTH` bytes each, `_STRIDE` bytes apart (0 for an OFFSET's one value)
    first, width, stride = _FIRST_VALUE[cmds], _VALUE_WIDTH[cmds], _STRIDE[cmds]
    nvals = (bounds[1:] - at - first) // width
    cmd_of = np.repeat(np.arange(at.size, dtype=np.int64), nvals)
    base = at + first - (np.cumsum(nvals) - nvals) * stride
    where = base[cmd_of] + np.arange(cmd_of.size, dtype=np.int64) * stride[cmd_of]
    return _read_values(buf, where, width[cmd_of]), p + 1


def _scan_headers_checked(buf: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """`_scan_headers` step by step, each command checked as it is read: the same values, and
    for a malformed row set the error that names what is wrong."""
    data = buf.tobytes()
    n = len(data)
    p = pos
    skip = _OFFSET_SIZE
    short_count = _SHORT_COUNT_ELEM
    heads: list[int] = []
    head = heads.append
    arrays: list[int] = []   # per array: its index among the commands, then its count
    while True:
        if p >= n:
            if heads and p > n:
                raise ProtocolError(f"row set: truncated command 0x{data[heads[-1]]:02x} at offset {heads[-1]}")
            raise ProtocolError(f"row set: truncated, no END command (ran out of bytes at offset {p})")
        cmd = data[p]
        s = skip[cmd]
        if s:                      # an OFFSET
            head(p)
            p += s
            continue
        e = short_count[cmd]
        if e and p + 1 < n and data[p + 1] < 128:   # an array with a one-byte count
            v = data[p + 1]
            q = p + 2 + v * e
            if q > n:
                raise ProtocolError(f"row set: array of {v} values at offset {p} runs past the end of the input")
            arrays += (len(heads), v)
            head(p)
            p = q
            continue
        if cmd == END:
            break
        got = _COMMAND_INFO[cmd]
        if got is None:
            raise ProtocolError(f"row set: bad command byte 0x{cmd:02x} at offset {p}")
        elem, w = got
        q = p + 1 + w
        if q > n:
            raise ProtocolError(f"row set: truncated command 0x{cmd:02x} at offset {p}")
        v = int.from_bytes(data[p + 1:q], "little", signed=True)
        if v < 0:
            raise ProtocolError(f"row set: negative array length {v} at offset {p}")
        if q + v * elem > n:
            raise ProtocolError(f"row set: array of {v} values at offset {p} runs past the end of the input")
        arrays += (len(heads), v)
        head(p)
        p = q + v * elem
    end = p + 1
    at = np.array(heads, dtype=np.int64)
    cmds = buf[at]
    count = np.zeros(at.size, dtype=np.int64)
    if arrays:
        a = np.array(arrays, dtype=np.int64)
        count[a[0::2]] = a[1::2]
    return _command_values(buf, at, _ELEM[cmds], _WIDTH[cmds], count), end


_STEP = _step_table()


_BYTE_STEPS = np.arange(8, dtype=np.int64)
_LOW_BITS = np.array([0] + [(1 << (8 * w)) - 1 for w in range(1, 8)] + [(1 << 64) - 1], dtype=np.uint64)
_SIGN_BIT = np.array([0] + [1 << (8 * w - 1) for w in range(1, 9)], dtype=np.uint64)


def _read_values(buf: np.ndarray, at: np.ndarray, width: np.ndarray) -> np.ndarray:
    """The signed little-endian integers of `width[i]` bytes (1 to 8) at byte `at[i]` of `buf`,
    in one gather: the eight bytes at each (a window over the bytes, one byte apart), then cut to
    the width and sign-extended."""
    if at.size == 0:
        return np.zeros(0, dtype=np.int64)
    padded = np.concatenate((buf, np.zeros(8, dtype=np.uint8)))
    window = np.ndarray(shape=(buf.size,), dtype="<u8", buffer=padded, strides=(1,))
    raw = window[at] & _LOW_BITS[width]
    sign = _SIGN_BIT[width]
    out: np.ndarray = ((raw ^ sign) - sign).view(np.int64)
    return out


def _read_le(buf: np.ndarray, p: int, nbytes: int) -> int:
    return int.from_bytes(buf[p:p + nbytes].tobytes(), "little", signed=True)


def _scan_commands(buf: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    """Direct scan of the command stream; for small inputs."""
    n = buf.size
    p = pos
    out: list[np.ndarray] = []
    while True:
        if p >= n:
            raise ProtocolError(f"row set: truncated, no END command (ran out of bytes at offset {p})")
        cmd = int(buf[p])
        if cmd == END:
            return (np.concatenate(out) if out else np.zeros(0, dtype=np.int64)), p + 1
        kind, wcode = cmd & 0xF8, cmd & 0x07
        w = int(_WIDTH_BYTES[wcode])
        if w == 0 or kind not in (OFFSET, SHORT_ARRAY, BYTE_ARRAY):
            raise ProtocolError(f"row set: bad command byte 0x{cmd:02x} at offset {p}")
        if p + 1 + w > n:
            raise ProtocolError(f"row set: truncated command 0x{cmd:02x} at offset {p}")
        v = _read_le(buf, p + 1, w)
        p += 1 + w
        if kind == OFFSET:
            out.append(np.array([v], dtype=np.int64))
            continue
        if v < 0:
            raise ProtocolError(f"row set: negative array length {v} at offset {p - 1 - w}")
        elem = 2 if kind == SHORT_ARRAY else 1
        if p + v * elem > n:
            raise ProtocolError(f"row set: array of {v} values at offset {p - 1 - w} runs past the end of the input")
        dt = "<i2" if elem == 2 else "i1"
        out.append(np.frombuffer(buf[p:p + v * elem].tobytes(), dtype=dt).astype(np.int64))
        p += v * elem


def _command_values(buf: np.ndarray, at: np.ndarray, elem: np.ndarray, width: np.ndarray,
                    count: np.ndarray) -> np.ndarray:
    """The values of a row set's commands (headers at bytes `at`), in command order: an OFFSET
    (`elem` 0) has one value of `width` bytes after its header; an array has `count` values of
    `elem` bytes each after its header and its count (`width` bytes). Read in one gather."""
    is_array = elem > 0
    if not is_array.any():
        return _read_values(buf, at + 1, width)
    nvals = np.where(is_array, count, 1)
    cmd_of = np.repeat(np.arange(at.size, dtype=np.int64), nvals)
    # value i of the whole row set is at byte base + i * step of its command: an array's step is
    # its element size and its base folds in how many values come before it; an OFFSET's step is 0
    step = np.where(is_array, elem, 0)
    base = at + 1 + np.where(is_array, width, 0) - (np.cumsum(nvals) - nvals) * step
    pos = base[cmd_of] + np.arange(cmd_of.size, dtype=np.int64) * step[cmd_of]
    return _read_values(buf, pos, np.where(is_array, elem, width)[cmd_of])


def _gather_le(buf_padded: np.ndarray, positions: np.ndarray, nbytes: int) -> np.ndarray:
    """Reads signed little-endian integers of `nbytes` bytes at each position (buffer padded by 8)."""
    if positions.size == 0:
        return np.zeros(0, dtype=np.int64)
    raw = buf_padded[positions[:, None] + np.arange(nbytes, dtype=np.int64)]
    dt = {1: "i1", 2: "<i2", 4: "<i4", 8: "<i8"}[nbytes]
    return np.ascontiguousarray(raw).view(dt).ravel().astype(np.int64)


def _decode_commands_vectorized(buf: np.ndarray, pos: int) -> tuple[np.ndarray, int]:
    n = buf.size
    padded = np.concatenate((buf, np.zeros(8, dtype=np.uint8)))
    p = np.arange(n, dtype=np.int64)
    cmd = buf.astype(np.int64)
    kind = cmd & 0xF8
    wbytes = _WIDTH_BYTES[cmd & 0x07]
    valid = (wbytes > 0) & ((kind == OFFSET) | (kind == SHORT_ARRAY) | (kind == BYTE_ARRAY))
    # the value that follows each possible header (offset value, or array count), for every width
    val = np.zeros(n, dtype=np.int64)
    for nb in (1, 2, 4, 8):
        sel = valid & (wbytes == nb)
        if sel.any():
            val[sel] = _gather_le(padded, p[sel] + 1, nb)
    elem = np.where(kind == SHORT_ARRAY, 2, np.where(kind == BYTE_ARRAY, 1, 0))
    count = np.where(kind == OFFSET, 0, val)
    bad_count = (kind != OFFSET) & (count < 0)
    # a huge count must not overflow the next-position arithmetic
    count = np.clip(count, 0, n)
    size = 1 + wbytes + count * elem
    stop = ~valid | bad_count | (cmd == END)
    nxt = np.where(stop, n, np.minimum(p + size, n))
    nxt = np.append(nxt, n)  # sentinel position n points to itself

    # pointer doubling: every position reachable from `pos` by following `nxt`
    on_path = np.zeros(n + 1, dtype=bool)
    on_path[pos] = True
    jump = nxt
    reach = np.array([pos], dtype=np.int64)
    while True:
        hop = jump[reach]
        fresh = hop[~on_path[hop]]
        on_path[fresh] = True
        reach = np.flatnonzero(on_path[:n])
        if jump[pos] == n:
            break
        jump = jump[jump]
    cmds = np.flatnonzero(on_path[:n])
    cmds = cmds[cmds >= pos]
    last = int(cmds[-1])
    last_cmd = int(buf[last])
    if last_cmd != END:
        if not valid[last]:
            raise ProtocolError(f"row set: bad command byte 0x{last_cmd:02x} at offset {last}")
        if bad_count[last]:
            raise ProtocolError(f"row set: negative array length {int(val[last])} at offset {last}")
        raise ProtocolError(f"row set: truncated command 0x{last_cmd:02x} at offset {last} (no END)")
    body = cmds[:-1]
    if body.size and int(body[-1] + size[body[-1]]) > n:
        raise ProtocolError(f"row set: truncated command at offset {int(body[-1])}")
    return _command_values(buf, body, elem[body], wbytes[body], count[body]), last + 1


def _deltas_to_ranges(v: np.ndarray) -> np.ndarray:
    if v.size == 0:
        empty: np.ndarray = EMPTY_RANGES.copy()
        return empty
    # the usual cases in a few numpy calls (a message carries several row sets); anything
    # unusual goes the checked way below, which names what is wrong
    if v[0] >= 0 and (v.size == 1 or v[1:].min() > 0):  # starts only: scattered keys, each a delta
        if float(v.sum(dtype=np.float64)) < 9.2e18:           # from the one before
            return _runs(np.cumsum(v), np.flatnonzero(v[1:] != 1))
        return _deltas_to_ranges_checked(v)
    neg = v < 0
    mag = np.abs(v)
    if not neg[0] and mag[0] >= 0 and (v.size == 1 or (
            not (neg[1:] & neg[:-1]).any() and mag[1:].min() > 0 and float(mag.sum(dtype=np.float64)) < 9.2e18)):
        absval = np.cumsum(mag)
        ends = absval.copy()
        closing = neg[1:]
        ends[:-1][closing] = absval[1:][closing]
        opening = ~neg
        st, en = absval[opening], ends[opening]
        if st.size > 1:
            adjacent = st[1:] - en[:-1] == 1
            if adjacent.any():  # ranges that touch are one range
                st = st[np.concatenate(([True], ~adjacent))]
                en = en[np.concatenate((~adjacent, [True]))]
        return np.stack((st, en), axis=1)
    return _deltas_to_ranges_checked(v)


def _deltas_to_ranges_checked(v: np.ndarray) -> np.ndarray:
    if np.any(v == np.iinfo(np.int64).min):
        raise ProtocolError("row set: delta out of range (-2^63)")
    neg = v < 0
    if neg[0]:
        raise ProtocolError("row set: range end without a range start (first delta is negative)")
    if np.any(neg[1:] & neg[:-1]):
        i = int(np.flatnonzero(neg[1:] & neg[:-1])[0]) + 1
        raise ProtocolError(f"row set: range end without a range start (delta #{i})")
    mag = np.abs(v)
    if mag.size > 1 and np.any(mag[1:] == 0):
        i = int(np.flatnonzero(mag[1:] == 0)[0]) + 1
        raise ProtocolError(f"row set: zero delta at #{i} (values must be strictly ascending)")
    with np.errstate(over="ignore"):
        absval = np.cumsum(mag)
    if np.any(absval < 0) or (absval.size > 1 and np.any(np.diff(absval) <= 0)):
        raise ProtocolError("row set: values overflow int64")
    starts_i = np.flatnonzero(~neg)
    ends_i = starts_i.copy()
    nxt = starts_i + 1
    closes = nxt < v.size
    closes[closes] = neg[nxt[closes]]
    ends_i[closes] = nxt[closes]
    r = np.stack((absval[starts_i], absval[ends_i]), axis=1)
    return normalize_ranges(r)


# ----------------------------------------------------------------------------------------------
# shift data
# ----------------------------------------------------------------------------------------------

def encode_shifts(starts: npt.ArrayLike, ends: npt.ArrayLike, dests: npt.ArrayLike) -> bytes:
    """Encodes RowSetShiftData: RowSet(starts) + RowSet(ends) + RowSet(dests) (docs/rowsets.md#shift-data).

    Each shift i moves keys [starts[i], ends[i]] to start at dests[i]. A negative shift whose
    start lies below -delta is clamped so that no destination is negative, as Deephaven does.
    """
    s = np.asarray(starts, dtype=np.int64).ravel()
    e = np.asarray(ends, dtype=np.int64).ravel()
    t = np.asarray(dests, dtype=np.int64).ravel()
    if not (s.size == e.size == t.size):
        raise ValueError(f"shift arrays differ in length: {s.size} starts, {e.size} ends, {t.size} dests")
    if s.size == 0:
        return NO_SHIFTS_BYTES
    delta = t - s
    if np.any(delta == 0):
        raise ValueError("a shift must move its keys (delta 0)")
    clamp = (delta < 0) & (s < -delta)
    if clamp.any():
        s = s.copy()
        s[clamp] = -delta[clamp]
        t = s + delta
    if np.any(e < s):
        i = int(np.flatnonzero(e < s)[0])
        raise ValueError(f"shift {i}: range [{int(s[i])}, {int(e[i])}] is empty (every key would become negative)")
    return encode_rowset(keys_to_ranges(s)) + encode_rowset(keys_to_ranges(e)) + encode_rowset(keys_to_ranges(t))


def decode_shifts(data: BytesLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Decodes shift data into (starts, ends, dests), 1-D int64 arrays of equal length."""
    mv = memoryview(data)
    rs, p = decode_rowset_at(mv, 0)
    re_, p = decode_rowset_at(mv, p)
    rd, p = decode_rowset_at(mv, p)
    if p != len(mv):
        raise ProtocolError(f"shift data: {len(mv) - p} unexpected byte(s) after the third row set")
    s, e, d = ranges_to_keys(rs), ranges_to_keys(re_), ranges_to_keys(rd)
    if not (s.size == e.size == d.size):
        raise ProtocolError(f"shift data: row sets differ in size ({s.size} starts, {e.size} ends, {d.size} dests)")
    if np.any(e < s):
        i = int(np.flatnonzero(e < s)[0])
        raise ProtocolError(f"shift data: shift {i} ends at {int(e[i])} before its start {int(s[i])}")
    return s, e, d


# ----------------------------------------------------------------------------------------------
# column bitsets
# ----------------------------------------------------------------------------------------------

def encode_bitset(indices: npt.ArrayLike) -> bytes:
    """Column indices -> Java BitSet.toByteArray bytes: LSB first, no trailing zero bytes."""
    idx = np.asarray(indices, dtype=np.int64).ravel()
    if idx.size == 0:
        return b""
    if idx.min() < 0:
        raise ValueError(f"column index must be non-negative, got {int(idx.min())}")
    bits = np.zeros(int(idx.max()) + 1, dtype=np.uint8)
    bits[idx] = 1
    return np.packbits(bits, bitorder="little").tobytes()


def decode_bitset(data: BytesLike) -> np.ndarray:
    """BitSet bytes -> ascending 1-D int64 array of the set bit indices."""
    b = np.frombuffer(data, dtype=np.uint8)
    return np.flatnonzero(np.unpackbits(b, bitorder="little")).astype(np.int64)
