"""Barrage message objects (tickwire.protocol.barrage) against the real Deephaven captures.

Every `app_metadata` of every DoGet/DoExchange capture must unwrap, agree with what decoded.txt says
about it, and re-encode to the identical bytes. Property tests cover round trips and absent vs
empty fields; fuzz tests check that malformed input only ever raises ProtocolError.
"""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tickwire.errors import ProtocolError
from tickwire.protocol.barrage import (
    MAGIC,
    BarrageMessageType,
    BarrageMessageWrapper,
    PublicationOptions,
    PublicationRequest,
    SnapshotOptions,
    SnapshotRequest,
    SubscriptionOptions,
    SubscriptionRequest,
    UpdateMetadata,
    unwrap,
    wrap,
)
from tickwire.protocol.fbread import root
from tickwire.protocol.flight import decode_flight_data
from tickwire.protocol.rowset import encode_rowset, encode_shifts, keys_to_ranges, rowset_size

from .golden import GOLDEN, decoded_records, decoded_sections, golden_dirs, read_cap

needs_golden = pytest.mark.skipif(not GOLDEN.exists(), reason="shared/golden not present")


# ----------------------------------------------------------------------------------------------
# the captures and their decoded.txt
# ----------------------------------------------------------------------------------------------

@dataclass
class Meta:
    """One app_metadata from a capture, with the text decoded.txt shows for its record."""

    folder: str
    call: int
    record: int  # 1-based, counting both directions, as decoded.txt numbers them
    direction: str
    raw: bytes
    text: str

    @property
    def id(self) -> str:
        return f"{self.folder}/{self.call:04d}#{self.record}"


def _collect() -> list[Meta]:
    out: list[Meta] = []
    if not GOLDEN.exists():
        return out
    for folder in golden_dirs():
        sections = None
        for cap in sorted(folder.glob("*_FlightService_Do*.cap")):
            if not cap.name.endswith(("_DoGet.cap", "_DoExchange.cap")):
                continue
            sections = sections or decoded_sections(folder)
            call = int(cap.name.split("_", 1)[0])
            records = decoded_records(sections[call])
            for i, rec in enumerate(read_cap(cap), start=1):
                if rec.direction == "C" and cap.name.endswith("_DoGet.cap"):
                    continue  # a DoGet request is a Ticket, not FlightData
                md = decode_flight_data(rec.payload).app_metadata
                if md is not None:
                    out.append(Meta(folder.name, call, i, rec.direction, md, records[i]))
    return out


METAS = _collect()
META_IDS = [m.id for m in METAS]


def _find(folder: str, call: int, record: int) -> Meta:
    return next(m for m in METAS if (m.folder, m.call, m.record) == (folder, call, record))


@needs_golden
def test_every_capture_folder_contributes_metadata():
    folders = {m.folder for m in METAS}
    assert {"barrage_java", "flight_doget", "flight_doget_big_static", "pydeephaven", "ticking_append",
            "ticking_blink", "ticking_keyed", "ticking_sorted", "ticking_static_mixed"} <= folders
    kinds = {unwrap(m.raw)[0] for m in METAS}
    assert kinds == {BarrageMessageType.SUBSCRIPTION_REQUEST, BarrageMessageType.SNAPSHOT_REQUEST,
                     BarrageMessageType.UPDATE_METADATA}
    # every app_metadata decoded.txt shows was found in the .cap files, and vice versa
    shown = sum(len(re.findall(r"app_metadata: BarrageMessageWrapper", (GOLDEN / f / "decoded.txt").read_text()))
                for f in folders)
    assert shown == len(METAS) == 160


# ----------------------------------------------------------------------------------------------
# checking a decoded object against decoded.txt
# ----------------------------------------------------------------------------------------------

def _ranges_from_text(text: str) -> tuple[list[list[int]], int]:
    """'{0-9,12,...(+2 ranges)}' -> (the ranges shown, the number of ranges left out)."""
    inner = text.strip()[1:-1]
    more = 0
    m = re.search(r",?\.\.\.\(\+(\d+) ranges\)$", inner)
    if m:
        more = int(m.group(1))
        inner = inner[: m.start()]
    shown = []
    for part in filter(None, inner.split(",")):
        a, _, b = part.partition("-")
        shown.append([int(a), int(b or a)])
    return shown, more


