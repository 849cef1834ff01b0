"""Ordered row-key spaces for derived tables: sort keys as words, and a gapped ordered index.

`SortKeys` turns the sort columns of a batch of rows into a few uint64 *words* per row whose
lexicographic order is the sort order (ascending or descending per column, nulls first when
ascending as in Deephaven, NaN after every number), followed by the row's parent row key as the
last word, so that equal values keep their parent order and every row's words are distinct.

`OrderIndex` keeps elements (word tuples) in order in a *gapped array*: the element at slot ``i``
has key ``base + i``, so keys follow the order, and free slots between neighbours are free keys
into which later elements go without moving anyone. Each free slot holds a copy of the words of
the element after it (and that element's key in `src`), so every word array is non-decreasing
over the occupied region and a batch of elements is located with `np.searchsorted` (ties in the
first word are resolved by a vectorised binary search on the next words). When a gap is too small,
a window of neighbours around it is re-spread evenly (it grows until its density is at most one
half, as in a packed-memory array); the elements of the window that move are reported as moves,
which a sorted table turns into shifts. New elements go right after the element before them
(the next rows of a run of equal values come after them), so an insert rewrites only the free
slots just before it. Costs: locating m elements is O(m log n) in C; inserting costs O(m) plus the
windows it re-spreads; deleting costs the gaps before the deleted elements.

A binary search of a large index (tens of millions of slots, a join's members on a 10M-row table)
misses the cache at nearly every step, so that a cycle's few hundred searches cost more than the
rest of its work. An index of `local_first` slots or more also keeps a *fence*, the words of every
FENCE-th slot, small enough to stay in the caches: a search goes through the fence to two samples
and then halves the FENCE slots between them. The element before a deleted one is looked for among
the few slots just before it (the free slots there copy the deleted one's key) before any search.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tickwire.server.engine.errors import OperationError
from tickwire.server.engine.graph.arrays import unique
from tickwire.server.engine.graph.keymap import KeyMap

__all__ = ["SortKeys", "OrderIndex", "NONE_LO", "NONE_HI"]

NONE_LO = -1                              # "no element before"
NONE_HI = int(np.iinfo(np.int64).max)     # "no element after"
_SIGN = np.uint64(1 << 63)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
MAX_STRING_WORDS = 8   # strings order exactly on their first 64 bytes, then by length


# ----------------------------------------------------------------------------------------------
# sort keys
# ----------------------------------------------------------------------------------------------

def _valid(a: pa.Array) -> np.ndarray:
    if a.null_count == 0:
        return np.ones(len(a), dtype=bool)
    valid: np.ndarray = a.is_valid().to_numpy(zero_copy_only=False)
    return valid


def _fixed_storage(a: pa.Array) -> np.ndarray:
    """Values of a fixed-width array as a numpy array of its storage integers or floats."""
    t = a.type
    if pa.types.is_temporal(t):
        a = a.view(pa.int32() if t.bit_width == 32 else pa.int64())
    if a.null_count:
        a = a.fill_null(pa.scalar(0, a.type))
    values: np.ndarray = a.to_numpy(zero_copy_only=False)
    return values


def _string_bytes(a: pa.Array, words: int) -> tuple[np.ndarray, np.ndarray]:
    """The first 8*words bytes of each value as big-endian words (zero padded), and the lengths."""
    n = len(a)
    large = pa.types.is_large_string(a.type) or pa.types.is_large_binary(a.type)
    bufs = a.buffers()
    off = np.frombuffer(bufs[1], dtype=np.int64 if large else np.int32, count=n + 1,
                        offset=a.offset * (8 if large else 4)).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    lengths = np.diff(off)
    valid = _valid(a)
    take = np.where(valid, np.minimum(lengths, 8 * words), 0)
    mat = np.zeros((n, 8 * words), dtype=np.uint8)
    total = int(take.sum())
    if total:
        starts = np.cumsum(take) - take
        within = np.arange(total, dtype=np.int64) - np.repeat(starts, take)
        rows = np.repeat(np.arange(n, dtype=np.int64), take)
        mat[rows, within] = data[np.repeat(off[:-1], take) + within]
    w = mat.view(">u8").reshape(n, words).astype(np.uint64)
    return w, np.where(valid, lengths, -1)


def _is_string(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
                or pa.types.is_large_binary(t))


def check_sortable(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return check_sortable(t.value_type)
    return (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
            or pa.types.is_temporal(t) or _is_string(t))


class SortKeys:
    """Encodes sort columns as words. `words_per_column` is fixed per type except for strings and
    binaries, whose word count grows (up to MAX_STRING_WORDS) when longer values arrive; `grow`
    reports it so the owner can re-encode its elements (their order does not change)."""

    def __init__(self, schema: pa.Schema, columns: Sequence[str], descending: Sequence[bool]):
        self.columns = list(columns)
        self.descending = [bool(d) for d in descending]
        self.types = []
        for c in self.columns:
            t = schema.field(c).type
            if not check_sortable(t):
                raise OperationError(f"cannot sort on column {c!r} of type {t} (numbers, booleans, temporal "
                                f"types, strings and binaries can be sorted)")
            self.types.append(t)
        self.string_words = [1 if _is_string(t.value_type if pa.types.is_dictionary(t) else t) else 0
                             for t in self.types]

    @property
    def nwords(self) -> int:
        """Words per row, the parent row key included."""
        return 1 + sum(self._column_words(i) for i in range(len(self.columns)))

    def _column_words(self, i: int) -> int:
        t = self.types[i]
        if self.string_words[i]:
            return self.string_words[i] + 1
        if pa.types.is_uint64(t):
            return 2
        return 1

    def needs_more_words(self, values: pa.Table) -> bool:
        """Widens the string word counts for `values`; True when some count grew."""
        grew = False
        for i, c in enumerate(self.columns):
            if not self.string_words[i] or self.string_words[i] >= MAX_STRING_WORDS:
                continue
            a = values.column(c).combine_chunks()
            if pa.types.is_dictionary(a.type):
                a = a.dictionary_decode()
            if len(a) == 0:
                continue
            longest = pa.compute.max(pa.compute.binary_length(a)).as_py() or 0
            need = min(MAX_STRING_WORDS, max(1, -(-longest // 8)))
            if need > self.string_words[i]:
                self.string_words[i] = need
                grew = True
        return grew

    def encode(self, values: pa.Table, row_keys: np.ndarray) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for i, c in enumerate(self.columns):
            a = values.column(c).combine_chunks()
            if pa.types.is_dictionary(a.type):
                a = a.dictionary_decode()
            words = self._encode_column(i, a)
            if self.descending[i]:
                words = [~w for w in words]
            out.extend(words)
        out.append(np.asarray(row_keys, dtype=np.int64).astype(np.uint64))
        return out

    def _encode_column(self, i: int, a: pa.Array) -> list[np.ndarray]:
        t = a.type
        valid = _valid(a)
        if _is_string(t):
            w, lengths = _string_bytes(a, self.string_words[i])
            return [w[:, j].copy() for j in range(w.shape[1])] + [(lengths + 1).astype(np.uint64)]
        if pa.types.is_boolean(t):
            v = a.fill_null(False).to_numpy(zero_copy_only=False).astype(np.uint64) + np.uint64(1)
            v[~valid] = 0
            return [v]
        if pa.types.is_floating(t):
            f = a.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False) + 0.0  # -0.0 -> 0.0
            bits = f.view(np.uint64)
            code = np.where(bits & _SIGN, ~bits, bits | _SIGN)
            code[np.isnan(f)] = _ALL
            code[~valid] = 0
            return [code]
        v = _fixed_storage(a)
        if pa.types.is_unsigned_integer(t):
            if pa.types.is_uint64(t):
                return [valid.astype(np.uint64), v.astype(np.uint64)]
            code = v.astype(np.uint64) + np.uint64(1)
        else:
            # signed integers and temporal values; null is the minimum (as Deephaven's null sentinel)
            code = v.astype(np.int64).view(np.uint64) ^ _SIGN
        code[~valid] = 0
        return [code]


# ----------------------------------------------------------------------------------------------
# the gapped ordered index
# ----------------------------------------------------------------------------------------------

def _lex_greater(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """Row-wise a > b over word lists (lexicographic)."""
    gt = np.zeros(a[0].size, dtype=bool)
    eq = np.ones(a[0].size, dtype=bool)
    for x, y in zip(a, b):
        gt |= eq & (x > y)
        eq &= x == y
    return gt


def _after_every_tie(rest: list[np.ndarray]) -> np.ndarray:
    """Per query, given its words after the first: whether they are all the largest value, so
    that it sorts after every element tied with it on the first word (as the ends of groups are
    asked for)."""
    top = np.ones(rest[0].size, dtype=bool)
    for w in rest:
        top &= w == _U64_TOP
    return top


def _halve(a: np.ndarray, b: np.ndarray, greater: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """For ranges [a[i], b[i]) over which `greater` (of an array of indexes) is false and then
    true: the first index of each at which it is true (b[i] where it never is), by halving them
    all at once."""
    while True:
        go = a < b
        if not go.any():
            return a
        mid = (a + b) // 2
        gt = greater(mid)
        b = np.where(go & gt, mid, b)
        a = np.where(go & ~gt, mid + 1, a)


def _lex_not_greater(a: list[np.ndarray], b: list[np.ndarray]) -> np.ndarray:
    """Row-wise a <= b over word lists (lexicographic)."""
    if len(a) == 2:
        le: np.ndarray = (a[0] < b[0]) | ((a[0] == b[0]) & (a[1] <= b[1]))
        return le
    return ~_lex_greater(a, b)


def _lift(a: np.ndarray, b: np.ndarray, width: int, W: list[np.ndarray], q: list[np.ndarray]) -> np.ndarray:
    """For ranges [a[i], b[i]) of at most `width` slots of W (word arrays, non-decreasing over
    each range): the first index of each whose words are greater than query i's (b[i] where none
    is). Binary lifting from a - 1 in the same power-of-two steps for every range, which takes
    half the numpy calls of a halving (`_halve`) per step."""
    base = a - 1
    top = W[0].size - 1
    step = 1 << max(0, int(width).bit_length() - 1)
    while step:
        cand = base + step
        at = np.minimum(cand, top)
        base = np.where(_lex_not_greater([w[at] for w in W], q) & (cand < b), cand, base)
        step >>= 1
    out: np.ndarray = base + 1
    return out


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated aranges: (values, owner index) for ranges [starts[i], starts[i] + lengths[i])."""
    lengths = np.maximum(lengths, 0)
    total = int(lengths.sum())
    owner = np.repeat(np.arange(starts.size), lengths)
    first = np.cumsum(lengths) - lengths
    vals = np.arange(total, dtype=np.int64) - np.repeat(first, lengths) + np.repeat(starts, lengths)
    return vals, owner


