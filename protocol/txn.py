"""Exactly-once writes from other processes, sans-I/O: the transaction a DoPut names in its
`app_metadata`, and the bodies of the commit and abort actions.

A producer (a Spark query, or any program) names each batch it writes by `(producer, batch)`:
`producer` is a stable name of the writer (a Spark query's id, kept in its checkpoint), `batch` a
number that grows with every batch. A batch may be written in several parts (a Spark partition
each, written by executors in parallel), each by an attempt (a retried task writes its part
again, under another attempt):

* a DoPut whose `app_metadata` (on a metadata-only FlightData, or on the first record batch) is a
  `Transaction` JSON object stages its rows under `(producer, batch, part, attempt)`; with
  `"commit": true` (the default) the server commits that one part at the end of the upload;
* the `tickwire.commit` action (`CommitRequest`) publishes the named parts of a batch in one
  update-graph cycle, or acknowledges and ignores a batch the table has already applied;
* the `tickwire.abort` action (`AbortRequest`) discards every staged part of a batch.

The JSON objects (UTF-8):

    {"tickwire": "txn", "producer": "q-1", "batch": 7, "part": "3", "attempt": "12",
     "commit": false, "mode": "upsert", "keys": ["Sym"], "delete_column": "deleted",
     "max_rows": null}
    {"tickwire": "commit", "producer": "q-1", "batch": 7, "table": "prices",
     "mode": "upsert", "keys": ["Sym"], "delete_column": "deleted", "max_rows": null,
     "parts": [["0", "10"], ["1", "11"], ["3", "12"]]}
    {"tickwire": "abort", "producer": "q-1", "batch": 7}

A Barrage options message (a flatbuffer) never starts with "{", so the first byte tells the two
kinds of DoPut `app_metadata` apart.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import BytesLike

__all__ = ["Transaction", "CommitRequest", "AbortRequest", "TxnError", "is_transaction", "parse_transaction",
           "parse_commit", "parse_abort", "ACTION_COMMIT", "ACTION_ABORT", "ACTION_STAGING", "MODES",
           "MAX_NAME", "MAX_PARTS"]

ACTION_COMMIT = "tickwire.commit"
ACTION_ABORT = "tickwire.abort"
ACTION_STAGING = "tickwire.staging"
MODES = ("append", "upsert", "replace", "blink")
MAX_NAME = 256        # characters of a producer, part, attempt, table or column name
MAX_PARTS = 100_000   # parts one commit may name
MAX_BODY = 8 << 20    # bytes of one JSON object
_MAX_BATCH = (1 << 63) - 1


class TxnError(ProtocolError):
    """A transaction, commit or abort the server refuses (INVALID_ARGUMENT)."""

    def __init__(self, message: str, code: str = "INVALID_ARGUMENT"):
        super().__init__(message, code)


@dataclass(frozen=True)
class _Mode:
    mode: Optional[str] = None
    keys: tuple[str, ...] = ()
    delete_column: Optional[str] = None
    max_rows: Optional[int] = None


@dataclass(frozen=True)
class Transaction(_Mode):
    """What a DoPut stages: its rows are part `part` of batch `batch` of `producer`, written by
    attempt `attempt`; `commit` publishes that part alone at the end of the upload. `mode` (None:
    "upsert" when the upload names key columns, else "append"), `keys` (None: the upload's
    `tickwire:keys`), `delete_column` and `max_rows` are the write's mode options."""

    producer: str = ""
    batch: int = 0
    part: str = "0"
    attempt: str = "0"
    commit: bool = True

    def to_json(self) -> bytes:
        return _dump({"tickwire": "txn", "producer": self.producer, "batch": self.batch, "part": self.part,
                      "attempt": self.attempt, "commit": self.commit, **_mode_json(self)})


@dataclass(frozen=True)
class CommitRequest(_Mode):
    """Publish parts `parts` ((part, attempt) pairs) of batch `batch` of `producer` into table
    `table` with the mode options, in one cycle."""

    producer: str = ""
    batch: int = 0
    table: str = ""
    parts: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def to_json(self) -> bytes:
        return _dump({"tickwire": "commit", "producer": self.producer, "batch": self.batch, "table": self.table,
                      "parts": [list(p) for p in self.parts], **_mode_json(self)})


@dataclass(frozen=True)
class AbortRequest:
    """Discard every staged part of batch `batch` of `producer`."""

    producer: str
    batch: int

    def to_json(self) -> bytes:
        return _dump({"tickwire": "abort", "producer": self.producer, "batch": self.batch})


def is_transaction(app_metadata: BytesLike) -> bool:
    """True when DoPut `app_metadata` is a JSON object (a transaction), not Barrage options."""
    return bytes(app_metadata[:1]) == b"{"


def parse_transaction(raw: BytesLike) -> Transaction:
    obj = _load(raw, "txn", "DoPut transaction")
    _only(obj, {"tickwire", "producer", "batch", "part", "attempt", "commit", "mode", "keys", "delete_column",
                "max_rows"}, "DoPut transaction")
    commit = obj.get("commit", True)
    if not isinstance(commit, bool):
        raise TxnError(f"DoPut transaction: 'commit' must be true or false, got {commit!r}")
    return Transaction(producer=_name(obj, "producer", "DoPut transaction"),
                       batch=_batch(obj, "DoPut transaction"),
                       part=_name(obj, "part", "DoPut transaction", "0"),
                       attempt=_name(obj, "attempt", "DoPut transaction", "0"),
                       commit=commit, **_mode(obj, "DoPut transaction"))


