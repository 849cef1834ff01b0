"""Staged writes and their atomic commit: exactly once for producers in other processes.

A producer writes batch `b` in parts (a Spark query: one part per partition, written by
executors in parallel, each by an attempt that a retried task repeats); the parts wait here,
invisible, until the producer commits the batch, naming the parts (and the attempt of each) that
make it. The commit applies them in one update-graph cycle, under the batch id
("txn", producer, b), through `Engine.write` with the same `Destination` as the in-process Spark
sinks; the id is journaled with the rows when the table is durable. A batch the table already has (a replay after
a producer's or the server's restart) is acknowledged and its parts dropped.

Bounds, so that nothing grows without limit:
* bytes staged per producer (`producer_limit`) and in all (`total_limit`): a part that does not
  fit waits for room (the upload stops reading its stream, so the sender waits in turn) until
  `wait_timeout`, then fails with RESOURCE_EXHAUSTED; nothing is ever dropped to make room;
* parts staged or being staged, per producer (`max_parts`) and in all (`max_parts_total`), so
  that empty parts, which hold no bytes, cannot pile up either: one more is RESOURCE_EXHAUSTED;
* parts of a batch that is not committed within `ttl` seconds of its last write expire;
* when batch `b` commits, every part of batches up to `b` of that producer is dropped (a
  producer never commits an older batch after a newer one).

Parts live in memory: after a server restart a commit naming parts staged before it fails
(FAILED_PRECONDITION, the batch must be written again), which a Spark query does by rerunning
the batch from its checkpoint.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Sequence

import pyarrow as pa

from tickwire.clock import SYSTEM_CLOCK, Clock
from tickwire.server.engine.config import StagingLimits
from tickwire.server.engine.errors import IngestError
from tickwire.server.engine.ingest import Destination

if TYPE_CHECKING:
    from tickwire.server.engine.core import Engine

__all__ = ["Staging", "StagedPart", "StagingError", "batch_key"]

log = logging.getLogger(__name__)

MiB = 1 << 20


class StagingError(IngestError):
    """A staged write or commit the server refuses; `code` is the gRPC status."""


def batch_key(producer: str, batch: int) -> tuple[str, str, int]:
    """The batch id a committed batch is applied, journaled and remembered under."""
    return ("txn", producer, int(batch))


@dataclass
class StagedPart:
    """One part being staged or staged: its rows (in the table's columns, plus the delete column)
    and the bytes reserved for them. `done` once its upload ended cleanly."""

    producer: str
    batch: int
    part: str
    attempt: str
    table: str
    schema: pa.Schema
    chunks: list[pa.Table] = field(default_factory=list)
    nbytes: int = 0
    rows: int = 0
    done: bool = False
    touched: float = 0.0
    counted: bool = False  # holds one of the producer's parts (`max_parts`) until released


class Staging:
    """The staging area of one engine (see the module documentation), bounded by `limits`; its
    TTLs run on `clock`."""

    def __init__(self, engine: "Engine", limits: Optional[StagingLimits] = None, *, clock: Clock = SYSTEM_CLOCK):
        limits = limits or StagingLimits()
        self.engine = engine
        self.limits = limits
        self.producer_limit = int(limits.producer_bytes)
        self.total_limit = int(limits.total_bytes)
        self.ttl = float(limits.ttl_s)
        self.wait_timeout = float(limits.wait_s)
        self.max_parts = int(limits.max_parts)
        self.max_parts_total = int(limits.max_parts_total)
        self._parts: dict[str, int] = {}  # producer -> parts counted
        self._parts_total = 0
        self._clock = clock.monotonic
        self._lock = threading.Lock()
        # (producer, batch) -> {(part, attempt): StagedPart}
        self._batches: dict[tuple[str, int], dict[tuple[str, str], StagedPart]] = {}
        self._used: dict[str, int] = {}
        self._total = 0
        self._commit_locks: dict[str, threading.Lock] = {}
        self.expired = 0
        self.committed = 0
        self.replays = 0

    # -- staging ---------------------------------------------------------------------------------
    @staticmethod
    def destination(table: str, mode: Optional[str], keys: Sequence[str], delete_column: Optional[str],
                    max_rows: Optional[int], upload_keys: Sequence[str] = ()) -> Destination:
        """The Destination a transaction's options describe (mode None: "upsert" when keys are
        named, else "append"); ModeError for options that do not go together."""
        keys = list(keys) or list(upload_keys)
        if mode is None:
            mode = "upsert" if keys else "append"
        return Destination(table, mode, tuple(keys) or None, delete_column, max_rows)

    def applied(self, table: str, producer: str, batch: int) -> bool:
        """True when `table` exists and has applied batch `batch` of `producer`."""
        t = self.engine.resolve(table, hidden=True)
        return t is not None and hasattr(t, "has_batch") and t.has_batch(batch_key(producer, batch))

    def begin(self, dest: Destination, upload_schema: pa.Schema, producer: str, batch: int, part: str,
              attempt: str) -> StagedPart:
        """A new part for an upload whose schema is `upload_schema` (checked against the table when
        it exists). A part staged before under the same names is replaced when this one is done."""
        schema = dest.table_schema(upload_schema)
        self.engine.destination_table(dest, schema, create=False)
        staged = StagedPart(producer, int(batch), part, attempt, dest.name, upload_schema, touched=self._clock())
        with self._lock:
            self._expire_locked(self._clock())
            mine = self._parts.get(producer, 0)
            if mine >= self.max_parts or self._parts_total >= self.max_parts_total:
                raise StagingError(f"batch {batch} part {part!r} of producer {producer!r}: "
                                   f"{mine if mine >= self.max_parts else self._parts_total} parts are staged "
                                   f"already, the most {'a producer' if mine >= self.max_parts else 'the server'} "
                                   f"may have; commit or abort batches first", "RESOURCE_EXHAUSTED")
            self._parts[producer] = mine + 1
            self._parts_total += 1
            staged.counted = True
        return staged

    def try_reserve(self, part: StagedPart, nbytes: int) -> bool:
        """Reserves room for `nbytes` more of `part`; False when it does not fit now (try again
        later), StagingError when it can never fit."""
        nbytes = int(nbytes)
        if part.nbytes + nbytes > self.producer_limit:
            raise StagingError(f"batch {part.batch} part {part.part} of producer {part.producer!r} needs more than "
                               f"the {self.producer_limit} bytes a producer may stage; write smaller batches "
                               f"(fewer rows per micro-batch) or raise the server's staging limit",
                               "RESOURCE_EXHAUSTED")
        with self._lock:
            used = self._used.get(part.producer, 0)
            if used + nbytes > self.producer_limit or self._total + nbytes > self.total_limit:
                expired = self._expire_locked(self._clock())
                used = self._used.get(part.producer, 0)
                if not expired or used + nbytes > self.producer_limit or self._total + nbytes > self.total_limit:
                    return False
            self._used[part.producer] = used + nbytes
            self._total += nbytes
        part.nbytes += nbytes
        part.touched = self._clock()
        return True

    def add(self, part: StagedPart, data: pa.Table) -> None:
        """Rows of the part (room reserved before)."""
        part.chunks.append(data)
        part.rows += data.num_rows

    def finish(self, part: StagedPart) -> None:
        """The part's upload ended cleanly: it is staged (replacing one of the same names)."""
        part.done = True
        part.touched = self._clock()
        with self._lock:
            parts = self._batches.setdefault((part.producer, part.batch), {})
            old = parts.pop((part.part, part.attempt), None)
            parts[(part.part, part.attempt)] = part
            if old is not None:
                self._release_locked(old)

    def cancel(self, part: StagedPart) -> None:
        """The part's upload failed or was cut: its room is released, nothing of it stays."""
        with self._lock:
            parts = self._batches.get((part.producer, part.batch))
            if parts is not None and parts.get((part.part, part.attempt)) is part:
                return  # staged already: it stays
            self._release_locked(part)
        part.chunks = []

    # -- commit and abort ------------------------------------------------------------------------
    def commit(self, dest: Destination, producer: str, batch: int, parts: Sequence[tuple[str, str]], *,
               wait: bool = True, timeout: float = 60.0) -> dict[str, Any]:
        """Publishes `parts` of the batch in one cycle; {"applied": bool, "rows": n, "replay": bool}."""
        key = batch_key(producer, batch)
        with self._commit_lock(producer):
            if self.applied(dest.name, producer, batch):
                self.replays += 1
                self._drop_through(producer, batch)
                log.info("table %r: batch %d of producer %r was already applied; acknowledged, not applied again",
                         dest.name, batch, producer, extra={"event": "commit_replay", "table": dest.name,
                                                              "producer": producer, "batch": batch})
                return {"applied": False, "replay": True, "rows": 0}
            with self._lock:
                staged = self._batches.get((producer, int(batch)), {})
                missing = [p for p in parts if p not in staged]
                chosen = [staged[p] for p in parts if p in staged]
            if missing:
                p, a = missing[0]
                raise StagingError(f"batch {batch} of producer {producer!r}: part {p!r} (attempt {a!r}) is not "
                                   f"staged (never written, expired, aborted, or lost in a server restart); "
                                   f"{len(missing)} of {len(parts)} part(s) missing: write the batch again",
                                   "FAILED_PRECONDITION")
            wrong = [c for c in chosen if c.table != dest.name]
            if wrong:
                raise StagingError(f"batch {batch} of producer {producer!r}: part {wrong[0].part!r} was staged "
                                   f"for table {wrong[0].table!r}, not {dest.name!r}")
            chunks = [t for c in chosen for t in c.chunks if t.num_rows]
            schemas = {c.schema for c in chosen}
            if len(schemas) > 1:
                raise StagingError(f"batch {batch} of producer {producer!r}: its parts have different schemas")
            data: Optional[pa.Table] = None
            if chunks:
                data = pa.concat_tables(chunks) if len(chunks) > 1 else chunks[0]
            elif chosen:
                data = chosen[0].schema.empty_table()
            if data is None:  # nothing staged: nothing to make a table from
                table = self.engine.resolve(dest.name, hidden=True)
                if table is None:
                    self._drop_through(producer, batch)
                    return {"applied": False, "replay": False, "rows": 0}
                data = pa.schema(list(table.schema) + list(dest.extra_schema or [])).empty_table()
            accepted = self.engine.write(dest, data, batch_id=key, wait=wait, timeout=timeout)
            self._drop_through(producer, batch)
            if accepted:
                self.committed += 1
            else:
                self.replays += 1
            return {"applied": accepted, "replay": not accepted, "rows": data.num_rows if accepted else 0}

    def abort(self, producer: str, batch: int) -> int:
        """Drops every staged part of the batch; how many there were."""
        with self._lock:
            parts = self._batches.pop((producer, int(batch)), {})
            for p in parts.values():
                self._release_locked(p)
        return len(parts)

    def _drop_through(self, producer: str, batch: int) -> None:
        with self._lock:
            for k in [k for k in self._batches if k[0] == producer and k[1] <= batch]:
                for p in self._batches.pop(k).values():
                    self._release_locked(p)

    def _commit_lock(self, producer: str) -> threading.Lock:
        with self._lock:
            lock = self._commit_locks.get(producer)
            if lock is None:
                if len(self._commit_locks) > 4096:  # forget idle producers' locks
                    for name in [n for n, lk in self._commit_locks.items() if not lk.locked()][:2048]:
                        del self._commit_locks[name]
                lock = self._commit_locks[producer] = threading.Lock()
            return lock

    # -- bookkeeping -----------------------------------------------------------------------------
    def _release_locked(self, part: StagedPart) -> None:
        if part.counted:
            part.counted = False
            self._parts_total -= 1
            left = self._parts.get(part.producer, 0) - 1
            if left > 0:
                self._parts[part.producer] = left
            else:
                self._parts.pop(part.producer, None)
        if part.nbytes:
            left = self._used.get(part.producer, 0) - part.nbytes
            if left > 0:
                self._used[part.producer] = left
            else:
                self._used.pop(part.producer, None)
            self._total -= part.nbytes
            part.nbytes = 0

    def expire(self) -> int:
        """Drops batches whose parts were not written for `ttl` seconds; how many parts."""
        with self._lock:
            return self._expire_locked(self._clock())

    def _expire_locked(self, now: float) -> int:
        n = 0
        for k in list(self._batches):
            parts = self._batches[k]
            if parts and now - max(p.touched for p in parts.values()) >= self.ttl:
                for p in self._batches.pop(k).values():
                    self._release_locked(p)
                    n += 1
                log.info("staged parts of batch %d of producer %r expired uncommitted", k[1], k[0])
        self.expired += n
        return n

    def status(self) -> dict[str, Any]:
        """What is staged: bytes in all and per producer, and the parts of each batch."""
        with self._lock:
            return {"bytes": self._total, "producer_limit": self.producer_limit, "total_limit": self.total_limit,
                    "ttl_s": self.ttl, "parts": self._parts_total, "max_parts": self.max_parts,
                    "committed": self.committed, "replays": self.replays, "expired": self.expired,
                    "producers": dict(self._used.items()),
                    "batches": [{"producer": k[0], "batch": k[1],
                                 "parts": [{"part": p.part, "attempt": p.attempt, "rows": p.rows, "bytes": p.nbytes,
                                            "table": p.table} for p in parts.values()]}
                                for k, parts in self._batches.items()]}


