"""What one subscriber is sent: row-set arithmetic for full and viewport subscriptions.

Pure functions of row sets (no locks, no I/O). Given what a client holds (its view of the table
at the step it last received) and the table's coalesced update since then, they say which rows
the next message removes, adds (with data) and modifies, in the row space the client works in
(docs/viewports.md#key-space-and-position-space): key space for full subscriptions, indices into
the client's dense window for viewport subscriptions.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np
import numpy.typing as npt

from tickwire.errors import TickwireError
from tickwire.protocol.rowset import merge_ranges
from tickwire.server.engine.graph import RowSet, RowSetShiftData, TableUpdate

__all__ = ["View", "Viewport", "SubscriptionError", "Plan", "window_keys", "plan_full", "plan_viewport",
           "clip_positions", "requested", "requested_columns", "requested_viewport"]

EMPTY_SHIFTS = RowSetShiftData()


class SubscriptionError(TickwireError):
    """A request a subscription cannot honour (a view it cannot have, a failed table); `code` is
    the gRPC status name."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(message, code)
_NO_RANGES = np.empty((0, 2), dtype=np.int64)
#: a viewport: a Viewport, a RowSet of positions, or closed position ranges (n, 2)
ViewportLike = Union["Viewport", RowSet, npt.ArrayLike]


class Viewport:
    """The table positions a viewport subscription asks for: sorted, merged closed ranges.

    Kept as ranges and never expanded: a viewport is rows of the table, so each use clips it to
    the table's size first (`clip`), and positions far beyond the table (``[2, 2**62]``) cost
    nothing. Building one costs O(k log k) in its k ranges, whatever positions they span."""

    __slots__ = ("_ranges", "_key")

    def __init__(self, ranges: ViewportLike):
        if isinstance(ranges, Viewport):
            r = ranges.ranges()
        elif isinstance(ranges, RowSet):
            r = ranges.ranges()
        else:
            r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        if r.shape[0]:
            if r.min() < 0:
                raise ValueError("viewport has negative positions")
            if (r[:, 1] < r[:, 0]).any():
                raise ValueError("viewport has a range whose end is before its start")
            r = merge_ranges(r)
        else:
            r = _NO_RANGES
        r.setflags(write=False)
        self._ranges: np.ndarray = r
        self._key = r.tobytes()

    def ranges(self) -> np.ndarray:
        """The (k, 2) int64 closed ranges (read-only)."""
        return self._ranges

    def is_empty(self) -> bool:
        return bool(self._ranges.shape[0] == 0)

    def clip(self, n: int) -> np.ndarray:
        """The ranges that fall inside a table of n rows, shape (k, 2): O(log k) to find them."""
        r = self._ranges
        if n <= 0 or r.shape[0] == 0:
            return _NO_RANGES
        k = int(np.searchsorted(r[:, 0], n - 1, side="right"))
        if k == 0:
            return _NO_RANGES
        out: np.ndarray = r[:k].copy()
        if out[-1, 1] > n - 1:
            out[-1, 1] = n - 1
        return out

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RowSet):
            other = Viewport(other)
        return isinstance(other, Viewport) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        shown = ", ".join(f"{a}-{b}" for a, b in self._ranges[:4].tolist())
        more = f", ... ({self._ranges.shape[0]} ranges)" if self._ranges.shape[0] > 4 else ""
        return f"Viewport({shown}{more})"


@dataclass(frozen=True)
class View:
    """What a subscription asks for. `viewport` is None for a full subscription, else a Viewport
    of table positions (reverse: position p is row n-1-p; a RowSet or ranges are converted).
    `columns` is a sorted tuple of column indices (all columns when the request had none)."""

    columns: tuple[int, ...]
    viewport: Optional[Viewport] = None
    reverse: bool = False
    checked_for: Optional[int] = field(default=None, compare=False)  # the column count `requested` checked

    def __post_init__(self) -> None:
        if self.viewport is not None and not isinstance(self.viewport, Viewport):
            object.__setattr__(self, "viewport", Viewport(self.viewport))

    @property
    def is_full(self) -> bool:
        return self.viewport is None

    def same_window(self, other: "View") -> bool:
        return self.reverse == other.reverse and (
            (self.viewport is None and other.viewport is None)
            or (self.viewport is not None and other.viewport is not None and self.viewport == other.viewport))