def _check_rowset(value: Optional[np.ndarray], text: str, what: str) -> None:
    """text is 'None' or '{...} size=N'."""
    if text == "None":
        assert value is None, what
        return
    m = re.fullmatch(r"(\{[^}]*\}) size=(\d+)", text)
    assert m, (what, text)
    assert value is not None, what
    assert value.ndim == 2 and value.shape[1] == 2 and value.dtype == np.int64, what
    shown, more = _ranges_from_text(m.group(1))
    assert value.shape[0] == len(shown) + more, what
    assert value[: len(shown)].tolist() == shown, what
    assert rowset_size(value) == int(m.group(2)), what


def _line(text: str, key: str) -> Optional[str]:
    m = re.search(rf"^ +{re.escape(key)}(.*)$", text, re.M)
    return None if m is None else m.group(1)


def _check_wrapper(meta: Meta) -> None:
    m = re.search(r"app_metadata: BarrageMessageWrapper magic=0x([0-9a-f]+) msg_type=(\w+) payload=(\d+)B", meta.text)
    assert m, meta.text[:200]
    w = BarrageMessageWrapper.from_bytes(meta.raw)
    assert w.magic == int(m.group(1), 16) == MAGIC
    names = {"BarrageSubscriptionRequest": BarrageMessageType.SUBSCRIPTION_REQUEST,
             "BarrageSnapshotRequest": BarrageMessageType.SNAPSHOT_REQUEST,
             "BarrageUpdateMetadata": BarrageMessageType.UPDATE_METADATA}
    assert w.msg_type == names[m.group(2)]
    assert len(w.payload) == int(m.group(3))


def _check_request(req, text: str) -> None:
    m = re.search(r"ticket=hex:([0-9a-f]*) \((\d+)B\) columns=(None|\[[^\]]*\]) viewport=(None|\{[^}]*\} size=\d+) "
                  r"reverse_viewport=(True|False)", text)
    assert m, text[:300]
    assert req.ticket == bytes.fromhex(m.group(1)) and len(req.ticket) == int(m.group(2))
    if m.group(3) == "None":
        assert req.columns is None
    else:
        assert req.columns.tolist() == [int(x) for x in m.group(3)[1:-1].split(",") if x.strip()]
    _check_rowset(req.viewport, m.group(4), "viewport")
    assert req.reverse_viewport == (m.group(5) == "True")
    opts = _line(text, "options: ")
    if opts is None:
        assert req.options is None
        return
    assert req.options is not None
    pairs = dict(re.findall(r"(\w+)=(-?\w+)", opts))
    assert pairs  # at least use_deephaven_nulls is always shown
    for key, value in pairs.items():
        got = getattr(req.options, key)
        want = (value == "True") if value in ("True", "False") else int(value)
        assert got == want, key


def _check_update(md: UpdateMetadata, text: str) -> None:
    m = re.search(r"first_seq=(-?\d+) last_seq=(-?\d+) is_snapshot=(True|False) table_size=(-?\d+)", text)
    assert m, text[:300]
    assert (md.first_seq, md.last_seq, md.is_snapshot, md.table_size) == (
        int(m.group(1)), int(m.group(2)), m.group(3) == "True", int(m.group(4)))

    ev = _line(text, "effective_viewport=")
    if ev is None:
        assert md.effective_viewport is None
    else:
        vp, _, rev = ev.rpartition(" effective_reverse_viewport=")
        _check_rowset(md.effective_viewport, vp, "effective_viewport")
        assert md.effective_reverse_viewport == (rev == "True")

    ecs = _line(text, "effective_column_set=")
    if ecs is None:
        assert md.effective_column_set is None
    else:
        assert md.effective_column_set.tolist() == [int(x) for x in ecs.strip("[]").split(",") if x.strip()]

    for name in ("added_rows", "removed_rows", "added_rows_included"):
        shown = _line(text, f"{name}=")
        assert shown is not None, name
        _check_rowset(getattr(md, name), shown, name)

    shifts = _line(text, "shift_data=")
    if shifts.strip() == "None":
        assert md.shift_data is None
    else:
        count, _, listed = shifts.partition(" shifts: ")
        s, e, d = md.shift_data
        assert s.size == e.size == d.size == int(count)
        items = re.findall(r"\[(\d+),(\d+)\]([+-]\d+)", listed)
        assert len(items) == int(count)
        assert [[int(a), int(b), int(a) + int(c)] for a, b, c in items] == np.stack([s, e, d], 1).tolist()

    mods = _line(text, "mod_column_nodes[")
    n, _, body = mods.partition("]=")
    if int(n) == 0:
        assert not md.mod_column_nodes  # decoded.txt shows an absent vector as [0]=[]
    else:
        nodes = body.strip()[1:-1].split("; ")
        assert len(md.mod_column_nodes) == len(nodes) == int(n)
        for c, (value, shown) in enumerate(zip(md.mod_column_nodes, nodes)):
            _check_rowset(value, shown, f"mod_column_nodes[{c}]")

    raw = _line(text, "raw: ")
    if raw is not None:
        names = {"added": "added_rows", "removed": "removed_rows", "shift": "shift_data",
                 "included": "added_rows_included"}
        for item in raw.split():
            key, _, hexed = item.partition("=")
            value = getattr(md, names[key])
            if hexed == "None":
                assert value is None, key
            else:
                again = encode_shifts(*value) if key == "shift" else encode_rowset(value)
                assert again.hex() == hexed, key