def parse_commit(raw: BytesLike) -> CommitRequest:
    what = f"action {ACTION_COMMIT}"
    obj = _load(raw, "commit", what)
    _only(obj, {"tickwire", "producer", "batch", "table", "parts", "mode", "keys", "delete_column", "max_rows"},
          what)
    parts = obj.get("parts", [])
    if not isinstance(parts, list) or len(parts) > MAX_PARTS:
        raise TxnError(f"{what}: 'parts' must be a list of at most {MAX_PARTS} [part, attempt] pairs")
    pairs = []
    for p in parts:
        if not (isinstance(p, list) and len(p) == 2 and all(isinstance(x, (str, int)) and not isinstance(x, bool)
                                                             for x in p)):
            raise TxnError(f"{what}: each part must be a [part, attempt] pair of names, got {str(p)[:80]}")
        pair = (str(p[0]), str(p[1]))
        if any(not x or len(x) > MAX_NAME for x in pair):
            raise TxnError(f"{what}: part and attempt names must have 1 to {MAX_NAME} characters")
        pairs.append(pair)
    if len({p for p, _a in pairs}) != len(pairs):
        raise TxnError(f"{what}: a part is named twice")
    mode = _mode(obj, what)
    if mode["mode"] is None:
        raise TxnError(f"{what}: 'mode' is required (one of {', '.join(MODES)})")
    return CommitRequest(producer=_name(obj, "producer", what), batch=_batch(obj, what),
                         table=_name(obj, "table", what), parts=tuple(pairs), **mode)


def parse_abort(raw: BytesLike) -> AbortRequest:
    what = f"action {ACTION_ABORT}"
    obj = _load(raw, "abort", what)
    _only(obj, {"tickwire", "producer", "batch"}, what)
    return AbortRequest(_name(obj, "producer", what), _batch(obj, what))


# -- helpers ------------------------------------------------------------------------------------------

def _dump(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _mode_json(m: _Mode) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if m.mode is not None:
        out["mode"] = m.mode
    if m.keys:
        out["keys"] = list(m.keys)
    if m.delete_column is not None:
        out["delete_column"] = m.delete_column
    if m.max_rows is not None:
        out["max_rows"] = m.max_rows
    return out


def _load(raw: BytesLike, kind: str, what: str) -> dict[str, Any]:
    raw = bytes(raw)
    if len(raw) > MAX_BODY:
        raise TxnError(f"{what}: more than {MAX_BODY} bytes")
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise TxnError(f"{what}: not a JSON object: {exc}") from None
    if not isinstance(obj, dict):
        raise TxnError(f"{what}: not a JSON object")
    if obj.get("tickwire") != kind:
        raise TxnError(f"{what}: expected \"tickwire\": {kind!r}, got {str(obj.get('tickwire'))[:40]!r}")
    return obj


def _only(obj: dict[str, Any], allowed: set[str], what: str) -> None:
    extra = sorted(k for k in obj if k not in allowed)
    if extra:
        raise TxnError(f"{what}: unknown field {str(extra[0])[:40]!r} (known: {', '.join(sorted(allowed))})")


def _name(obj: dict[str, Any], key: str, what: str, default: Optional[str] = None) -> str:
    v = obj.get(key, default)
    if isinstance(v, int) and not isinstance(v, bool):
        v = str(v)
    if not isinstance(v, str) or not v or len(v) > MAX_NAME:
        raise TxnError(f"{what}: {key!r} must be a name of 1 to {MAX_NAME} characters, got {str(v)[:40]!r}")
    return v


def _batch(obj: dict[str, Any], what: str) -> int:
    v = obj.get("batch")
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX_BATCH:
        raise TxnError(f"{what}: 'batch' must be an integer from 0 to 2^63-1, got {str(v)[:40]!r}")
    return v


def _mode(obj: dict[str, Any], what: str) -> dict[str, Any]:
    mode = obj.get("mode")
    if mode is not None and mode not in MODES:
        raise TxnError(f"{what}: 'mode' must be one of {', '.join(MODES)}, got {str(mode)[:40]!r}")
    keys = obj.get("keys") or []
    if not isinstance(keys, list) or len(keys) > 64 or not all(isinstance(k, str) and 0 < len(k) <= MAX_NAME
                                                                 for k in keys):
        raise TxnError(f"{what}: 'keys' must be a list of at most 64 column names")
    delete = obj.get("delete_column")
    if delete is not None and (not isinstance(delete, str) or not 0 < len(delete) <= MAX_NAME):
        raise TxnError(f"{what}: 'delete_column' must be a column name")
    max_rows = obj.get("max_rows")
    if max_rows is not None and (not isinstance(max_rows, int) or isinstance(max_rows, bool) or max_rows <= 0):
        raise TxnError(f"{what}: 'max_rows' must be a positive integer, got {str(max_rows)[:40]!r}")
    return {"mode": mode, "keys": tuple(keys), "delete_column": delete, "max_rows": max_rows}