@dataclass
class Plan:
    """One message for one subscriber, before its data is gathered.

    `added_rows` / `removed_rows` / `modified_rows` are in the client's row space; `add_keys` and
    `mod_keys` are the table's row keys whose current values go in the add and mod batches (in
    the same order as the client's rows). `modified_columns` are the column indices whose mod
    node carries `modified_rows`; the others get empty nodes. `client_keys` is what the client
    holds after the message (the window's keys for a viewport, the whole row set for full)."""

    added_rows: RowSet
    removed_rows: RowSet
    modified_rows: RowSet
    add_keys: RowSet
    mod_keys: RowSet
    modified_columns: tuple[int, ...]
    shifts: Optional[RowSetShiftData]  # None: field absent (viewport messages)
    client_keys: RowSet
    added_rows_included: Optional[RowSet] = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def is_empty(self) -> bool:
        return (self.added_rows.is_empty() and self.removed_rows.is_empty() and self.modified_rows.is_empty()
                and (self.shifts is None or self.shifts.is_empty()))


def requested_columns(indices: Optional[npt.ArrayLike], ncols: int, what: str) -> Optional[tuple[int, ...]]:
    """A request's column set (bitset indices) checked against the schema in one vectorized pass;
    the error names the first few offenders and how many there are. None: all columns."""
    if indices is None:
        return None
    cols = np.asarray(indices, dtype=np.int64).ravel()
    bad = cols[(cols >= ncols) | (cols < 0)]
    if bad.size:
        first = ", ".join(str(c) for c in bad[:5].tolist())
        more = f" and {bad.size - 5} more" if bad.size > 5 else ""
        raise SubscriptionError(f"{what}: column indices {first}{more} out of range for a table of {ncols} columns")
    return tuple(sorted(set(cols.tolist())))  # at most ncols distinct values by now


def requested_viewport(ranges: Optional[npt.ArrayLike], max_ranges: int) -> Optional[Viewport]:
    """A request's viewport, validated and kept as ranges (clipped to the table at each use)."""
    if ranges is None:
        return None
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    if r.shape[0] > max_ranges:
        raise SubscriptionError(f"viewport has {r.shape[0]} ranges; at most {max_ranges} are accepted",
                                "RESOURCE_EXHAUSTED")
    try:
        return Viewport(r)
    except ValueError as exc:
        raise SubscriptionError(f"bad viewport: {exc}") from None


def requested(columns: Optional[npt.ArrayLike], viewport: Optional[npt.ArrayLike], reverse: bool, *, ncols: int,
              blink: bool, max_ranges: int, what: str = "subscription columns", table: str = "") -> View:
    """The View a request asks for, checked once against the table: columns in range, a valid
    viewport of at most `max_ranges` ranges, a reverse direction only with a viewport (and not on
    a blink table). Publishing trusts a View made here (`checked_for`)."""
    cols = requested_columns(columns, ncols, what)
    vp = requested_viewport(viewport, max_ranges)
    if reverse and vp is None:
        raise SubscriptionError("reverse_viewport needs a viewport")
    if reverse and blink:
        raise SubscriptionError(f"reverse viewports are not supported on blink table {table!r}")
    return View(columns=tuple(range(ncols)) if cols is None else cols, viewport=vp, reverse=bool(reverse),
                checked_for=ncols)


def clip_positions(viewport: ViewportLike, n: int) -> np.ndarray:
    """The viewport's position ranges clipped to a table of n rows, shape (k, 2)."""
    return Viewport(viewport).clip(n) if not isinstance(viewport, Viewport) else viewport.clip(n)