@needs_golden
@pytest.mark.parametrize("meta", METAS, ids=META_IDS)
def test_golden_metadata_matches_decoded_txt_and_reencodes(meta: Meta):
    _check_wrapper(meta)
    kind, obj = unwrap(meta.raw)
    if kind == BarrageMessageType.UPDATE_METADATA:
        assert meta.direction == "S"
        _check_update(obj, meta.text)
    else:
        assert meta.direction == "C"
        _check_request(obj, meta.text)
    # byte-identical re-encoding, of the payload and of the whole wrapper
    assert obj.to_bytes() == BarrageMessageWrapper.from_bytes(meta.raw).payload
    assert wrap(obj) == meta.raw
    assert BarrageMessageWrapper.from_bytes(meta.raw).to_bytes() == meta.raw
    # and decoding is stable
    assert type(obj).from_bytes(obj.to_bytes()) == obj


# ----------------------------------------------------------------------------------------------
# specific golden messages, values taken from decoded.txt
# ----------------------------------------------------------------------------------------------

@needs_golden
def test_java_full_subscription_request_bytes():
    # BARRAGE-WIRE.md §2.12's annotated example: barrage_java call 3, the client's first message
    meta = _find("barrage_java", 3, 1)
    assert len(meta.raw) == 92
    assert meta.raw[:36] == bytes.fromhex("10000000" "00000a00100008000700" "0c00" "0a000000"
                                          "00000005" "6470686e" "04000000" "38000000")
    kind, req = unwrap(meta.raw)
    assert kind == BarrageMessageType.SUBSCRIPTION_REQUEST
    assert req == SubscriptionRequest(ticket=b"e\x01\x00\x00\x00",
                                      options=SubscriptionOptions(use_deephaven_nulls=True))
    assert req.columns is None and req.viewport is None and req.subscription_token is None
    # building the same request from scratch gives the client's bytes
    fresh = SubscriptionRequest(ticket=b"e\x01\x00\x00\x00", options=SubscriptionOptions(use_deephaven_nulls=True))
    assert wrap(fresh) == meta.raw


@needs_golden
def test_java_full_subscription_snapshot_metadata():
    md = unwrap(_find("barrage_java", 3, 3).raw)[1]
    assert (md.first_seq, md.last_seq, md.is_snapshot, md.table_size) == (-1, -1, True, 1000)
    assert md.effective_viewport is None
    assert md.effective_column_set.tolist() == list(range(10))
    assert md.added_rows.tolist() == [[0, 999]] and md.added_rows_included.tolist() == [[0, 999]]
    assert md.removed_rows.shape == (0, 2)
    assert all(x.size == 0 for x in md.shift_data)
    assert len(md.mod_column_nodes) == 10 and all(m.shape == (0, 2) for m in md.mod_column_nodes)
    rebuilt = UpdateMetadata(first_seq=-1, last_seq=-1, is_snapshot=True, effective_column_set=np.arange(10),
                             added_rows=np.array([[0, 999]]), removed_rows=np.zeros((0, 2), np.int64),
                             shift_data=(np.zeros(0, np.int64),) * 3, added_rows_included=np.array([[0, 999]]),
                             mod_column_nodes=[np.zeros((0, 2), np.int64)] * 10, table_size=1000)
    assert wrap(rebuilt) == _find("barrage_java", 3, 3).raw


@needs_golden
def test_java_viewport_and_snapshot_requests():
    vp = [unwrap(m.raw)[1] for m in METAS if m.folder == "barrage_java" and m.direction == "C"
          and isinstance(unwrap(m.raw)[1], SubscriptionRequest) and unwrap(m.raw)[1].viewport is not None]
    assert len(vp) == 5 and all(r.viewport.tolist() == [[0, 9]] and not r.reverse_viewport for r in vp)
    snaps = [unwrap(m.raw)[1] for m in METAS if m.folder == "barrage_java" and m.direction == "C"
             and unwrap(m.raw)[0] == BarrageMessageType.SNAPSHOT_REQUEST]
    assert len(snaps) == 5
    for s in snaps:
        assert s.options == SnapshotOptions(use_deephaven_nulls=True)
        assert s.columns is None and s.viewport is None and s.ticket[:1] == b"e"


