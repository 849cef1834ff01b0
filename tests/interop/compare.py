"""Structural comparison of gRPC captures (golden format, see shared/golden/README.md).

`describe_call(cap_path, method)` turns every message of one call into one normalized line:
FlightData is decoded with `tickwire.protocol.flight`, its Arrow header with
`tickwire.protocol.batches.read_message_header` and its Barrage metadata with
`tickwire.protocol.barrage.unwrap`; the messages of the other services are parsed with
`tickwire.protocol.proto.methods` and printed field by field, with session tokens, UUIDs and
timestamps replaced by placeholders.

`compare_captures(golden_dir, other_dir)` pairs the calls of two capture directories by method
and order and returns the `Difference`s that matter for wire compatibility: the call sequence,
status codes, the `authorization` exchange (Anonymous -> Bearer), the order and kinds of the
FlightData of each stream (schema first and once, metadata on the first FlightData of each
logical message only, no metadata-only FlightData, the body field on every batch), schema
equality (names, types, nullability, metadata), the fields present in each kind of Barrage
message, and the fields of every other message. Values that differ legitimately between two
recordings are normalized away according to `ALLOWED_DIFFERENCES`, the single list of those
rules; pass `allow=` to switch rules off (a stricter comparison) or to choose a subset.
"""
from __future__ import annotations

import difflib
import json
import re
import struct
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol import rowset as rs
from tickwire.protocol.batches import (
    HEADER_DICTIONARY_BATCH,
    HEADER_RECORD_BATCH,
    HEADER_SCHEMA,
    MessageInfo,
    read_message_header,
)
from tickwire.protocol.fbread import root as fb_root
from tickwire.protocol.flight import FlightData, decode_flight_data
from tickwire.protocol.proto.methods import ALL_METHODS, Method
from tickwire.protocol.schema import is_list_wrapper_field, read_schema_message

__all__ = [
    "ALLOWED_DIFFERENCES",
    "DEFAULT_ALLOW",
    "CallEntry",
    "Difference",
    "Record",
    "compare_captures",
    "describe_call",
    "format_differences",
    "load_calls",
    "read_records",
]

# ================================================================================================
# The differences two recordings may legitimately have. Every normalization below is switched by
# one of these names (all on by default); each cites the part of shared/protocol/BARRAGE-WIRE.md
# that allows it.
# ================================================================================================
ALLOWED_DIFFERENCES: dict[str, str] = {
    # §7.1: the server answers `authorization: Anonymous` with `authorization: Bearer <uuid>`, a
    # token minted per session; only the scheme and its use on later calls are compared.
    "bearer_token": "Bearer token values are replaced by <token> (random per session, §7.1)",
    # §7.1: DH clients read the session token from the `authorization` header and nothing else from
    # the headers; the remaining response headers (date, HTTP security headers, vary) describe the
    # HTTP server, so only header names are compared when this rule is off.
    "transport_headers": "response headers other than authorization are not compared (§7.1)",
    # §7.1: the clients read `barrage.version` (and the session duration) from the configuration
    # constants; the other constants (java.version, groovy.version, ...) describe the server.
    "server_constants": "only barrage.version and the presence of http.session.durationMs are compared (§7.1)",
    # §7.8: "tickwire should return the same codes, with messages that say what was wrong" --
    # status codes are compared, status details are not.
    "status_details": "status details (error messages) are not compared, only status codes (§7.8)",
    # §6.7: "Clients must accept any batch split": how the rows of one logical message are divided
    # into RecordBatch FlightData (and each batch's row count) depends on batch_size,
    # max_message_size and the server's chunking.
    "batch_split": "the number of FlightData per logical message and their row counts are not compared (§6.7)",
    # §7.2 item 4 and §7.7 ("piecewise growth is optional ... one logical message ... is the
    # simplest form"): consecutive snapshot pieces that together deliver the rows of `added_rows`
    # are merged into one logical snapshot (rows summed, added_rows_included united, the fields
    # present taken from the final piece) before comparing.
    "snapshot_pieces": "consecutive snapshot pieces are merged into one logical snapshot (§7.2, §7.7)",
    # §7.7 (coalescing: one delta per propagation, at most one per update interval) and the golden
    # README ("the ticking ones carry wall-clock timestamps and random values, so values (and
    # snapshot framing) differ per run"): for refreshing tables the number of delta messages, row
    # counts, row-set sizes, table_size values and first/last_seq values are not compared; field
    # presence per message kind still is. Refreshing = a golden message with a delta or with
    # first_seq != -1 (DH static tables report -1, §2.9, §7.2).
    "ticking_values": "row counts, row-set sizes, seq numbers and delta counts of ticking tables are "
                      "not compared (§7.7)",
}
DEFAULT_ALLOW = frozenset(ALLOWED_DIFFERENCES)

FLIGHT_SERVICE = "arrow.flight.protocol.FlightService"
_FLIGHT_DATA = "arrow.flight.protocol.FlightData"
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_TIME_FIELD = re.compile(r"millis|nanos|micros|deadline|expiration|(^|_)time($|_)")
_CLIENT_READ_CONSTANTS = ("barrage.version", "http.session.durationMs")
_UPDATE_SLOTS = ("first_seq", "last_seq", "is_snapshot", "effective_viewport", "effective_reverse_viewport",
                 "effective_column_set", "added_rows", "removed_rows", "shift_data", "added_rows_included",
                 "mod_column_nodes", "table_size")
_ROWSET_FIELDS = ("effective_viewport", "added_rows", "removed_rows", "added_rows_included")
_SEQ_FIELDS = frozenset({"first_seq", "last_seq"})


# ------------------------------------------------------------------------------------------------
# captures and index files
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Record:
    direction: str  # "C" client to server, "S" server to client
    t_us: int
    payload: bytes


@dataclass(frozen=True)
class Difference:
    """One reported difference. `call` names the golden call (e.g. "#3 FlightService/DoExchange")
    or is "" for the directory as a whole; `aspect` is one of methods, status, auth, headers,
    order, schema, metadata, rows, messages."""

    call: str
    aspect: str
    message: str

    def __str__(self) -> str:
        where = f"{self.call}: " if self.call else ""
        return f"[{self.aspect}] {where}{self.message}"


@dataclass
class CallEntry:
    """One index.json entry."""

    id: int
    method: str  # full path, /package.Service/Method
    file: Path
    status: str = "OK"
    details: str = ""
    request_metadata: list | None = None
    response_initial_metadata: list | None = None
    response_trailing_metadata: list | None = None
    truncated_to_records: int | None = None

    @property
    def short(self) -> str:
        """`FlightService/DoGet` for `/arrow.flight.protocol.FlightService/DoGet`."""
        return _short(self.method)

    @property
    def code(self) -> str:
        """The status code name: "CLIENT_CANCELLED (upstream CANCELLED)" gives CLIENT_CANCELLED."""
        return (self.status or "").split(" ", 1)[0]

    @property
    def label(self) -> str:
        return f"#{self.id} {self.short}"