_U64_TOP = np.uint64(0xFFFFFFFFFFFFFFFF)

#: the budget of the indexes of a group's members (agg_by, last_by, head_by, joins): their keys
#: are never a table's row keys, so a re-spread costs only its own work, not shifts sent to
#: subscribers as a sort's does; a quarter of a sort's budget keeps them at about a quarter of the
#: memory for tables of 16,000 to 1,000,000 rows (100,000 rows: 8 keys a member instead of 32)
MEMBERS_BUDGET = 1 << 20
#: and at most 8 keys a member, so that a small table's members do not take the budget's megabytes
MEMBERS_MAX_SPACING = 8
#: an index that re-lays itself does so when its arrays hold more than SPARSE times the slots its
#: elements take at its spacing (and SPARSE_SLACK more): rows that come at the end of their groups
#: while the groups' first rows go (a last_by of a ring table) make its region drift and thin out,
#: and a table that shrank leaves its arrays at their largest
SPARSE = 2
SPARSE_SLACK = 8192

_NEAR = 8  # slots a look near a known key reads before it searches
FENCE = 256  # slots per sample of a large index's fence (see OrderIndex._fenced_search)


class OrderIndex:
    """Elements (word tuples; the last word is a unique id) in order, with keys that follow the
    order. See the module docstring."""

    CENTER = 1 << 62
    reserve = 2  # free shares left after a batch that crowded its gap, per element of the batch

    budget = 1 << 22   # slots an adaptive index spreads over before its spacing falls to the minimum
    min_spacing = 4
    max_spacing = 64
    #: slots from which an index keeps a fence for its searches and finds the element before a
    #: deleted one among the slots just before it (below, its arrays stay in the caches, where a
    #: plain binary search is cheaper)
    local_first = 1 << 22
    #: re-lays its elements when its arrays hold more than SPARSE times the slots its spacing gives
    #: its elements (`members`: keys nobody keeps between calls, so nothing is told of the move)
    relays = False
    #: layouts made afresh (`build`, and so every re-lay): each changes every element's key, as
    #: the moves an insert returns do not say
    layouts = 0

    def __init__(self, nwords: int, spacing: Optional[int] = None, budget: Optional[int] = None,
                 members: bool = False):
        if nwords < 1:
            raise ValueError("an order index needs at least one word")
        if spacing is not None and spacing < 2:
            raise ValueError("spacing must be at least 2")
        if budget is not None:   # an index whose keys nobody sees (MEMBERS_BUDGET) spreads less
            self.budget = int(budget)
        if members:
            self.relays = True
            self.max_spacing = MEMBERS_MAX_SPACING
        self.K = nwords
        self.fixed_spacing = None if spacing is None else int(spacing)
        self.W = [np.zeros(0, dtype=np.uint64) for _ in range(nwords)]
        self.src = np.zeros(0, dtype=np.int64)
        self.base = self.CENTER
        self.lo = 0        # slots of the first and last element (lo > hi: empty)
        self.hi = -1
        self.n = 0
        self.ids = KeyMap()  # element id (last word) -> key
        self.F: Optional[list[np.ndarray]] = None  # the fence of a large index: W[k][::FENCE]

    # -- basic ----------------------------------------------------------------------------------
    @property
    def spacing(self) -> int:
        """Keys per element when elements are laid out (new ends, re-spread windows): fixed, or
        the largest power of two (4 to 64) that keeps the index within `budget` slots, so small
        tables get wide gaps and large ones stay compact."""
        if self.fixed_spacing is not None:
            return self.fixed_spacing
        room = self.budget // max(self.n, 1)
        s = self.max_spacing
        while s > self.min_spacing and s > room:
            s //= 2
        return s

    def __len__(self) -> int:
        return self.n

    @property
    def cap(self) -> int:
        return int(self.src.size)

    def first_key(self) -> int:
        return self.lo + self.base

    def last_key(self) -> int:
        return self.hi + self.base

    def key_of(self, ids: npt.ArrayLike) -> np.ndarray:
        """Key of each element id (-1 where absent)."""
        return self.ids.get(ids)

    def words_at(self, keys: np.ndarray) -> list[np.ndarray]:
        slots = np.asarray(keys, dtype=np.int64) - self.base
        return [w[slots] for w in self.W]

    def word_at(self, k: int, keys: np.ndarray) -> np.ndarray:
        """Word `k` of the element at each key."""
        return self.W[k][np.asarray(keys, dtype=np.int64) - self.base]

    def id_at(self, keys: np.ndarray) -> np.ndarray:
        """Element id at each key (keys must be element keys)."""
        return self.W[-1][np.asarray(keys, dtype=np.int64) - self.base].astype(np.int64)

    def keys(self) -> np.ndarray:
        """Every element key, ascending (O(size of the occupied region))."""
        if self.n == 0:
            return np.zeros(0, dtype=np.int64)
        s = self.src[self.lo:self.hi + 1]
        real = s == np.arange(self.lo, self.hi + 1, dtype=np.int64) + self.base
        keys: np.ndarray = s[real]
        return keys

    def first_keys(self, count: int) -> np.ndarray:
        """The first `count` element keys (cost follows `count` and the gaps between them)."""
        return self._scan(count, front=True)

    def last_keys(self, count: int) -> np.ndarray:
        return self._scan(count, front=False)

    def _scan(self, count: int, front: bool) -> np.ndarray:
        count = min(int(count), self.n)
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        width = 2 * self.spacing * count + 16
        while True:
            if front:
                a, b = self.lo, min(self.hi, self.lo + width - 1)
            else:
                a, b = max(self.lo, self.hi - width + 1), self.hi
            s = self.src[a:b + 1]
            real: np.ndarray = s[s == np.arange(a, b + 1, dtype=np.int64) + self.base]
            if real.size >= count or (a == self.lo and b == self.hi):
                return real[:count] if front else real[real.size - count:]
            width *= 4

    def keys_between(self, first: np.ndarray, last: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The element keys in each key range [first[i], last[i]] (ascending within a range), and
        the range of each (its index i). Costs the total width of the ranges."""
        first = np.asarray(first, dtype=np.int64)
        last = np.asarray(last, dtype=np.int64)
        width = np.maximum(last - first + 1, 0)
        total = int(width.sum())
        if total == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        ends = np.cumsum(width)
        # every key of the ranges, one after another: one repeat of each range's shift
        keys = np.repeat(first - (ends - width), width) + np.arange(total, dtype=np.int64)
        real = np.flatnonzero(self.src[keys - self.base] == keys)
        # the range of each element: found for the elements only (a fraction of the keys spanned)
        return keys[real], np.searchsorted(ends, real, side="right")

    def after(self, keys: np.ndarray) -> np.ndarray:
        """Key of the first element after each key (NONE_HI when none)."""
        return self._nxt(np.asarray(keys, dtype=np.int64) + 1)

    # -- search ---------------------------------------------------------------------------------
    def _nxt(self, keys: np.ndarray) -> np.ndarray:
        """Key of the first element at or after each key (NONE_HI when none)."""
        keys = np.asarray(keys, dtype=np.int64)
        out = np.full(keys.size, NONE_HI, dtype=np.int64)
        if self.n == 0:
            return out
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        below = keys <= lo_k
        out[below] = lo_k
        mid = ~below & (keys <= hi_k)
        if mid.any():
            out[mid] = self.src[keys[mid] - self.base]
        return out

    def _prv(self, keys: np.ndarray) -> np.ndarray:
        """Key of the last element at or before each key (NONE_LO when none)."""
        keys = np.asarray(keys, dtype=np.int64)
        out = np.full(keys.size, NONE_LO, dtype=np.int64)
        if self.n == 0:
            return out
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        above = keys >= hi_k
        out[above] = hi_k
        mid = ~above & (keys >= lo_k)
        if mid.any():
            # the last slot whose element-after is at or before the key is that element
            idx = np.searchsorted(self.src[self.lo:self.hi + 1], keys[mid], side="right") - 1
            out[mid] = self.lo + idx + self.base
        return out

    def locate(self, q: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """For word tuples not in the index: keys of the element before and after each
        (NONE_LO / NONE_HI when there is none)."""
        m = q[0].size
        if self.n == 0:
            return np.full(m, NONE_LO, dtype=np.int64), np.full(m, NONE_HI, dtype=np.int64)
        lo, hi = self.lo, self.hi
        fenced = self._fenced_search(q) if self.F is not None and self._fence_pays(q) else None
        res = fenced if fenced is not None else self._search(q)
        # p: the first slot greater than the query. A free slot holds the words of the element
        # after it, so slot p - 1 (not greater) is an element: the one before the query.
        p = lo + res
        succ = np.full(m, NONE_HI, dtype=np.int64)
        inside = p <= hi
        succ[inside] = self.src[p[inside]]
        pred = np.where(p > lo, p - 1 + self.base, NONE_LO)
        return pred, succ

    def _search(self, q: list[np.ndarray]) -> np.ndarray:
        """Index into the occupied region of the first slot greater than each query: a binary
        search of the first words, then of the next words among the slots tied on the first."""
        lo, hi = self.lo, self.hi
        w0 = self.W[0][lo:hi + 1]
        res: np.ndarray = np.searchsorted(w0, q[0], side="right")
        # queries that tie on the first word with some slot: resolve on the next words
        amb = np.flatnonzero(res > 0)
        amb = amb[w0[res[amb] - 1] == q[0][amb]]
        if amb.size and self.K > 1:
            amb = amb[~_after_every_tie([w[amb] for w in q[1:]])]
        if amb.size and self.K > 1:
            left = np.searchsorted(w0, q[0][amb], side="left")
            # first index in [left, res) whose remaining words are greater than the query's
            rest = [w[amb] for w in q[1:]]
            res[amb] = _halve(left, res[amb], lambda mid: _lex_greater(
                [w[lo + np.minimum(mid, hi - lo)] for w in self.W[1:]], rest))
        return res

    def _fence_pays(self, q: list[np.ndarray]) -> bool:
        """Whether a search through the fence is the cheaper one: its halving steps cost a fixed
        few hundred microseconds, which pays from about 16 queries that tie with elements on the
        first word, or 160 that sort after every tie (next words all the largest value, as the
        ends of groups are asked for), each of which a plain search does in one step less."""
        m = q[0].size
        if self.K == 1 or m < 16:
            return m >= 160
        n_top = int(_after_every_tie(q[1:]).sum())
        return (m - n_top) >= 16 or n_top >= 160

    def _fenced_search(self, q: list[np.ndarray]) -> Optional[np.ndarray]:
        """`_search` through the fence (the words of every FENCE-th slot): the fence is searched
        for the two samples around each query, then the FENCE - 1 slots between them (`_lift`,
        as they are the same number for every query but at the region's ends). On a large
        index a search of the whole arrays misses the cache at nearly every step; the fence is
        a 256th of their size and mostly stays in the caches. None when the region holds
        no sample."""
        assert self.F is not None
        B = FENCE
        lo, hi = self.lo, self.hi
        jl, jh = -(-lo // B), hi // B          # the samples inside the region
        if jh < jl:
            return None
        F = [f[jl:jh + 1] for f in self.F]
        c = np.searchsorted(F[0], q[0], side="right")   # samples not greater on the first word
        if self.K > 1:
            # among the samples tied with the query on the first word, the first greater
            left = np.searchsorted(F[0], q[0], side="left")
            tie = np.flatnonzero(c > left)
            if tie.size:
                rest = [w[tie] for w in q[1:]]
                c[tie] = _halve(left[tie], c[tie], lambda mid: _lex_greater(
                    [f[np.minimum(mid, F[0].size - 1)] for f in F[1:]], rest))
        # c samples are not greater than the query: the first greater slot is after the last of
        # them (or is the region's first) and at or before the next sample (or the region's end)
        a = np.where(c > 0, (jl + c - 1) * B + 1, lo) - lo
        b = np.where(c <= jh - jl, (jl + c) * B, hi + 1) - lo
        return _lift(a, b, B - 1, [w[lo:hi + 1] for w in self.W], q)

    def _refence(self, slots: Optional[np.ndarray] = None) -> None:
        """Brings the fence up to date after writes to `slots` (all slots when None); an index
        below `local_first` slots has none."""
        if slots is None:
            self.F = [w[::FENCE].copy() for w in self.W] if self.cap >= self.local_first else None
            return
        if self.F is None or slots.size == 0:
            return
        s = slots[slots % FENCE == 0]
        if s.size:
            for f, w in zip(self.F, self.W):
                f[s // FENCE] = w[s]

    def _before_elements(self, keys: np.ndarray) -> np.ndarray:
        """Key of the element before each of these element keys (NONE_LO for the first). The
        free slots before an element copy its key into `src`, so the element before it is the
        last slot before it whose `src` differs: looked for among the few slots just before
        first, as a search of a large index misses the cache at every step."""
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0 or self.cap < self.local_first:
            return self._prv(keys - 1)
        probe = (keys - self.base)[:, None] - np.arange(1, _NEAR + 1, dtype=np.int64)
        inside = probe >= self.lo
        differs = (self.src[np.maximum(probe, self.lo)] != keys[:, None]) & inside
        found = differs.any(axis=1)
        out = np.full(keys.size, NONE_LO, dtype=np.int64)
        f = np.flatnonzero(found)
        out[f] = probe[f, differs[f].argmax(axis=1)] + self.base
        # not found among them: the first element when the window passed the region's start,
        # else a wider gap, searched for
        far = np.flatnonzero(~found & inside[:, -1])
        if far.size:
            out[far] = self._prv(keys[far] - 1)
        return out

    # -- storage --------------------------------------------------------------------------------
    def _ensure(self, kmin: int, kmax: int) -> None:
        """Makes room for keys kmin..kmax (re-allocating, keys unchanged)."""
        if self.cap and kmin >= self.base and kmax < self.base + self.cap:
            return
        if self.n:
            kmin = min(kmin, self.lo + self.base)
            kmax = max(kmax, self.hi + self.base)
        span = kmax - kmin + 1
        cap = span + span // 4 + 4096
        new_base = kmin - (cap - span) // 2
        if new_base < 0:
            raise OverflowError("order index ran out of keys below")
        W = [np.zeros(cap, dtype=np.uint64) for _ in range(self.K)]
        src = np.full(cap, NONE_HI, dtype=np.int64)
        if self.n:
            a, b = self.lo, self.hi + 1
            off = self.base - new_base
            for new, old in zip(W, self.W):
                new[a + off:b + off] = old[a:b]
            src[a + off:b + off] = self.src[a:b]
            self.lo += off
            self.hi += off
        self.W, self.src, self.base = W, src, new_base
        self._refence()

    def _paint(self, first: np.ndarray, last: np.ndarray, right: np.ndarray,
               reals: np.ndarray, real_words: list[np.ndarray]) -> None:
        """Rewrites the slots of key ranges [first[i], last[i]] (ascending, disjoint): the
        elements `reals` (keys, ascending) get `real_words`, and every other slot becomes a copy
        of the first element at or after it in its range, or of `right[i]` (the element after the
        range) when there is none."""
        if reals.size:
            rs = reals - self.base
            for w, v in zip(self.W, real_words):
                w[rs] = v
            self.src[rs] = reals
            self._refence(rs)
        lengths = last - first + 1
        keys, owner = _ranges(first, lengths)
        if keys.size == 0:
            return
        # a marker per slot: its own key for an element, the range's right element at the end
        # of a range without one there; then a running minimum from the right
        marker = np.full(keys.size, NONE_HI, dtype=np.int64)
        ends = np.cumsum(lengths) - 1
        marker[ends[lengths > 0]] = right[lengths > 0]
        if reals.size:
            r = np.searchsorted(first, reals, side="right") - 1
            ok = r >= 0
            ok[ok] = reals[ok] <= last[r[ok]]
            offs = ends - lengths + 1
            marker[offs[r[ok]] + (reals[ok] - first[r[ok]])] = reals[ok]
        srck = np.minimum.accumulate(marker[::-1])[::-1]
        slots = keys - self.base
        fk = srck - self.base
        for w in self.W:
            w[slots] = w[fk]
        self.src[slots] = srck
        self._refence(slots)

    # -- building -------------------------------------------------------------------------------
    def build(self, words: list[np.ndarray]) -> np.ndarray:
        """Replaces the content with these elements; returns their keys (in input order)."""
        m = words[0].size
        OrderIndex.__init__(self, len(words), self.fixed_spacing)
        self.layouts += 1
        if m == 0:
            return np.zeros(0, dtype=np.int64)
        order = np.lexsort(words[::-1])
        self.n = m
        s = self.spacing
        keys_sorted = self.CENTER - s * (m // 2) + s * np.arange(m, dtype=np.int64)
        self._ensure(int(keys_sorted[0]), int(keys_sorted[-1]))
        sw = [w[order] for w in words]
        # every element is followed by s - 1 free slots copying the next element: written as
        # (m - 1) rows of s slots, without temporaries the size of the key span
        lo, hi = int(keys_sorted[0] - self.base), int(keys_sorted[-1] - self.base)
        for w, v in zip(self.W, sw):
            w[lo] = v[0]
            w[lo + 1:hi + 1].reshape(m - 1, s)[:] = v[1:, None]
        self.src[lo] = keys_sorted[0]
        self.src[lo + 1:hi + 1].reshape(m - 1, s)[:] = keys_sorted[1:, None]
        self.lo, self.hi = lo, hi
        self._refence()
        self.ids.set(sw[-1].astype(np.int64), keys_sorted)
        keys = np.empty(m, dtype=np.int64)
        keys[order] = keys_sorted
        return keys

    def reword(self, nwords: int, words: list[np.ndarray], keys: np.ndarray) -> None:
        """Changes the word count, given the new words of every element (at `keys`); the order of
        the elements under the new words must be the order they have."""
        order = np.argsort(keys)
        keys = np.asarray(keys, dtype=np.int64)[order]
        words = [w[order] for w in words]
        self.K = nwords
        self.W = [np.zeros(self.cap, dtype=np.uint64) for _ in range(nwords)]
        self._refence()
        if self.n:
            lo_k, hi_k = self.lo + self.base, self.hi + self.base
            self._paint(np.array([lo_k]), np.array([hi_k]), np.array([hi_k]), keys, words)

    # -- deleting -------------------------------------------------------------------------------
    def delete(self, keys: npt.ArrayLike) -> None:
        """Removes the elements at these keys."""
        keys = unique(np.asarray(keys, dtype=np.int64))
        if keys.size == 0:
            return
        ids = self.id_at(keys)
        if keys.size == self.n:
            self.ids.delete(ids)
            self.n, self.lo, self.hi = 0, 0, -1
            if self.relays:   # its arrays go too
                OrderIndex.__init__(self, self.K, self.fixed_spacing)
            self.layouts += 1
            return
        prv = self._before_elements(keys)  # the element before each deleted one
        head = np.ones(keys.size, dtype=bool)
        head[1:] = prv[1:] != keys[:-1]   # a chain of deleted neighbours starts here
        heads = np.flatnonzero(head)
        tails = np.append(heads[1:], keys.size) - 1
        pred = prv[heads]                 # chain (pred .. t] loses its elements
        t = keys[tails]
        nxt = self._nxt(t + 1)            # the element after each chain
        self.ids.delete(ids)
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        front = pred == NONE_LO
        back = nxt == NONE_HI
        inner = ~front & ~back
        if inner.any():
            # free slots copy the element after them: the chain's slots and the free slots
            # before it now copy the element after the chain
            self._paint(pred[inner] + 1, t[inner], nxt[inner], np.zeros(0, np.int64), [])
        if front.any():
            lo_k = int(nxt[front][0])
        if back.any():
            hi_k = int(pred[back][-1])
        self.lo, self.hi = lo_k - self.base, hi_k - self.base
        self.n -= keys.size
        if self._sparse():
            self._relay()

    def _relay_keeping(self, keys: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """Re-lays the index when it is sparse (`_sparse`); returns the keys of the given elements
        (-1: none) after that."""
        if not self._sparse():
            return keys
        if keys is None:
            self._relay()
            return None
        keys = np.asarray(keys, dtype=np.int64)
        known = keys >= 0
        ids = self.id_at(keys[known])
        self._relay()
        keys = keys.copy()
        keys[known] = self.key_of(ids)
        return keys

    def _sparse(self) -> bool:
        """Whether an index that re-lays itself (`members`) holds more than SPARSE times the slots
        its elements take at its spacing."""
        return self.relays and self.n > 0 and self.cap > SPARSE * self.n * self.spacing + SPARSE_SLACK

    def _relay(self) -> None:
        """Lays the elements out afresh (`build`): every element's key changes."""
        self.build(self.words_at(self.keys()))

    # -- inserting ------------------------------------------------------------------------------
    def insert(self, words: list[np.ndarray], prefer: Optional[np.ndarray] = None,
               before: Optional[np.ndarray] = None
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Adds elements (their words; ids not in the index). Returns (keys of the new elements
        in input order, old keys of elements that moved (ascending), their new keys, a flag per
        moved element that is True when an element that did not move lies between it and the
        previous moved one, and a flag per new element that is True when it got its `prefer` key).
        `prefer` gives a key per element to keep when it is free, in the element's gap, the only
        new element of that gap, and no element moves across it (else -1). `before`: the key of the
        element just before each new one when the caller knows it (else -1), which spares the
        search for it (on a large index a search misses the cache at every step)."""
        m = words[0].size
        empty = np.zeros(0, dtype=np.int64)
        if m == 0:
            return empty, empty, empty, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
        if self.n == 0:
            return self.build(words), empty, empty, np.zeros(0, dtype=bool), np.zeros(m, dtype=bool)
        if len(words) != self.K:
            raise ValueError(f"{len(words)} words per element for an index of {self.K}")
        if self.relays and prefer is None:   # (a preferred key is a free key: a re-lay loses it)
            before = self._relay_keeping(before)
        order = np.lexsort(words[::-1])
        sw = [w[order] for w in words]
        pref = None if prefer is None else np.asarray(prefer, dtype=np.int64)[order]
        hint = None if before is None else np.asarray(before, dtype=np.int64)[order]
        if hint is not None and (hint >= 0).any():
            pred = np.empty(m, dtype=np.int64)
            succ = np.empty(m, dtype=np.int64)
            known = hint >= 0
            pred[known] = hint[known]
            succ[known] = self.after(hint[known])
            if not known.all():
                unknown = ~known
                pred[unknown], succ[unknown] = self.locate([w[unknown] for w in sw])
        else:
            pred, succ = self.locate(sw)
        # gaps: runs of new elements with the same neighbours
        start = np.ones(m, dtype=bool)
        start[1:] = pred[1:] != pred[:-1]
        gfirst = np.flatnonzero(start)
        gcount = np.diff(np.append(gfirst, m))
        ga, gb = pred[gfirst], succ[gfirst]
        gid = np.repeat(np.arange(gfirst.size), gcount)
        rank = np.arange(m) - gfirst[gid]           # position within its gap

        interior = (ga != NONE_LO) & (gb != NONE_HI)
        crowded = interior & (gb - ga - 1 < gcount)
        new_keys = np.full(m, -1, dtype=np.int64)
        kept = np.zeros(m, dtype=bool)
        moved_old, moved_new = empty, empty
        brk = np.zeros(0, dtype=bool)
        in_window = np.zeros(gfirst.size, dtype=bool)
        windows: Optional[tuple[np.ndarray, ...]] = None
        if crowded.any():
            windows = self._windows(ga, gb, gcount, crowded)
            windows = windows + (crowded,)
            wP, wQ = windows[0], windows[1]
            # gaps inside a window
            i0 = np.searchsorted(ga, wP, side="left")
            i1 = np.searchsorted(gb, wQ, side="right")
            cover = np.zeros(gfirst.size + 1, dtype=np.int64)
            np.add.at(cover, i0, 1)
            np.add.at(cover, i1, -1)
            in_window = np.cumsum(cover)[:-1] > 0

        s = self.spacing
        out = ~in_window
        g_e = out[gid]                              # elements of gaps placed directly
        a_e, b_e, c_e = ga[gid], gb[gid], gcount[gid]
        # appending after the last element / before the first
        back = g_e & (b_e == NONE_HI)
        new_keys[back] = a_e[back] + s * (rank[back] + 1)
        front = g_e & (a_e == NONE_LO)
        new_keys[front] = b_e[front] - s * (c_e[front] - rank[front])
        if pref is not None:
            # an element alone in an end gap keeps its key when that key is still beyond the end
            end = np.flatnonzero((back | front) & (c_e == 1))
            p = pref[end]
            ok = np.where(back[end], p > a_e[end], (p < b_e[end]) & (p >= 0))
            new_keys[end[ok]] = p[ok]
            kept[end[ok]] = True
        inner = g_e & ~back & ~front
        if inner.any():
            # right after the element before the gap, leaving the room after them free: the next
            # rows with equal values (larger row keys) go there
            step = np.minimum(s, (b_e[inner] - a_e[inner]) // (c_e[inner] + 1))
            new_keys[inner] = a_e[inner] + step * (rank[inner] + 1)
            if pref is not None:
                p = pref[inner]
                keep = (c_e[inner] == 1) & (p > a_e[inner]) & (p < b_e[inner])
                new_keys[np.flatnonzero(inner)[keep]] = p[keep]
                kept[np.flatnonzero(inner)[keep]] = True

        layout = None
        if windows is not None:
            layout = self._window_layout(windows, ga, gb, gcount, gfirst, sw)
            w_keys_new, w_new_elem, w_reals_old, w_reals_new, w_words, w_keys_all, w_win = layout
            new_keys[w_new_elem] = w_keys_new
            changed = np.flatnonzero(w_reals_old != w_reals_new)
            moved_old, moved_new = w_reals_old[changed], w_reals_new[changed]
            brk = np.ones(changed.size, dtype=bool)
            brk[1:] = (np.diff(changed) != 1) | (w_win[changed[1:]] != w_win[changed[:-1]])

        kmin = int(new_keys.min())
        kmax = int(new_keys.max())
        if layout is not None and w_keys_all.size:
            kmin, kmax = min(kmin, int(w_keys_all[0])), max(kmax, int(w_keys_all[-1]))
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        self._ensure(min(kmin, lo_k), max(kmax, hi_k))

        # the region's new ends: an old end stays unless a window open on that side re-spread it
        lows, highs = [kmin], [kmax]
        if windows is None or not (windows[0] == NONE_LO).any():  # windows is None exactly when layout is
            lows.append(lo_k)
        if windows is None or not (windows[1] == NONE_HI).any():
            highs.append(hi_k)
        new_lo, new_hi = min(lows), max(highs)
        if windows is not None:
            wP, wQ, wPe, wQe = windows[:4]
            # each window's range is painted with its new layout; a window open to the front or
            # back starts or ends at its first or last element
            first_el = w_keys_all[np.searchsorted(w_keys_all, wPe, side="right")]
            last_el = w_keys_all[np.searchsorted(w_keys_all, wQe, side="left") - 1]
            first = np.where(wP == NONE_LO, first_el, wP + 1)
            last = np.where(wQ == NONE_HI, last_el, wQ - 1)
            rights = np.where(wQ == NONE_HI, last_el, wQ)
            self._paint(first, last, rights, w_keys_all, w_words)
        # gaps placed directly: the new elements, and the free slots before them in their gap
        gd = np.flatnonzero(out)
        if gd.size:
            elem = np.flatnonzero(g_e)
            rk = new_keys[elem]
            o = np.argsort(rk)
            elem, rk = elem[o], rk[o]
            fk = new_keys[gfirst[gd]]                               # first new key of each gap
            lk = new_keys[gfirst[gd] + gcount[gd] - 1]              # last new key of each gap
            is_front = ga[gd] == NONE_LO
            g_first = np.where(is_front, fk, ga[gd] + 1)
            g_last = np.where(is_front, gb[gd] - 1, lk)
            rights = np.where(is_front, gb[gd], lk)
            self._paint(g_first, g_last, rights, rk, [w[elem] for w in sw])
        self.lo, self.hi = new_lo - self.base, new_hi - self.base
        if moved_old.size:
            self.ids.set(self.W[-1][moved_new - self.base].astype(np.int64), moved_new)
        self.ids.set(sw[-1].astype(np.int64), new_keys)
        self.n += m
        keys = np.empty(m, dtype=np.int64)
        keys[order] = new_keys
        kept_in = np.empty(m, dtype=bool)
        kept_in[order] = kept
        return keys, moved_old, moved_new, brk, kept_in

    def _count_reals(self, first: np.ndarray, last: np.ndarray) -> np.ndarray:
        """Number of elements with keys in [first[i], last[i]] (ranges inside the region)."""
        keys, owner = _ranges(first, last - first + 1)
        out = np.zeros(first.size, dtype=np.int64)
        if keys.size:
            real = self.src[keys - self.base] == keys
            np.add.at(out, owner[real], 1)
        return out

    def _max_density(self, width: np.ndarray, span: int) -> np.ndarray:
        """Density a window of `width` keys may have after re-spreading: high for small windows,
        falling to one half for a window as wide as the region (as in a packed-memory array), so
        that a re-spread leaves room for many later rows before a larger window is needed."""
        small = 8.0 * self.spacing
        levels = max(1.0, np.log2(max(span, small) / small))
        frac = np.clip(np.log2(np.maximum(width, small) / small) / levels, 0.0, 1.0)
        density: np.ndarray = 0.95 - 0.25 * frac
        return density

    def _windows(self, ga: np.ndarray, gb: np.ndarray, gcount: np.ndarray,
                 crowded: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Windows (P, Q) (keys of elements, or NONE_LO / NONE_HI when open to the front /
        back) around the crowded gaps, grown and merged until each holds at most one element per
        two keys; with the bounds to spread over (Pe, Qe)."""
        s = self.spacing
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        P, Q = ga[crowded].copy(), gb[crowded].copy()
        csum = np.concatenate(([0], np.cumsum(gcount)))
        rsum = np.concatenate(([0], np.cumsum(np.where(crowded, gcount, 0) * self.reserve)))
        while True:
            # merge overlapping windows
            o = np.argsort(P, kind="stable")
            P, Q = P[o], Q[o]
            reach = np.maximum.accumulate(Q)
            new = np.ones(P.size, dtype=bool)
            new[1:] = P[1:] >= reach[:-1]
            firsts = np.flatnonzero(new)
            lasts = np.append(firsts[1:], P.size) - 1
            P, Q = P[firsts], reach[lasts]
            # elements inside and new elements of the gaps inside
            rf = np.where(P == NONE_LO, lo_k, P + 1)
            rl = np.where(Q == NONE_HI, hi_k, Q - 1)
            reals = self._count_reals(rf, rl)
            i0 = np.searchsorted(ga, P, side="left")
            i1 = np.searchsorted(gb, Q, side="right")
            need = reals + csum[i1] - csum[i0] + rsum[i1] - rsum[i0]
            open_ = (P == NONE_LO) | (Q == NONE_HI)
            ok = open_ | (need <= self._max_density(Q - P, hi_k - lo_k + 1) * (Q - P - 1))
            if ok.all():
                break
            grow = ~ok
            w = Q[grow] - P[grow]
            P[grow] = self._prv(P[grow] - w)
            Q[grow] = self._nxt(Q[grow] + w)
        # bounds to spread over
        Pe, Qe = P.copy(), Q.copy()
        both = (P == NONE_LO) & (Q == NONE_HI)
        fr = (P == NONE_LO) & ~both
        bk = (Q == NONE_HI) & ~both
        Pe[fr] = Q[fr] - s * (need[fr] + 1)
        Qe[bk] = P[bk] + s * (need[bk] + 1)
        if both.any():
            mid = (lo_k + hi_k) // 2
            Pe[both] = mid - s * (need[both] + 1) // 2
            Qe[both] = Pe[both] + s * (need[both] + 1)
        return P, Q, Pe, Qe

    def _window_layout(self, windows: tuple[np.ndarray, ...], ga: np.ndarray, gb: np.ndarray, gcount: np.ndarray,
                       gfirst: np.ndarray, sw: list[np.ndarray]
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[np.ndarray], np.ndarray,
                                  np.ndarray]:
        """Even layout of each window's elements (old ones and the new ones of its gaps)."""
        P, Q, Pe, Qe, crowded = windows
        lo_k, hi_k = self.lo + self.base, self.hi + self.base
        rf = np.where(P == NONE_LO, lo_k, P + 1)
        rl = np.where(Q == NONE_HI, hi_k, Q - 1)
        keys, owner = _ranges(rf, rl - rf + 1)
        real = self.src[keys - self.base] == keys
        rk, rown = keys[real], owner[real]
        # new elements of the gaps inside each window
        i0 = np.searchsorted(ga, P, side="left")
        i1 = np.searchsorted(gb, Q, side="right")
        gsel, gown = _ranges(i0, i1 - i0)
        ne, neown = _ranges(gfirst[gsel], gcount[gsel])
        neown = gown[neown]
        # order inside a window: old elements by key; new ones right after their gap's left element
        anchor_old = rk
        anchor_new = ga[np.searchsorted(gfirst, ne, side="right") - 1]  # the gap's left element
        win = np.concatenate((rown, neown))
        anchor = np.concatenate((anchor_old, anchor_new))
        sub = np.concatenate((np.zeros(rk.size, np.int64), 1 + ne))
        o = np.lexsort((sub, anchor, win))
        win_o = win[o]
        counts = np.bincount(win_o, minlength=P.size)
        starts = np.cumsum(counts) - counts
        i = np.arange(o.size) - starts[win_o]
        # free keys are shared out by weight: one share before the first element and after each
        # element, plus `reserve` shares per new element after the last new element of a crowded
        # gap (the next rows of a run of equal values go there)
        gap_of = np.searchsorted(gfirst, ne, side="right") - 1
        last_of_crowded = crowded[gap_of] & (ne == gfirst[gap_of] + gcount[gap_of] - 1)
        extra_new = np.where(last_of_crowded, self.reserve * gcount[gap_of], 0)
        # a batch that continues a run of equal values (it ties with the element before it but for
        # the id) is where the next rows of that run will go: leave room growing with the window
        if last_of_crowded.any() and self.K > 1:
            cand = np.flatnonzero(last_of_crowded)
            a = ga[gap_of[cand]]
            ok = a != NONE_LO
            tie = np.zeros(cand.size, dtype=bool)
            if ok.any():
                aw = self.words_at(a[ok])
                eq = np.ones(int(ok.sum()), dtype=bool)
                for k in range(self.K - 1):
                    eq &= aw[k] == sw[k][ne[cand[ok]]]
                tie[ok] = eq
            reals_in = np.bincount(rown, minlength=P.size)
            extra_new[cand[tie]] = np.maximum(extra_new[cand[tie]], reals_in[neown[cand[tie]]])
        extra = np.concatenate((np.zeros(rk.size, np.int64), extra_new))[o]
        after = 1 + extra
        cum_after = np.cumsum(after)
        cum_start = (cum_after - after)[starts]                  # per window
        before = 1 + cum_after - after - cum_start[win_o]        # weight before element i
        total = (1 + np.bincount(win_o, weights=after, minlength=P.size)).astype(np.int64)
        free = (Qe - Pe - 1 - counts)[win_o]
        keys_all = Pe[win_o] + i + 1 + (free * before) // total[win_o]
        is_old = o < rk.size
        old_pos = np.flatnonzero(is_old)
        new_pos = np.flatnonzero(~is_old)
        reals_old = rk[o[old_pos]]
        reals_new = keys_all[old_pos]
        new_elem = ne[o[new_pos] - rk.size]
        keys_new = keys_all[new_pos]
        # words of every element of the windows, in layout order
        old_words = self.words_at(reals_old)
        words = []
        for k in range(self.K):
            w = np.empty(o.size, dtype=np.uint64)
            w[old_pos] = old_words[k]
            w[new_pos] = sw[k][new_elem]
            words.append(w)
        oo = np.argsort(keys_all, kind="stable")
        return (keys_new, new_elem, reals_old, reals_new, [w[oo] for w in words], keys_all[oo],
                win_o[old_pos])

    # -- changing words in place ----------------------------------------------------------------
    def set_last_word(self, keys: np.ndarray, ids: np.ndarray) -> None:
        """Replaces the ids of the elements at `keys` (the order must not change)."""
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        old = self.id_at(keys)
        self.ids.delete(old)
        order = np.argsort(keys)
        keys, ids = keys[order], np.asarray(ids, dtype=np.int64)[order]
        words = self.words_at(keys)
        words[-1] = ids.astype(np.uint64)
        self._repaint_elements(keys, words)
        self.ids.set(ids, keys)

    def set_words(self, keys: np.ndarray, words: list[np.ndarray]) -> None:
        """Replaces the words of the elements at `keys` (keeping their order and ids)."""
        keys = np.asarray(keys, dtype=np.int64)
        if keys.size == 0:
            return
        order = np.argsort(keys)
        self._repaint_elements(keys[order], [w[order] for w in words])

    def _repaint_elements(self, keys: np.ndarray, words: list[np.ndarray]) -> None:
        prv = self._before_elements(keys)
        first = np.where(prv == NONE_LO, keys, prv + 1)
        self._paint(first, keys, keys, keys, words)

    # -- checking (tests) -----------------------------------------------------------------------
    def check(self) -> None:
        """Asserts the invariants (O(capacity); for tests)."""
        if self.n == 0:
            assert len(self.ids) == 0
            return
        lo, hi = self.lo, self.hi
        s = self.src[lo:hi + 1]
        slots = np.arange(lo, hi + 1) + self.base
        real = s == slots
        assert real[0] and real[-1], "region must start and end with elements"
        assert int(real.sum()) == self.n, (int(real.sum()), self.n)
        assert np.all(s >= slots) and np.all(np.diff(s) >= 0)
        assert np.all(real[np.searchsorted(slots, s)])
        for w in self.W:
            r = w[lo:hi + 1]
            assert np.array_equal(r, w[s - self.base]), "free slots must copy the element after them"
        rw = [w[lo:hi + 1][real] for w in self.W]
        if self.n > 1:
            assert np.all(_lex_greater([w[1:] for w in rw], [w[:-1] for w in rw])), "elements out of order"
        if self.F is not None:
            js = np.arange(-(-lo // FENCE), hi // FENCE + 1)
            for f, w in zip(self.F, self.W):
                assert np.array_equal(f[js], w[js * FENCE]), "fence out of date"
        keys = slots[real]
        assert np.array_equal(self.ids.get(rw[-1].astype(np.int64)), keys)
        assert len(self.ids) == self.n