@needs_golden
def test_java_viewport_snapshot_metadata():
    # viewport rows 0-9 of static_mixed: the snapshot echoes the viewport, rows are viewport-relative
    req = unwrap(_find("barrage_java", 6, 1).raw)[1]
    assert req.viewport.tolist() == [[0, 9]]
    mds = [unwrap(m.raw)[1] for m in METAS if (m.folder, m.call) == ("barrage_java", 6) and m.direction == "S"]
    snap = mds[0]
    assert snap.is_snapshot and snap.effective_viewport.tolist() == [[0, 9]]
    assert snap.added_rows.tolist() == [[0, 9]] and snap.shift_data is None and snap.added_rows_included is None
    assert snap.removed_rows.shape == (0, 2) and snap.table_size == 1000
    assert encode_rowset(snap.added_rows) == bytes.fromhex("1c0200f720")


@needs_golden
def test_cpp_client_subscription_request():
    # pydeephaven-ticking (C++ client): list-wrapped, Deephaven nulls, batch size 4096
    for folder in ("ticking_append", "ticking_keyed", "ticking_sorted", "ticking_blink", "ticking_static_mixed"):
        (req_meta,) = [m for m in METAS if m.folder == folder and m.direction == "C"]
        kind, req = unwrap(req_meta.raw)
        assert kind == BarrageMessageType.SUBSCRIPTION_REQUEST
        assert req.options == SubscriptionOptions(use_deephaven_nulls=True, batch_size=4096, columns_as_list=True)
        assert req.ticket == b"e\x01\x00\x00\x00" and req.viewport is None and req.columns is None
        assert wrap(SubscriptionRequest(ticket=req.ticket, options=req.options)) == req_meta.raw


@needs_golden
def test_doget_snapshot_pieces():
    # flight_doget call 1: static_mixed in two pieces; key-space added_rows in both, no table_size
    first, second = [unwrap(m.raw)[1] for m in METAS if (m.folder, m.call) == ("flight_doget", 1)]
    for md in (first, second):
        assert md.is_snapshot and (md.first_seq, md.last_seq) == (-1, -1) and md.table_size == 0
        assert md.added_rows.tolist() == [[0, 999]]
        assert md.removed_rows is None and md.mod_column_nodes is None and md.effective_column_set is None
        assert all(x.size == 0 for x in md.shift_data)
    assert first.effective_viewport.tolist() == [[0, 818]] and first.added_rows_included.tolist() == [[0, 818]]
    assert second.effective_viewport is None and second.added_rows_included.tolist() == [[819, 999]]
    assert first.num_adds() == 819 and second.num_adds() == 181 and first.mod_counts() == []


@needs_golden
def test_sorted_table_shift_data():
    shifted = [unwrap(m.raw)[1] for m in METAS if m.folder == "ticking_sorted" and m.direction == "S"]
    shifted = [md for md in shifted if md.shift_data is not None and md.shift_data[0].size]
    assert shifted
    for md in shifted:
        s, e, d = md.shift_data
        assert np.all(e >= s) and np.all(np.diff(s) > 0) and np.all(d != s)
        assert not md.is_snapshot and md.table_size == 50


@needs_golden
def test_keyed_table_modifications():
    mds = [unwrap(m.raw)[1] for m in METAS if m.folder == "ticking_keyed" and m.direction == "S"]
    snap, deltas = mds[0], mds[1:]
    assert snap.is_snapshot and snap.table_size == 20 and snap.added_rows.tolist() == [[0, 19]]
    assert deltas and all(not d.is_snapshot and d.table_size == 20 for d in deltas)
    # mostly modifications: the key column never changes, the others do
    assert all(d.mod_counts()[0] == 0 for d in deltas)
    assert any(d.mod_counts()[1] > 0 for d in deltas)
    assert all(d.last_seq >= d.first_seq > snap.last_seq for d in deltas)


# ----------------------------------------------------------------------------------------------
# properties
# ----------------------------------------------------------------------------------------------

_keys = st.lists(st.integers(0, 2**62), max_size=15, unique=True).map(lambda ks: np.array(sorted(ks), dtype=np.int64))
ranges = _keys.map(keys_to_ranges)
maybe_ranges = st.none() | ranges
colsets = st.none() | st.lists(st.integers(0, 200), unique=True, max_size=30).map(
    lambda xs: np.array(sorted(xs), dtype=np.int64))