def window_keys(rows: RowSet, viewport: ViewportLike, reverse: bool) -> RowSet:
    """The keys of `rows` at the viewport's positions (reverse: counted from the end)."""
    n = len(rows)
    r = clip_positions(viewport, n)
    if r.shape[0] == 0:
        return RowSet()
    if reverse:
        r = (n - 1 - r)[::-1, ::-1]
    return rows.subset_by_position_ranges(r)


def _modified_columns(update: Optional[TableUpdate], names: list[str], wanted: tuple[int, ...]) -> tuple[int, ...]:
    if update is None or update.modified.is_empty():
        return ()
    return tuple(i for i in wanted if names[i] in update.modified_columns)


def plan_full(update: Optional[TableUpdate], rows: RowSet, names: list[str], view: View, *,
              snapshot: bool = False, client_keys: Optional[RowSet] = None) -> Plan:
    """A full subscriber's message.

    Delta (`snapshot=False`): the update as it is, in key space, with the data of its added rows
    and of its modified rows in the subscribed columns. Snapshot: the client's rows
    (`client_keys`, default none) are removed and the whole table (`rows`) is added; this serves
    the initial snapshot and a change of columns."""
    if snapshot:
        held = client_keys if client_keys is not None else RowSet()
        return Plan(added_rows=rows, removed_rows=held, modified_rows=RowSet(), add_keys=rows, mod_keys=RowSet(),
                    modified_columns=(), shifts=EMPTY_SHIFTS, client_keys=rows)
    assert update is not None
    mcols = _modified_columns(update, names, view.columns)
    mods = update.modified if mcols else RowSet()
    return Plan(added_rows=update.added, removed_rows=update.removed, modified_rows=mods, add_keys=update.added,
                mod_keys=mods, modified_columns=mcols, shifts=update.shifted, client_keys=rows)


def plan_viewport(update: Optional[TableUpdate], prev_client: RowSet, rows: RowSet, names: list[str],
                  view: View, *, repaint_all: bool = False, snapshot: bool = False) -> Plan:
    """A viewport subscriber's message (docs/viewports.md#viewport-subscriptions).

    `prev_client` is the window the client holds (keys in the pre-update key space, i.e. before
    `update`; `update` None means the table did not change). `rows` is the table's row set now.
    Rows that stay in the window are kept by the client; the rest of its window is removed, and
    every row new to the window (added, or scoped in by adds and removes before it) is sent in
    full as an add. `repaint_all` re-sends every row (the direction changed or columns were
    added). In a snapshot, rows that stay but were modified are repainted too, since snapshots
    carry no modifications."""
    assert view.viewport is not None
    new_window = window_keys(rows, view.viewport, view.reverse)
    if repaint_all or prev_client.is_empty():
        stay_post = RowSet()
    elif update is None:
        stay_post = prev_client.intersect(new_window)
    else:
        survivors = prev_client.minus(update.removed)
        stay_post = update.shifted.apply(survivors).intersect(new_window)
    mcols = _modified_columns(update, names, view.columns)
    if snapshot and update is not None and not update.modified.is_empty():
        stay_post = stay_post.minus(update.modified)
        mcols = ()
    stay_pre = stay_post if update is None else update.shifted.unapply(stay_post)
    gone_pre = prev_client.minus(stay_pre)
    incl = new_window.minus(stay_post)
    mods = new_window.intersect(update.modified).minus(incl) if mcols and update is not None else RowSet()
    return Plan(added_rows=new_window.positions_of(incl),
                removed_rows=prev_client.positions_of(gone_pre),
                modified_rows=new_window.positions_of(mods),
                add_keys=incl, mod_keys=mods, modified_columns=mcols if not mods.is_empty() else (),
                shifts=None, client_keys=new_window)