def _short(method: str) -> str:
    service, _, name = method.lstrip("/").rpartition("/")
    return f"{service.rpartition('.')[2]}/{name}"


def read_records(cap_path: Path) -> list[Record]:
    """The records of a .cap file; a truncated or malformed file raises ProtocolError."""
    data = Path(cap_path).read_bytes()
    out: list[Record] = []
    pos = 0
    while pos < len(data):
        if pos + 13 > len(data):
            raise ProtocolError(f"{cap_path}: truncated record header at byte {pos}")
        direction = chr(data[pos])
        if direction not in "CS":
            raise ProtocolError(f"{cap_path}: record at byte {pos} has direction {direction!r}, expected 'C' or 'S'")
        t_us, length = struct.unpack_from("<QI", data, pos + 1)
        start = pos + 13
        if start + length > len(data):
            raise ProtocolError(f"{cap_path}: record at byte {pos} needs {length} bytes, {len(data) - start} remain")
        out.append(Record(direction, t_us, data[start:start + length]))
        pos = start + length
    return out


def _method_from_file(name: str) -> str:
    m = re.match(r"^\d+_([A-Za-z0-9]+)_([A-Za-z0-9]+)\.cap$", name)
    if not m:
        raise ValueError(f"cannot tell the method from capture file name {name!r}")
    return _resolve_method(f"{m.group(1)}/{m.group(2)}")


def _resolve_method(method: str) -> str:
    """A full method path from a full path, `Service/Method` or `package.Service/Method`."""
    if method.startswith("/") and method in ALL_METHODS:
        return method
    short = _short("/" + method.lstrip("/"))
    for path in ALL_METHODS:
        if _short(path) == short:
            return path
    return "/" + method.lstrip("/")


def load_calls(capture_dir: Path) -> list[CallEntry]:
    """The calls of a capture directory, from index.json (or, without one, from the .cap names)."""
    d = Path(capture_dir)
    index = d / "index.json"
    out: list[CallEntry] = []
    if index.exists():
        for e in json.loads(index.read_text()):
            out.append(CallEntry(
                id=int(e["id"]), method=e["method"], file=d / e["file"], status=e.get("status", ""),
                details=e.get("details", "") or "", request_metadata=e.get("request_metadata"),
                response_initial_metadata=e.get("response_initial_metadata"),
                response_trailing_metadata=e.get("response_trailing_metadata"),
                truncated_to_records=e.get("truncated_to_records")))
    else:
        for p in sorted(d.glob("*.cap")):
            out.append(CallEntry(id=int(p.name.split("_", 1)[0]), method=_method_from_file(p.name), file=p))
    return sorted(out, key=lambda c: c.id)


# ------------------------------------------------------------------------------------------------
# rendering helpers
# ------------------------------------------------------------------------------------------------

def _ranges_text(r: np.ndarray | None, limit: int = 4) -> str:
    if r is None:
        return "absent"
    if len(r) == 0:
        return "{}"
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in r[:limit].tolist()]
    more = f",…+{len(r) - limit} ranges" if len(r) > limit else ""
    return "{" + ",".join(parts) + more + "}"


def _ticket_text(t: bytes | None) -> str:
    if t is None:
        return "absent"
    t = bytes(t)
    if len(t) == 5 and t[:1] == b"e":
        return f"export:{struct.unpack_from('<i', t, 1)[0]}"
    try:
        text = t.decode("utf-8")
        if text.isprintable():
            return text
    except UnicodeDecodeError:
        pass
    return "hex:" + t.hex()


def _bytes_text(b: bytes, limit: int = 48) -> str:
    try:
        text = b.decode("utf-8")
        if text.isprintable():
            return repr(_UUID.sub("<uuid>", text))
    except UnicodeDecodeError:
        pass
    h = b[:limit].hex()
    return f"hex:{h}" + (f"…({len(b)}B)" if len(b) > limit else "")