i8 = st.integers(-128, 127)
i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
blobs = st.none() | st.binary(max_size=24)


@st.composite
def shift_data(draw):
    n = draw(st.integers(0, 6))
    starts, ends, dests = [], [], []
    pos = 0
    for _ in range(n):
        s = pos + draw(st.integers(1, 10_000))
        e = s + draw(st.integers(0, 500))
        delta = draw(st.integers(1, 25)) * draw(st.sampled_from([-1, 1]))
        if s + delta < 0:
            delta = -delta
        starts.append(s)
        ends.append(e)
        dests.append(s + delta)
        pos = e + 60
    # ranges are at least 61 apart and |delta| <= 25, so the destinations stay strictly ascending
    return tuple(np.array(x, dtype=np.int64) for x in (starts, ends, dests))


sub_options = st.builds(SubscriptionOptions, column_conversion_mode=i8, use_deephaven_nulls=st.booleans(),
                        min_update_interval_ms=i32, batch_size=i32, max_message_size=i32,
                        columns_as_list=st.booleans(), preview_list_length_limit=i64)
snap_options = st.builds(SnapshotOptions, column_conversion_mode=i8, use_deephaven_nulls=st.booleans(),
                         batch_size=i32, max_message_size=i32, preview_list_length_limit=i64)
sub_requests = st.builds(SubscriptionRequest, ticket=blobs, columns=colsets, viewport=maybe_ranges,
                         options=st.none() | sub_options, reverse_viewport=st.booleans(), subscription_token=blobs)
snap_requests = st.builds(SnapshotRequest, ticket=blobs, columns=colsets, viewport=maybe_ranges,
                          options=st.none() | snap_options, reverse_viewport=st.booleans())
pub_requests = st.builds(PublicationRequest, ticket=blobs,
                         options=st.none() | st.builds(PublicationOptions, use_deephaven_nulls=st.booleans()))
updates = st.builds(UpdateMetadata, first_seq=i64, last_seq=i64, is_snapshot=st.booleans(),
                    effective_viewport=maybe_ranges, effective_reverse_viewport=st.booleans(),
                    effective_column_set=colsets, added_rows=maybe_ranges, removed_rows=maybe_ranges,
                    shift_data=st.none() | shift_data(), added_rows_included=maybe_ranges,
                    mod_column_nodes=st.none() | st.lists(maybe_ranges, max_size=8), table_size=i64)
any_message = st.one_of(sub_requests, snap_requests, pub_requests, updates)


def _same_optional(a, b) -> bool:
    """None stays None and present stays present, field by field (and inside mod_column_nodes)."""
    if (a is None) != (b is None):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all((x is None) == (y is None) for x, y in zip(a, b))
    return True


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_message)
def test_round_trip(msg):
    data = msg.to_bytes()
    back = type(msg).from_bytes(data)
    assert back == msg
    for name in vars(msg):
        assert _same_optional(getattr(msg, name), getattr(back, name)), name
    assert back.to_bytes() == data  # encoding is deterministic
    kind, again = unwrap(wrap(msg))
    assert kind == msg.MSG_TYPE and again == msg


@settings(max_examples=100, deadline=None)
@given(sub_requests)
def test_serialization_options_wrap_as_subscription_request(req):
    data = wrap(req, msg_type=BarrageMessageType.SERIALIZATION_OPTIONS)
    kind, back = unwrap(data)
    assert kind == BarrageMessageType.SERIALIZATION_OPTIONS and back == req


@pytest.mark.parametrize("name,empty", [
    ("effective_viewport", np.zeros((0, 2), np.int64)), ("effective_column_set", np.zeros(0, np.int64)),
    ("added_rows", np.zeros((0, 2), np.int64)), ("removed_rows", np.zeros((0, 2), np.int64)),
    ("shift_data", (np.zeros(0, np.int64),) * 3), ("added_rows_included", np.zeros((0, 2), np.int64)),
    ("mod_column_nodes", []),
])
def test_update_absent_and_empty_stay_apart(name, empty):
    absent = UpdateMetadata.from_bytes(UpdateMetadata().to_bytes())
    present = UpdateMetadata.from_bytes(UpdateMetadata(**{name: empty}).to_bytes())
    assert getattr(absent, name) is None
    value = getattr(present, name)
    assert value is not None
    if name == "shift_data":
        assert all(x.size == 0 for x in value)
    else:
        assert len(value) == 0
    assert absent != present


def test_request_absent_and_empty_stay_apart():
    for cls in (SubscriptionRequest, SnapshotRequest):
        absent = cls.from_bytes(cls(ticket=b"s/t").to_bytes())
        empty = cls.from_bytes(cls(ticket=b"s/t", columns=np.zeros(0, np.int64),
                                   viewport=np.zeros((0, 2), np.int64)).to_bytes())
        assert absent.columns is None and absent.viewport is None
        assert empty.columns.shape == (0,) and empty.viewport.shape == (0, 2)
    req = SubscriptionRequest.from_bytes(SubscriptionRequest(ticket=b"", subscription_token=b"").to_bytes())
    assert req.ticket == b"" and req.subscription_token == b""
    assert SubscriptionRequest.from_bytes(SubscriptionRequest().to_bytes()).ticket is None


def test_mod_node_without_modified_rows_is_preserved():
    md = UpdateMetadata(mod_column_nodes=[None, np.array([[3, 4]]), np.zeros((0, 2), np.int64)])
    back = UpdateMetadata.from_bytes(md.to_bytes())
    assert back.mod_column_nodes[0] is None and back.mod_column_nodes[2].shape == (0, 2)
    assert back.mod_counts() == [0, 2, 0]
    assert back.to_bytes() == md.to_bytes()


def _written_slots(data: bytes, table=None) -> list[int]:
    t = table or root(data, "t")
    offs = struct.unpack_from(f"<{(t.vt_len - 4) // 2}H", t.buf, t.vt + 4)
    return [i for i, off in enumerate(offs) if off]


def test_defaults_are_not_written():
    assert _written_slots(UpdateMetadata().to_bytes()) == []
    assert _written_slots(UpdateMetadata(first_seq=0, last_seq=5, is_snapshot=False).to_bytes()) == [1]
    assert _written_slots(UpdateMetadata(is_snapshot=True, effective_reverse_viewport=True,
                                         table_size=1).to_bytes()) == [2, 4, 11]
    data = SubscriptionRequest(options=SubscriptionOptions()).to_bytes()
    assert _written_slots(data) == [3]
    assert _written_slots(b"", root(data, "t").table(3, "opts")) == []  # column_conversion_mode 1 is the default
    data = SubscriptionRequest(options=SubscriptionOptions(column_conversion_mode=2, columns_as_list=True)).to_bytes()
    assert _written_slots(b"", root(data, "t").table(3, "opts")) == [0, 5]
    assert _written_slots(SnapshotRequest(reverse_viewport=True).to_bytes()) == [4]
    assert _written_slots(BarrageMessageWrapper(msg_type=0, payload=None, magic=0).to_bytes()) == []


def test_update_builder_order_matches_spec_example():
    # BARRAGE-WIRE.md §2.10: a full-subscription delta carries added, removed, empty shifts and one
    # empty node per column; vectors come first in the buffer's tail, in the spec's creation order
    md = UpdateMetadata(first_seq=7, last_seq=8, added_rows=np.array([[5, 5]]), removed_rows=np.zeros((0, 2), np.int64),
                        shift_data=(np.zeros(0, np.int64),) * 3, mod_column_nodes=[np.zeros((0, 2), np.int64)] * 2,
                        table_size=6)
    data = md.to_bytes()
    t = root(data, "md")
    starts = {name: t.vector(slot, name)[0] for slot, name in ((6, "added"), (7, "removed"), (8, "shift"))}
    # flatbuffers grow downwards: what is created first sits last in the buffer
    assert starts["added"] > starts["removed"] > starts["shift"]
    assert data[starts["shift"]:starts["shift"] + 3] == b"\x20\x20\x20"


# ----------------------------------------------------------------------------------------------
# errors
# ----------------------------------------------------------------------------------------------

def test_wrong_magic():
    data = BarrageMessageWrapper(msg_type=6, payload=UpdateMetadata().to_bytes(), magic=0x12345678).to_bytes()
    with pytest.raises(ProtocolError) as exc:
        BarrageMessageWrapper.from_bytes(data)
    assert str(exc.value) == "wrong Barrage magic 0x12345678; expected 0x6e687064 ('dphn')"
    with pytest.raises(ProtocolError, match="wrong Barrage magic 0x12345678"):
        unwrap(data)
    assert BarrageMessageWrapper.from_bytes(data, check_magic=False).magic == 0x12345678
    missing = BarrageMessageWrapper(msg_type=6, payload=b"", magic=0).to_bytes()
    with pytest.raises(ProtocolError, match="wrong Barrage magic 0x00000000"):
        unwrap(missing)