def _md_text(md) -> str:
    if not md:
        return "{}"
    items = sorted((k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                   for k, v in md.items())
    return "{" + ", ".join(f"{k}={v}" for k, v in items) + "}"


def _field_text(f: pa.Field) -> str:
    null = "" if f.nullable else " not-null"
    return f"{f.name}:{f.type}{null}{_md_text(f.metadata) if f.metadata else ''}"


def _schema_text(s: pa.Schema) -> str:
    return f"Schema[{len(s)}]({'; '.join(_field_text(f) for f in s)}) md{_md_text(s.metadata)}"


# ------------------------------------------------------------------------------------------------
# FlightData analysis
# ------------------------------------------------------------------------------------------------

@dataclass
class _FD:
    """One decoded FlightData record."""

    n: int  # record number in the call, 1-based over both directions
    direction: str
    error: str | None = None
    descriptor: str | None = None
    kind: str = "none"  # none | Schema | RecordBatch | DictionaryBatch | invalid
    info: MessageInfo | None = None
    schema: pa.Schema | None = None
    body_len: int | None = None  # None: no data_body field
    md_type: str | None = None  # None: no app_metadata
    md: Any = None
    md_present: frozenset = frozenset()

    def text(self) -> str:
        if self.error is not None:
            return f"FlightData invalid: {self.error}"
        parts = ["FlightData"]
        if self.descriptor is not None:
            parts.append(f"descriptor={self.descriptor}")
        if self.kind == "Schema":
            parts.append(f"header={_schema_text(self.schema)}" if self.schema is not None
                         else "header=Schema(unreadable)")
        elif self.kind in ("RecordBatch", "DictionaryBatch"):
            i = self.info
            nodes = ",".join(f"({a},{b})" for a, b in i.nodes.tolist())
            lens = i.buffers[:, 1] if len(i.buffers) else np.zeros(0, np.int64)
            parts.append(f"header={self.kind} length={i.length} nodes=[{nodes}] buffers={len(i.buffers)} "
                         f"lengths=[{','.join(map(str, lens.tolist()))}] layout={_layout(i)} "
                         f"body_length={i.body_length}")
            if self.kind == "DictionaryBatch":
                parts.append(f"dictionary_id={i.dictionary_id} is_delta={i.is_delta}")
        elif self.kind == "invalid":
            parts.append(f"header=invalid({self.info})")
        else:
            parts.append("header=absent")
        if self.md_type is not None:
            parts.append(f"app_metadata={_barrage_text(self.md_type, self.md, self.md_present)}")
        parts.append("body=absent" if self.body_len is None else f"body={self.body_len}B")
        return " ".join(parts)


def _layout(i: MessageInfo) -> str:
    """"pad8" when every buffer length is a multiple of 8 and buffers follow each other from offset 0
    with body_length their sum (Deephaven's layout, §5.7); otherwise what breaks it."""
    b = i.buffers
    if len(b) == 0:
        return "pad8" if i.body_length == 0 else f"no-buffers-body-{i.body_length}"
    ends = b[:, 0] + b[:, 1]
    starts_ok = b[0, 0] == 0 and np.array_equal(b[1:, 0], ends[:-1])
    pad_ok = not np.any(b[:, 1] % 8)
    total_ok = int(ends[-1]) == i.body_length
    if starts_ok and pad_ok and total_ok:
        return "pad8"
    return ",".join(n for n, ok in (("gaps", starts_ok), ("unpadded", pad_ok), ("body-length", total_ok)) if not ok)


def _present_slots(payload: bytes) -> frozenset:
    """Names of the BarrageUpdateMetadata fields written on the wire (vtable entry non-zero)."""
    t = fb_root(payload, "BarrageUpdateMetadata")
    out = set()
    for slot, name in enumerate(_UPDATE_SLOTS):
        o = 4 + 2 * slot
        if o + 2 <= t.vt_len and struct.unpack_from("<H", t.buf, t.vt + o)[0]:
            out.add(name)
    return frozenset(out)


def _barrage_text(md_type: str, md, present: frozenset) -> str:
    if md is None:
        return md_type
    if isinstance(md, barrage.UpdateMetadata):
        items = []
        for name in _UPDATE_SLOTS:
            v = getattr(md, name)
            if name in _SEQ_FIELDS:
                items.append(f"{name}={'-1' if v == -1 else '<seq>'}" if name in present else f"{name}=absent")
            elif name in ("is_snapshot", "effective_reverse_viewport"):
                items.append(f"{name}={bool(v)}")
            elif name == "table_size":
                items.append(f"table_size={v}" if name in present else "table_size=absent")
            elif name == "effective_column_set":
                items.append(f"{name}=absent" if v is None else f"{name}={v.tolist()}")
            elif name == "shift_data":
                items.append("shift_data=absent" if v is None else f"shift_data={len(v[0])} shifts")
            elif name == "mod_column_nodes":
                if v is None:
                    items.append("mod_column_nodes=absent")
                else:
                    sizes = [None if m is None else rs.rowset_size(m) for m in v]
                    items.append(f"mod_column_nodes={len(v)} sizes={sizes}")
            else:
                items.append(f"{name}=absent" if v is None else f"{name}={rs.rowset_size(v)} {_ranges_text(v)}")
        return f"{md_type}(" + " ".join(items) + ")"
    if isinstance(md, (barrage.SubscriptionRequest, barrage.SnapshotRequest, barrage.PublicationRequest)):
        items = [f"ticket={_ticket_text(md.ticket)}"]
        for name in ("columns", "viewport"):
            if hasattr(md, name):
                v = getattr(md, name)
                if name == "columns":
                    items.append("columns=absent" if v is None else f"columns={v.tolist()}")
                else:
                    items.append(f"viewport={_ranges_text(v)}")
        if hasattr(md, "reverse_viewport"):
            items.append(f"reverse_viewport={md.reverse_viewport}")
        if getattr(md, "subscription_token", None) is not None:
            items.append("subscription_token=<token>")
        opts = md.options
        if opts is None:
            items.append("options=absent")
        else:
            items.append("options{" + " ".join(f"{f}={getattr(opts, f)}" for f in opts.__dataclass_fields__) + "}")
        return f"{md_type}(" + " ".join(items) + ")"
    return md_type


def _decode_fd(n: int, direction: str, payload: bytes) -> _FD:
    fd = _FD(n, direction)
    try:
        raw: FlightData = decode_flight_data(payload)
    except ProtocolError as e:
        fd.error = str(e)
        return fd
    if raw.descriptor is not None:
        d = raw.descriptor
        fd.descriptor = (f"PATH{d.path}" if d.is_path else f"CMD {_bytes_text(d.cmd)}" if d.is_command
                         else "UNKNOWN")
    fd.body_len = None if raw.data_body is None else len(raw.data_body)
    if raw.data_header:
        try:
            info = read_message_header(raw.data_header)
            fd.info = info
            if info.header_type == HEADER_SCHEMA:
                fd.kind = "Schema"
                try:
                    fd.schema = read_schema_message(raw.data_header)
                except (ProtocolError, pa.ArrowException) as e:
                    fd.error = f"unreadable schema: {e}"
            elif info.header_type == HEADER_RECORD_BATCH:
                fd.kind = "RecordBatch"
            elif info.header_type == HEADER_DICTIONARY_BATCH:
                fd.kind = "DictionaryBatch"
        except ProtocolError as e:
            fd.kind, fd.info = "invalid", str(e)
    if raw.app_metadata is not None:
        try:
            kind, md = barrage.unwrap(raw.app_metadata)
            fd.md_type, fd.md = kind.name, md
            if kind == barrage.BarrageMessageType.UPDATE_METADATA:
                w = barrage.BarrageMessageWrapper.from_bytes(raw.app_metadata)
                fd.md_present = _present_slots(w.payload)
        except ProtocolError as e:
            fd.md_type = f"invalid({e})"
    return fd


def _column_nodes(schema: pa.Schema | None, list_mode: bool) -> list[int] | None:
    """Index of the field node that holds each column's row count (the child node in list mode)."""
    if schema is None:
        return None

    def count(t: pa.DataType) -> int:
        return 1 + sum(count(t.field(i).type) for i in range(t.num_fields))

    out, pos = [], 0
    for f in schema:
        out.append(pos + 1 if list_mode else pos)
        pos += count(f.type)
    return out


@dataclass
class _Msg:
    """One logical Barrage message (or one plain Arrow batch when there is no metadata)."""

    first: int  # record number of its first FlightData
    md: barrage.UpdateMetadata | None
    md_type: str | None
    present: frozenset
    n_fd: int = 0
    batch_rows: list = field(default_factory=list)
    add_rows: int = 0
    mod_rows: list = field(default_factory=list)
    adds_left: int = 0
    mods_left: list = field(default_factory=list)
    included: np.ndarray | None = None  # rows delivered (added_rows_included, else added_rows)
    pieces: int = 1

    @property
    def complete(self) -> bool:
        return self.adds_left <= 0 and all(m <= 0 for m in self.mods_left)

    @property
    def kind(self) -> str:
        if self.md is None:
            return "plain" if self.md_type is None else f"barrage:{self.md_type}"
        return "snapshot" if self.md.is_snapshot else "delta"


@dataclass
class _Stream:
    """The FlightData of one call in one direction, analysed."""

    fds: list
    schema: pa.Schema | None = None
    list_mode: bool = False
    messages: list = field(default_factory=list)
    issues: list = field(default_factory=list)  # (category, text)


def _analyse_stream(fds: list[_FD], list_mode: bool | None, *, finished: bool) -> _Stream:
    """Groups a direction's FlightData into logical messages and notes every framing rule broken."""
    st = _Stream(fds)
    issue = st.issues.append
    schemas = [f for f in fds if f.kind == "Schema"]
    batches = [f for f in fds if f.kind == "RecordBatch"]
    if schemas:
        st.schema = schemas[0].schema
    if list_mode is None:
        list_mode = bool(st.schema is not None and len(st.schema) and all(is_list_wrapper_field(f) for f in st.schema))
    st.list_mode = list_mode
    col_nodes = _column_nodes(st.schema, list_mode)
    if batches and not schemas:
        issue(("no_schema", f"no Schema FlightData before the record batches (first batch is record #{batches[0].n})"))
    if len(schemas) > 1:
        records = ", ".join(f"#{s.n}" for s in schemas)
        issue(("second_schema", f"{len(schemas)} Schema FlightData (records {records}); the schema is sent once"))
    data_fds = [f for f in fds if f.kind != "none" or f.md_type is not None or f.error is not None]
    if schemas and data_fds and data_fds[0] is not schemas[0]:
        first = data_fds[0]
        text = (f"the first FlightData with content is record #{first.n} ({first.kind}), "
                f"not the Schema (record #{schemas[0].n})")
        issue(("schema_not_first", text))
    cur: _Msg | None = None
    barrage_stream = False
    for f in fds:
        if f.error is not None:
            issue(("invalid", f"record #{f.n}: {f.error}"))
            continue
        if f.md_type is not None and f.md_type.startswith("invalid"):
            issue(("bad_metadata", f"record #{f.n}: app_metadata {f.md_type}"))
        if f.kind == "invalid":
            issue(("invalid", f"record #{f.n}: Arrow header {f.info}"))
            continue
        if f.kind == "none":
            if f.md_type is not None and f.direction == "S":
                issue(("metadata_only", f"record #{f.n}: metadata-only FlightData ({f.md_type}, no data_header)"))
            continue
        if f.kind in ("Schema", "DictionaryBatch"):
            if f.kind == "Schema" and f.md_type is not None:
                issue(("metadata_on_schema", f"record #{f.n}: the Schema FlightData carries app_metadata"))
            continue
        # a RecordBatch
        if f.body_len is None:
            issue(("no_body", f"record #{f.n}: RecordBatch FlightData without the data_body field"))
        if col_nodes is not None and col_nodes and max(col_nodes) >= len(f.info.nodes):
            issue(("nodes", f"record #{f.n}: {len(f.info.nodes)} field nodes, the schema needs {max(col_nodes) + 1}"))
            per_col = f.info.nodes[:, 0]
        else:
            per_col = f.info.nodes[col_nodes, 0] if col_nodes is not None else f.info.nodes[:, 0]
        rows = int(per_col.max()) if len(per_col) else 0
        if f.md_type is not None:
            if cur is not None and not cur.complete:
                due = f"{max(cur.adds_left, 0)} add rows and {sum(max(m, 0) for m in cur.mods_left)} mod rows"
                issue(("metadata_inside_message",
                       (f"record #{f.n}: app_metadata on a FlightData inside the message begun at record "
                        f"#{cur.first} ({due} still due); metadata belongs on the first FlightData of a message "
                        "only")))
            cur = _start_message(f, len(per_col))
            st.messages.append(cur)
            barrage_stream = True
        elif cur is None or cur.complete:
            if barrage_stream:
                issue(("metadata_missing", f"record #{f.n}: a new message starts without app_metadata"))
            cur = _Msg(f.n, None, None, frozenset(), adds_left=-1, mods_left=[0] * len(per_col))
            st.messages.append(cur)
        cur.n_fd += 1
        cur.batch_rows.append(rows)
        if cur.adds_left < 0:  # a plain batch is a message of its own
            cur.add_rows += rows
            cur.adds_left = 0
        elif cur.adds_left > 0:
            if rows > cur.adds_left:
                issue(("rows", f"record #{f.n}: add batch of {rows} rows where {cur.adds_left} remained"))
            cur.adds_left -= rows
            cur.add_rows += rows
        else:
            n = min(len(per_col), len(cur.mods_left))
            counts = per_col[:n].tolist()
            over = [c for c in range(n) if counts[c] > cur.mods_left[c]]
            if over:
                issue(("rows", f"record #{f.n}: mod batch exceeds the modified rows of column(s) {over}"))
            for c in range(n):
                cur.mods_left[c] -= counts[c]
                cur.mod_rows[c] += counts[c]
    if finished and cur is not None and not cur.complete:
        issue(("incomplete", f"the stream ends inside the message begun at record #{cur.first}"))
    return st


def _start_message(f: _FD, ncols: int) -> _Msg:
    md = f.md if isinstance(f.md, barrage.UpdateMetadata) else None
    m = _Msg(f.n, md, f.md_type, f.md_present)
    if md is None:
        m.adds_left, m.mods_left = -1, [0] * ncols
        return m
    m.adds_left = md.num_adds()
    counts = md.mod_counts()
    m.mods_left = list(counts) if counts else [0] * ncols
    m.mod_rows = [0] * len(m.mods_left)
    m.included = md.added_rows_included if md.added_rows_included is not None else md.added_rows
    return m


def _union(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    r = np.concatenate([np.asarray(a, np.int64).reshape(-1, 2), np.asarray(b, np.int64).reshape(-1, 2)])
    if len(r) == 0:
        return r
    r = r[np.argsort(r[:, 0], kind="stable")]
    ends = np.maximum.accumulate(r[:, 1])
    new = np.ones(len(r), dtype=bool)
    new[1:] = r[1:, 0] > ends[:-1] + 1
    idx = np.flatnonzero(new)
    last = np.append(idx[1:] - 1, len(r) - 1)
    return np.stack((r[idx, 0], ends[last]), axis=1)


def _merge_snapshot_pieces(msgs: list[_Msg]) -> list[_Msg]:
    """Consecutive snapshot messages that share `added_rows` and deliver disjoint rows until the
    whole of `added_rows` is delivered become one logical snapshot (§7.2, §7.7)."""
    out: list[_Msg] = []
    for m in msgs:
        prev = out[-1] if out else None
        if (prev is not None and prev.md is not None and m.md is not None and prev.md.is_snapshot
                and m.md.is_snapshot and prev.complete and prev.md.added_rows is not None
                and m.md.added_rows is not None and np.array_equal(prev.md.added_rows, m.md.added_rows)
                and prev.included is not None and m.included is not None
                and rs.rowset_size(prev.included) < rs.rowset_size(prev.md.added_rows)):
            union = _union(prev.included, m.included)
            if rs.rowset_size(union) == rs.rowset_size(prev.included) + rs.rowset_size(m.included):
                merged = _Msg(prev.first, m.md, m.md_type, m.present, n_fd=prev.n_fd + m.n_fd,
                              batch_rows=prev.batch_rows + m.batch_rows, add_rows=prev.add_rows + m.add_rows,
                              mod_rows=(list(np.add(prev.mod_rows, m.mod_rows)) if len(prev.mod_rows) == len(m.mod_rows)
                                        else m.mod_rows),
                              adds_left=m.adds_left, mods_left=m.mods_left,
                              included=union, pieces=prev.pieces + m.pieces)
                out[-1] = merged
                continue
        out.append(m)
    return out


# ------------------------------------------------------------------------------------------------
# protobuf messages of the other services
# ------------------------------------------------------------------------------------------------

def _pb_items(msg, schemas: list | None) -> list[str]:
    """One `name=value` item per top-level field (per element for repeated fields, `name[key]=` for
    maps), with tokens, UUIDs and times replaced by placeholders. Schemas are written out in full,
    or as `<schema #k>` with the schema appended to `schemas` when a list is given."""
    items = []
    for fd, value in msg.ListFields():
        if fd.is_repeated:
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                for k in sorted(value):
                    shown = _pb_value(fd.message_type.fields_by_name["value"], value[k], schemas)
                    items.append(f"{fd.name}[{k}]={shown}")
            else:
                items.extend(f"{fd.name}={_pb_value(fd, v, schemas)}" for v in value)
        else:
            items.append(f"{fd.name}={_pb_value(fd, value, schemas)}")
    return items


def _pb_value(fd, value, schemas: list | None) -> str:
    name = fd.name
    if fd.message_type is not None:
        return "{" + ", ".join(_pb_items(value, schemas)) + "}"
    if isinstance(value, bytes):
        if name in ("schema", "schema_header"):
            try:
                s = read_schema_message(value)
            except ProtocolError as e:
                return f"<bad schema: {e}>"
            if schemas is None:
                return _schema_text(s)
            schemas.append(s)
            return f"<schema #{len(schemas)}>"
        if name == "ticket":
            return _ticket_text(value)
        if "token" in name or name == "payload":
            return "<token>"
        return _bytes_text(value)
    if isinstance(value, str):
        return repr(_UUID.sub("<uuid>", value))
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int) and _TIME_FIELD.search(name):
        return "<time>"
    if fd.enum_type is not None:
        ev = fd.enum_type.values_by_number.get(value)
        return ev.name if ev is not None else str(value)
    return str(value)


# ------------------------------------------------------------------------------------------------
# a call, analysed
# ------------------------------------------------------------------------------------------------

@dataclass
class _CallView:
    entry: CallEntry
    method: Method | None
    records: list
    flight: bool = False  # messages are FlightData (DoGet, DoExchange, DoPut)
    client: _Stream | None = None
    server: _Stream | None = None
    pb: dict = field(default_factory=dict)  # direction -> list of (type name, items, schemas)
    errors: list = field(default_factory=list)


def _is_flight_data(method: Method | None, direction: str) -> bool:
    if method is None:
        return False
    cls = method.request if direction == "C" else method.response
    return cls.DESCRIPTOR.full_name == _FLIGHT_DATA


def _view(entry: CallEntry, limit: int | None = None) -> _CallView:
    method = ALL_METHODS.get(_resolve_method(entry.method))
    records = read_records(entry.file)
    truncated = entry.truncated_to_records is not None or limit is not None
    if limit is not None:
        records = records[:limit]
    v = _CallView(entry, method, records)
    if method is None:
        v.errors.append(f"unknown method {entry.method}")
        return v
    v.flight = _is_flight_data(method, "C") or _is_flight_data(method, "S")
    fds: dict[str, list[_FD]] = {"C": [], "S": []}
    for n, r in enumerate(records, 1):
        if _is_flight_data(method, r.direction):
            fds[r.direction].append(_decode_fd(n, r.direction, r.payload))
        else:
            schemas: list = []
            try:
                parse = method.parse_request if r.direction == "C" else method.parse_response
                msg = parse(r.payload)
                v.pb.setdefault(r.direction, []).append(
                    (type(msg).__name__, _pb_items(msg, schemas), schemas, _pb_items(msg, None)))
            except ProtocolError as e:
                v.pb.setdefault(r.direction, []).append(("invalid", [str(e)], [], [str(e)]))
    if v.flight:
        list_mode = None
        for f in fds["C"]:
            if isinstance(f.md, barrage.SubscriptionRequest):
                list_mode = bool(f.md.options is not None and f.md.options.columns_as_list)
                break
        if method.name == "DoGet":
            list_mode = False
        finished = entry.code == "OK" and not truncated
        v.client = _analyse_stream(fds["C"], None, finished=finished)
        v.server = _analyse_stream(fds["S"], list_mode, finished=finished)
    return v


def _describe_records(v: _CallView) -> list[str]:
    lines = []
    pb_iter = {d: iter(v.pb.get(d, [])) for d in "CS"}
    fd_iter = {d: iter(s.fds) if s is not None else iter(()) for d, s in (("C", v.client), ("S", v.server))}
    for n, r in enumerate(v.records, 1):
        prefix = f"{r.direction} #{n}"
        if v.method is not None and _is_flight_data(v.method, r.direction):
            lines.append(f"{prefix} {next(fd_iter[r.direction]).text()}")
        elif v.method is not None:
            name, _, _, items = next(pb_iter[r.direction])
            lines.append(f"{prefix} {name} {'; '.join(items)}".rstrip())
        else:
            lines.append(f"{prefix} {len(r.payload)}B (unknown method)")
    return lines


def describe_call(cap_path: Path, method: str | None = None) -> list[str]:
    """One normalized line per message of a call: `<C|S> #<n> <description>`.

    `method` is the full path (`/arrow.flight.protocol.FlightService/DoGet`), `Service/Method`, or
    None to take it from the file name (`0001_FlightService_DoGet.cap`)."""
    cap_path = Path(cap_path)
    full = _resolve_method(method) if method else _method_from_file(cap_path.name)
    if full not in ALL_METHODS:
        raise ValueError(f"unknown gRPC method {method!r}")
    entry = CallEntry(id=0, method=full, file=cap_path, status="OK")
    v = _view(entry)
    # the describe view never truncates and treats the stream as finished only for its own lines
    return _describe_records(v)


# ------------------------------------------------------------------------------------------------
# comparing
# ------------------------------------------------------------------------------------------------

def _header(md: list | None, name: str) -> str | None:
    for k, v in md or ():
        if k.lower() == name:
            return v
    return None


def _auth_value(v: str | None, allow: frozenset) -> str:
    if v is None:
        return "<none>"
    if "bearer_token" in allow:
        m = re.match(r"^(\S+)\s+\S+", v)
        if m and m.group(1).lower() == "bearer":
            return "Bearer <token>"
    return v


def _schema_diffs(g: pa.Schema | None, o: pa.Schema | None, where: str) -> list[str]:
    if g is None and o is None:
        return []
    if g is None or o is None:
        return [f"{where}: schema {'missing in other' if o is None else 'present in other but not in golden'}"]
    out = []
    if g.names != o.names:
        out.append(f"{where}: field names differ: golden {g.names}, other {o.names}")
    if sorted(g.names) == sorted(o.names) or len(set(g.names)) != len(g.names) or len(set(o.names)) != len(o.names):
        pairs = [(g.field(i), o.field(i)) for i in range(min(len(g), len(o)))]
    else:  # different columns: compare the ones both have, by name
        pairs = [(g.field(n), o.field(n)) for n in g.names if n in set(o.names)]
    for gf, of in pairs:
        out.extend(_field_diffs(gf, of, f"{where}: field {gf.name!r}"))
    out.extend(_metadata_diffs(g.metadata, o.metadata, f"{where}: schema metadata"))
    return out


def _field_diffs(g: pa.Field, o: pa.Field, where: str) -> list[str]:
    out = []
    if g.name != o.name:
        out.append(f"{where}: named {g.name!r} in golden, {o.name!r} in other")
    if g.type != o.type:
        out.append(f"{where}: type {g.type} in golden, {o.type} in other")
    if g.nullable != o.nullable:
        out.append(f"{where}: nullable={g.nullable} in golden, {o.nullable} in other")
    out.extend(_metadata_diffs(g.metadata, o.metadata, f"{where} metadata"))
    if g.type.num_fields == o.type.num_fields:
        for i in range(g.type.num_fields):
            out.extend(_field_diffs(g.type.field(i), o.type.field(i), f"{where} child {i}"))
    return out


def _metadata_diffs(g, o, where: str) -> list[str]:
    def norm(md):
        return {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in (md or {}).items()}

    gm, om = norm(g), norm(o)
    out = []
    for k in sorted(gm.keys() - om.keys()):
        out.append(f"{where}: key {k!r} missing in other (golden {gm[k]!r})")
    for k in sorted(om.keys() - gm.keys()):
        out.append(f"{where}: key {k!r} only in other ({om[k]!r})")
    for k in sorted(gm.keys() & om.keys()):
        if gm[k] != om[k]:
            out.append(f"{where}: key {k!r} is {gm[k]!r} in golden, {om[k]!r} in other")
    return out


def _is_ticking(msgs: list[_Msg]) -> bool:
    return any(m.md is not None and (not m.md.is_snapshot or m.md.first_seq != -1 or m.md.last_seq != -1)
               for m in msgs)


def _shape(m: _Msg, ticking: bool) -> tuple:
    """What must match between two messages of the same kind: the wire-present metadata fields
    (seq fields only as static -1 vs a step when ticking), the flag values and the mod node count."""
    present = set(m.present)
    seq = None
    if m.md is not None:
        if ticking:
            present -= _SEQ_FIELDS
        seq = "static" if (m.md.first_seq == -1 and m.md.last_seq == -1) else "step"
    mods = None if m.md is None or m.md.mod_column_nodes is None else len(m.md.mod_column_nodes)
    rev = None if m.md is None else bool(m.md.effective_reverse_viewport)
    return (m.kind, tuple(sorted(present)), seq, rev, mods)


def _shape_diffs(g: _Msg, o: _Msg, ticking: bool, where: str) -> list[str]:
    out = []
    if g.kind != o.kind:
        return [f"{where}: a {g.kind} message in golden, a {o.kind} message in other (record #{o.first})"]
    gs, os_ = _shape(g, ticking), _shape(o, ticking)
    for name in sorted(set(gs[1]) | set(os_[1]), key=_UPDATE_SLOTS.index):
        if (name in gs[1]) != (name in os_[1]):
            state = "present in golden, absent in other" if name in gs[1] else "absent in golden, present in other"
            out.append(f"{where}: metadata field {name} {state} (other record #{o.first})")
    if gs[2] != os_[2]:
        out.append(f"{where}: first/last_seq {gs[2]} in golden, {os_[2]} in other")
    if gs[3] != os_[3]:
        out.append(f"{where}: effective_reverse_viewport {gs[3]} in golden, {os_[3]} in other")
    if gs[4] != os_[4]:
        out.append(f"{where}: {gs[4]} mod_column_nodes in golden, {os_[4]} in other")
    return out


def _count_diffs(g: _Msg, o: _Msg, where: str, allow: frozenset) -> list[str]:
    out = []
    if g.add_rows != o.add_rows:
        out.append(f"{where}: {g.add_rows} added data rows in golden, {o.add_rows} in other")
    if g.mod_rows != o.mod_rows:
        out.append(f"{where}: modified data rows per column {g.mod_rows} in golden, {o.mod_rows} in other")
    if g.md is not None and o.md is not None:
        for name in _ROWSET_FIELDS:
            gv, ov = getattr(g.md, name), getattr(o.md, name)
            if name == "added_rows_included":
                gv, ov = g.included, o.included
            gsz = None if gv is None else rs.rowset_size(gv)
            osz = None if ov is None else rs.rowset_size(ov)
            if gsz != osz:
                out.append(f"{where}: {name} holds {gsz} rows in golden, {osz} in other")
        if g.md.table_size != o.md.table_size:
            out.append(f"{where}: table_size {g.md.table_size} in golden, {o.md.table_size} in other")
    if "batch_split" not in allow and g.batch_rows != o.batch_rows:
        out.append(f"{where}: batches of {g.batch_rows} rows in golden, {o.batch_rows} in other")
    return out


def _requested_sets(g: _Msg, o: _Msg, where: str) -> list[str]:
    """effective_column_set and (viewport) effective_viewport follow the request, not the data."""
    out = []
    if g.md is None or o.md is None:
        return out
    gc, oc = g.md.effective_column_set, o.md.effective_column_set
    if gc is not None and oc is not None and not np.array_equal(gc, oc):
        out.append(f"{where}: effective_column_set {gc.tolist()} in golden, {oc.tolist()} in other")
    gv, ov = g.md.effective_viewport, o.md.effective_viewport
    if gv is not None and ov is not None and not np.array_equal(gv, ov):
        out.append(f"{where}: effective_viewport {_ranges_text(gv)} in golden, {_ranges_text(ov)} in other")
    return out


def _collapse(kinds: Sequence[str]) -> list[str]:
    out: list[str] = []
    for k in kinds:
        if not out or out[-1] != k:
            out.append(k)
    return out


def _compare_flight(g: _CallView, o: _CallView, allow: frozenset) -> list[tuple[str, str]]:
    """(aspect, message) pairs for one FlightData call."""
    out: list[tuple[str, str]] = []
    # client messages: the same client sends the same requests
    for d, gs, os_ in (("client", g.client, o.client), ("server", g.server, o.server)):
        g_issues = {c for c, _ in gs.issues}
        for cat, text in os_.issues:
            if cat not in g_issues:
                out.append(("order", f"{d} stream: {text}"))
        for diff in _schema_diffs(gs.schema, os_.schema, f"{d} schema"):
            out.append(("schema", diff))
    gl = [f.text() for f in g.client.fds]
    ol = [f.text() for f in o.client.fds]
    if gl != ol:
        out.extend(("messages", f"client FlightData: {x}") for x in _seq_diff(gl, ol))
    # server messages
    gm, om = g.server.messages, o.server.messages
    if "snapshot_pieces" in allow:
        gm, om = _merge_snapshot_pieces(gm), _merge_snapshot_pieces(om)
    ticking = _is_ticking(gm) and "ticking_values" in allow
    if not ticking:
        if len(gm) != len(om):
            gkinds = ", ".join(m.kind for m in gm) or "none"
            okinds = ", ".join(m.kind for m in om) or "none"
            out.append(("messages", f"{len(gm)} logical messages in golden ({gkinds}), {len(om)} in other ({okinds})"))
        for i, (a, b) in enumerate(zip(gm, om), 1):
            where = f"message {i} ({a.kind})"
            out.extend(("metadata", x) for x in _shape_diffs(a, b, False, where))
            out.extend(("metadata", x) for x in _requested_sets(a, b, where))
            out.extend(("rows", x) for x in _count_diffs(a, b, where, allow))
        return out
    gk, ok = _collapse([m.kind for m in gm]), _collapse([m.kind for m in om])
    if gk != ok:
        out.append(("messages", f"message kinds in order: golden {' '.join(gk)}, other {' '.join(ok) or 'none'}"))
    gsnap = [m for m in gm if m.kind == "snapshot"]
    osnap = [m for m in om if m.kind == "snapshot"]
    if len(gsnap) != len(osnap):
        out.append(("messages", f"{len(gsnap)} snapshot messages in golden, {len(osnap)} in other"))
    for i, (a, b) in enumerate(zip(gsnap, osnap), 1):
        where = f"snapshot {i}"
        out.extend(("metadata", x) for x in _shape_diffs(a, b, True, where))
        out.extend(("metadata", x) for x in _requested_sets(a, b, where))
    gd = [m for m in gm if m.kind != "snapshot"]
    od = [m for m in om if m.kind != "snapshot"]
    if gd and not od:
        out.append(("messages", f"golden has {len(gd)} delta messages, other none"))
    if od and not gd:
        out.append(("messages", f"other has {len(od)} delta messages (first at record #{od[0].first}), golden none"))
    seen = {}
    for m in gd:
        seen.setdefault(_shape(m, True), m)
    reported = set()
    for m in od:
        s = _shape(m, True)
        if s in seen or s in reported or not gd:
            continue
        reported.add(s)
        ref = next((x for x in gd if x.kind == m.kind), gd[0])
        out.extend(("metadata", x) for x in _shape_diffs(ref, m, True, f"{m.kind} message at record #{m.first}"))
    return out


def _seq_diff(g: list[str], o: list[str]) -> list[str]:
    out = []
    sm = difflib.SequenceMatcher(a=g, b=o, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag in ("replace", "delete"):
            out.extend(f"golden #{i + 1} {g[i]!r} not in other" for i in range(i1, i2))
        if tag in ("replace", "insert"):
            out.extend(f"other #{j + 1} {o[j]!r} not in golden" for j in range(j1, j2))
    return out


def _normalize_items(type_name: str, items: list[str], allow: frozenset) -> list[str]:
    if type_name == "ConfigurationConstantsResponse" and "server_constants" in allow:
        kept = []
        for it in items:
            m = re.match(r"^config_values\[([^\]]*)\]=", it)
            if m and m.group(1) in _CLIENT_READ_CONSTANTS:
                kept.append(it if m.group(1) == "barrage.version" else f"config_values[{m.group(1)}]=<value>")
            elif not m:
                kept.append(it)
        return kept
    if type_name == "ExportedTableCreationResponse" and "ticking_values" in allow and "is_static=true" not in items:
        # proto3 leaves out a size of 0, so the item is dropped rather than replaced
        return [it for it in items if not it.startswith("size=")]
    return items


def _compare_pb(g: _CallView, o: _CallView, allow: frozenset) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for d, label in (("C", "request"), ("S", "response")):
        gl, ol = g.pb.get(d, []), o.pb.get(d, [])
        if len(gl) != len(ol):
            out.append(("messages", f"{len(gl)} {label} messages in golden, {len(ol)} in other"))
        for i, ((gt, gi, gs, _), (ot, oi, os_, _)) in enumerate(zip(gl, ol), 1):
            where = f"{label} {i}"
            if gt != ot:
                out.append(("messages", f"{where}: {gt} in golden, {ot} in other"))
                continue
            gc = Counter(_normalize_items(gt, gi, allow))
            oc = Counter(_normalize_items(ot, oi, allow))
            for it in sorted((gc - oc).elements()):
                out.append(("messages", f"{where} ({gt}): {it} missing in other"))
            for it in sorted((oc - gc).elements()):
                out.append(("messages", f"{where} ({ot}): {it} only in other"))
            for k, (a, b) in enumerate(zip(gs, os_), 1):
                out.extend(("schema", x) for x in _schema_diffs(a, b, f"{where} ({gt}) schema #{k}"))
            if len(gs) != len(os_):
                out.append(("schema", f"{where} ({gt}): {len(gs)} schemas in golden, {len(os_)} in other"))
    return out


def _select(gcalls: list[CallEntry], calls) -> list[CallEntry]:
    if calls is None:
        return gcalls
    ids, names = set(), []
    for c in calls:
        if isinstance(c, int):
            ids.add(c)
        else:
            names.append(str(c))

    def named(e: CallEntry) -> bool:
        return any(e.method == n or e.short == n or e.short.endswith("/" + n) or e.short == n.lstrip("/")
                   for n in names)

    return [e for e in gcalls if e.id in ids or named(e)]


def _ranks(calls: list[CallEntry]) -> dict[tuple[str, int], CallEntry]:
    seen: Counter = Counter()
    out = {}
    for c in calls:
        out[(c.short, seen[c.short])] = c
        seen[c.short] += 1
    return out


def _rank_of(calls: list[CallEntry]) -> dict[int, tuple[str, int]]:
    return {c.id: k for k, c in _ranks(calls).items()}


def compare_captures(golden_dir: Path, other_dir: Path, *, calls: Iterable | None = None,
                     allow: Iterable[str] = DEFAULT_ALLOW) -> list[Difference]:
    """Differences between two capture directories, golden first.

    Calls are paired by method and order: the k-th call of a method in `golden_dir` with the k-th
    call of the same method in `other_dir`. `calls` limits the comparison to some golden calls,
    given by id (int) or by method (`"DoGet"`, `"FlightService/DoGet"` or the full path); the other
    directory's calls are then limited to the partners of those. `allow` names the rules of
    `ALLOWED_DIFFERENCES` to apply (all by default; pass a subset for a stricter comparison). A
    golden call recorded with `truncated_to_records: N` is compared on the first N records of both.
    """
    allow = frozenset(allow)
    unknown = allow - DEFAULT_ALLOW
    if unknown:
        raise ValueError(f"unknown allowed-difference rule(s) {sorted(unknown)}; known: {sorted(DEFAULT_ALLOW)}")
    gall, oall = load_calls(Path(golden_dir)), load_calls(Path(other_dir))
    gsel = _select(gall, calls)
    grank, orank = _rank_of(gall), _ranks(oall)
    diffs: list[Difference] = []

    # the call sequence
    if calls is None:
        gseq, oseq = [c.short for c in gall], [c.short for c in oall]
        if gseq != oseq:
            sm = difflib.SequenceMatcher(a=gseq, b=oseq, autojunk=False)
            for tag, i1, i2, j1, j2 in sm.get_opcodes():
                if tag in ("replace", "delete"):
                    for i in range(i1, i2):
                        diffs.append(Difference("", "methods", f"golden call {gall[i].label} has no partner in other"))
                if tag in ("replace", "insert"):
                    for j in range(j1, j2):
                        diffs.append(Difference("", "methods", f"other call #{oall[j].id} {oall[j].short} "
                                                               f"is not in golden"))
    pairs = []
    for g in gsel:
        o = orank.get(grank[g.id])
        if o is None:
            if calls is not None:
                diffs.append(Difference(g.label, "methods", f"no {g.short} call number {grank[g.id][1] + 1} in other"))
            continue
        pairs.append((g, o))

    # authorization: the token a call sends must have been issued by an earlier response
    def token_issues(all_calls: list[CallEntry]) -> dict[int, str]:
        issued: set = set()
        out = {}
        for c in all_calls:
            req = _header(c.request_metadata, "authorization")
            if req and req.lower().startswith("bearer ") and req not in issued:
                out[c.id] = "sends a Bearer token that no earlier response issued"
            for md in (c.response_initial_metadata, c.response_trailing_metadata):
                v = _header(md, "authorization")
                if v:
                    issued.add(v)
        return out

    g_tok, o_tok = token_issues(gall), token_issues(oall)

    for g, o in pairs:
        label = g.label + ("" if o.id == g.id else f" (other #{o.id})")
        for aspect, message in _compare_call(g, o, allow, g.id in g_tok, o_tok.get(o.id)):
            diffs.append(Difference(label, aspect, message))
    return diffs


def _compare_call(g: CallEntry, o: CallEntry, allow: frozenset, golden_token_issue: bool,
                  other_token_issue: str | None) -> list[tuple[str, str]]:
    """(aspect, message) pairs for one pair of calls."""
    out: list[tuple[str, str]] = []
    if g.code != o.code:
        out.append(("status", f"status {g.code} in golden, {o.code} in other"
                    + (f" ({o.details!r})" if o.details else "")))
    elif "status_details" not in allow and g.details != o.details:
        out.append(("status", f"status details {g.details!r} in golden, {o.details!r} in other"))
    ga = _auth_value(_header(g.request_metadata, "authorization"), allow)
    oa = _auth_value(_header(o.request_metadata, "authorization"), allow)
    if ga != oa:
        out.append(("auth", f"request authorization header {ga!r} in golden, {oa!r} in other"))
    gr = _auth_value(_header(g.response_initial_metadata, "authorization")
                     or _header(g.response_trailing_metadata, "authorization"), allow)
    orr = _auth_value(_header(o.response_initial_metadata, "authorization")
                      or _header(o.response_trailing_metadata, "authorization"), allow)
    if gr != orr:
        out.append(("auth", f"response authorization header {gr!r} in golden, {orr!r} in other"))
    if other_token_issue and not golden_token_issue:
        out.append(("auth", f"other call #{o.id} {other_token_issue}"))
    if "transport_headers" not in allow:
        for name, gm, om in (("initial", g.response_initial_metadata, o.response_initial_metadata),
                             ("trailing", g.response_trailing_metadata, o.response_trailing_metadata)):
            gk = {k for k, _ in gm or ()} - {"authorization"}
            ok = {k for k, _ in om or ()} - {"authorization"}
            if gk != ok:
                text = (f"response {name} header names: missing in other {sorted(gk - ok)}, "
                        f"only in other {sorted(ok - gk)}")
                out.append(("headers", text))
    gv, ov = _view(g), _view(o, g.truncated_to_records)
    out.extend(("messages", e) for e in gv.errors + ov.errors)
    if gv.method is None or ov.method is None:
        return out
    if gv.flight:
        out.extend(_compare_flight(gv, ov, allow))
    out.extend(_compare_pb(gv, ov, allow))
    return out


def format_differences(diffs: Sequence[Difference]) -> str:
    """The differences one per line (or "no differences")."""
    return "\n".join(str(d) for d in diffs) if diffs else "no differences"