@pytest.mark.parametrize("msg_type,words", [
    (42, r"unhandled BarrageMessageType: 42 \(not defined by Barrage 1.0.0\)"),
    (200, r"unhandled BarrageMessageType: -56 \(byte 0xc8, a value reserved for custom use\)"),
    (127, "unhandled BarrageMessageType: 127"),
])
def test_unknown_message_type_in_wrapper(msg_type, words):
    data = BarrageMessageWrapper(msg_type=msg_type, payload=b"\x00" * 8).to_bytes()
    with pytest.raises(ProtocolError, match=words):
        BarrageMessageWrapper.from_bytes(data)
    with pytest.raises(ProtocolError, match=words):
        unwrap(data)


@pytest.mark.parametrize("msg_type,words", [(0, r"\(NONE\)"), (1, r"\(an unused session"), (3, r"\(an unused session")])
def test_unhandled_message_type_in_unwrap(msg_type, words):
    data = BarrageMessageWrapper(msg_type=msg_type, payload=SubscriptionRequest().to_bytes()).to_bytes()
    assert BarrageMessageWrapper.from_bytes(data).msg_type == msg_type  # a type the schema defines
    with pytest.raises(ProtocolError, match=f"unhandled BarrageMessageType: {msg_type} {words}"):
        unwrap(data)


def test_missing_payload():
    with pytest.raises(ProtocolError, match="UPDATE_METADATA message has no payload"):
        unwrap(BarrageMessageWrapper(msg_type=6, payload=None).to_bytes())


def test_encoding_rejects_out_of_range_values():
    with pytest.raises(ValueError, match="batch_size"):
        SubscriptionRequest(options=SubscriptionOptions(batch_size=2**31)).to_bytes()
    with pytest.raises(ValueError, match="table_size"):
        UpdateMetadata(table_size=2**63).to_bytes()
    with pytest.raises(ValueError, match="msg_type"):
        BarrageMessageWrapper(msg_type=256, payload=b"").to_bytes()


def _vector_start(data: bytes, slot: int) -> int:
    return root(data, "t").vector(slot, "v")[0]


def test_bad_offsets_name_the_field():
    md = UpdateMetadata(added_rows=np.array([[0, 9]]), removed_rows=np.array([[3, 3]]),
                        mod_column_nodes=[np.array([[1, 1]])], table_size=10).to_bytes()
    # the root offset points past the end
    bad = bytearray(md)
    bad[0:4] = struct.pack("<I", len(md) + 40)
    with pytest.raises(ProtocolError, match=r"BarrageUpdateMetadata: table offset \d+ outside"):
        UpdateMetadata.from_bytes(bytes(bad))
    # a vector length far past the end
    bad = bytearray(md)
    start = _vector_start(md, 7)
    bad[start - 4:start] = struct.pack("<I", 0x7FFFFFFF)
    with pytest.raises(ProtocolError, match="removed_rows: vector of 2147483647 elements"):
        UpdateMetadata.from_bytes(bytes(bad))
    # a mod_column_nodes element pointing outside the buffer
    bad = bytearray(md)
    start = _vector_start(md, 10)
    bad[start:start + 4] = struct.pack("<I", 0x10000)
    with pytest.raises(ProtocolError, match=r"mod_column_nodes\[0\]"):
        UpdateMetadata.from_bytes(bytes(bad))
    # too short to hold a root offset and a vtable
    with pytest.raises(ProtocolError, match="too short"):
        UpdateMetadata.from_bytes(b"\x04\x00\x00")


def test_bad_row_set_bytes_name_the_field():
    data = UpdateMetadata().encode_with(added_rows=b"\x08")  # an OFFSET command with no value
    with pytest.raises(ProtocolError, match="BarrageUpdateMetadata.added_rows"):
        UpdateMetadata.from_bytes(data)
    data = UpdateMetadata().encode_with(shift_data=b"\x20\x20")  # two row sets instead of three
    with pytest.raises(ProtocolError, match="BarrageUpdateMetadata.shift_data"):
        UpdateMetadata.from_bytes(data)
    data = UpdateMetadata().encode_with(mod_column_nodes=[b"\x20", b"\x12"])
    with pytest.raises(ProtocolError, match=r"mod_column_nodes\[1\].modified_rows"):
        UpdateMetadata.from_bytes(data)


def test_encode_with_reuses_raw_bytes():
    md = UpdateMetadata(first_seq=1, last_seq=2, added_rows=np.array([[0, 4]]), removed_rows=np.array([[9, 9]]),
                        shift_data=(np.array([10]), np.array([20]), np.array([11])),
                        mod_column_nodes=[np.array([[1, 2]]), np.zeros((0, 2), np.int64)], table_size=5)
    shared = md.encode_with(added_rows=encode_rowset(md.added_rows), shift_data=encode_shifts(*md.shift_data),
                            mod_column_nodes=[encode_rowset(m) for m in md.mod_column_nodes])
    assert shared == md.to_bytes()
    assert UpdateMetadata.from_bytes(md.encode_with(removed_rows=None)).removed_rows is None


# ----------------------------------------------------------------------------------------------
# fuzzing: only ProtocolError may escape
# ----------------------------------------------------------------------------------------------

DECODERS = (unwrap, BarrageMessageWrapper.from_bytes, UpdateMetadata.from_bytes, SubscriptionRequest.from_bytes,
            SnapshotRequest.from_bytes, PublicationRequest.from_bytes)


def _decode_all(raw: bytes) -> None:
    for fn in DECODERS:
        try:
            fn(raw)
        except ProtocolError:
            pass


def _fuzz_corpus() -> list[bytes]:
    base = [wrap(UpdateMetadata(first_seq=3, last_seq=4, effective_viewport=np.array([[0, 9]]),
                                effective_column_set=np.array([0, 2]), added_rows=np.array([[0, 99], [200, 300]]),
                                removed_rows=np.array([[7, 7]]),
                                shift_data=(np.array([400]), np.array([410]), np.array([402])),
                                added_rows_included=np.array([[0, 9]]),
                                mod_column_nodes=[np.array([[5, 5]]), None], table_size=100)),
            wrap(SubscriptionRequest(ticket=b"s/abc", columns=np.array([1, 3]), viewport=np.array([[0, 9]]),
                                     options=SubscriptionOptions(batch_size=4096), subscription_token=b"tok")),
            wrap(SnapshotRequest(ticket=b"e\x01\x00\x00\x00", options=SnapshotOptions(use_deephaven_nulls=True))),
            wrap(PublicationRequest(ticket=b"s/p", options=PublicationOptions(True)))]
    seen = set()
    for m in METAS:  # one of each distinct layout from the captures
        key = (m.folder, m.direction, len(m.raw))
        if key not in seen:
            seen.add(key)
            base.append(m.raw)
    return base


FUZZ = _fuzz_corpus()


def test_every_truncation_raises_protocol_error_only():
    for raw in FUZZ[:4] + [m.raw for m in METAS[:3]]:
        for n in range(len(raw)):
            _decode_all(raw[:n])
        payload = BarrageMessageWrapper.from_bytes(raw).payload
        for n in range(len(payload)):
            _decode_all(payload[:n])


def test_every_single_bit_flip_of_a_golden_update():
    if not METAS:
        pytest.skip("shared/golden not present")
    raw = next(m.raw for m in METAS if m.folder == "ticking_sorted" and m.direction == "S"
               and unwrap(m.raw)[1].shift_data is not None and unwrap(m.raw)[1].shift_data[0].size)
    buf = bytearray(raw)
    outcomes = {"ok": 0, "error": 0}
    for i in range(len(buf)):
        for bit in range(8):
            buf[i] ^= 1 << bit
            try:
                unwrap(bytes(buf))
                outcomes["ok"] += 1
            except ProtocolError:
                outcomes["error"] += 1
            buf[i] ^= 1 << bit
    assert outcomes["error"] > 0 and outcomes["ok"] > 0  # flips in values decode, flips in offsets are caught


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FUZZ), st.data())
def test_fuzz_mutations(base, data):
    raw = bytearray(base)
    for _ in range(data.draw(st.integers(1, 5))):
        op = data.draw(st.sampled_from(["flip", "byte", "truncate", "insert", "offset"]))
        if op == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw)))]
        elif op == "insert":
            i = data.draw(st.integers(0, len(raw)))
            raw[i:i] = data.draw(st.binary(min_size=1, max_size=8))
        elif raw and op == "offset" and len(raw) >= 4:
            i = data.draw(st.integers(0, len(raw) - 4))
            raw[i:i + 4] = struct.pack("<I", data.draw(st.integers(0, 2**32 - 1)))
        elif raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] = data.draw(st.integers(0, 255)) if op == "byte" else raw[i] ^ (1 << data.draw(st.integers(0, 7)))
    _decode_all(bytes(raw))
    # the payload inside a valid wrapper, mutated the same way
    try:
        payload = BarrageMessageWrapper.from_bytes(bytes(base)).payload
    except ProtocolError:
        return
    cut = data.draw(st.integers(0, len(payload)))
    _decode_all(payload[:cut] + bytes(data.draw(st.binary(max_size=16))) + payload[cut + 1:])


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120))
def test_fuzz_random_bytes(raw):
    _decode_all(raw)
