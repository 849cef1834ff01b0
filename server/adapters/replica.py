"""Replication: a local table that follows a table of another Barrage server (tickwire or Deephaven).

    engine = Engine().start()
    rep = Replicator(engine, "upstream:10000", "trades").start()   # local table "trades"
    ...
    rep.stop()

A `Replicator` holds a full Barrage subscription to the remote table and feeds a `ReplicaTable`
of the local engine through `Engine.write`. The replica uses the remote's row keys, so each cycle's update is the
remote's updates of that interval (removes, shifts, adds, modifies) in the remote's key space:
local subscribers see the same rows, keys and shifts as the remote's own subscribers, coalesced
to the local cycle. Row keys map to storage slots through a hash index, so the remote's key
space may be as sparse as it likes and each update costs what it changes.

(Re)synchronisation: the initial snapshot (whole, or in pieces) is collected off the graph and
then applied as one update: the net difference between what the replica holds and the remote's
state (rows gone, rows new, rows whose values differ). When the upstream goes away the replica
keeps its last consistent state, reports `status` ("connected", "syncing", or "disconnected:
<reason>"), retries with exponential backoff, and on reconnect resynchronises the same way:
nothing is applied twice and nothing is lost.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import NamedTuple, Optional

import grpc
import numpy as np
import pyarrow as pa

from tickwire.clients.client import BarrageClient
from tickwire.clients.state import NaturalTableState
from tickwire.clock import Clock
from tickwire.errors import ProtocolError
from tickwire.protocol.difference import difference
from tickwire.protocol.opening import exchange_opening, subscription_request
from tickwire.protocol.responses import ResponseReader, SchemaReceived, natural_added, natural_modified
from tickwire.protocol.schema import attributes_from_schema, from_wire_arrays
from tickwire.protocol.update import BarrageUpdate
from tickwire.server.engine import CatalogError, Engine, UpdateSourceTable
from tickwire.server.engine.graph import ModifiedColumnSet, RowSet, RowSetShiftData, TableUpdate
from tickwire.server.engine.graph.keyindex import KeyIndex, mix

__all__ = ["ReplicaTable", "Replicator", "Upstream", "parse_replicate"]

log = logging.getLogger(__name__)

_EMPTY = np.zeros(0, dtype=np.int64)


def _same(qi: np.ndarray, rows: np.ndarray) -> np.ndarray:
    return np.ones(qi.size, dtype=bool)  # the hash is a bijection: equal hashes are equal keys


def _rows(ranges) -> RowSet:
    if ranges is None:
        return RowSet()
    r = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
    return RowSet.from_ranges(r) if r.size else RowSet()


class ReplicaTable(UpdateSourceTable):
    """A source table whose content is set by a Replicator (never by producers): it pushes
    ("sync", keys, values) and ("delta", removed, shifts, added, values, mods) operations."""

    def __init__(self, graph, name: str, schema: pa.Schema):
        super().__init__(graph, name, schema)
        self._index = KeyIndex()
        self._free = _EMPTY
        self._next_slot = 0
        self.status = "connecting"

    # -- key -> slot ------------------------------------------------------------------------------
    def slots(self, keys) -> np.ndarray:
        keys = np.asarray(keys, dtype=np.int64)
        slots, _ = self._index.lookup(mix(keys), _same)
        if slots.size and slots.min() < 0:
            missing = keys[slots < 0][:5].tolist()
            raise KeyError(f"table {self.name!r}: rows {missing} are not held")
        return slots

    def _alloc(self, n: int) -> np.ndarray:
        take = min(n, self._free.size)
        reused, self._free = self._free[:take], self._free[take:]
        fresh = np.arange(self._next_slot, self._next_slot + n - take, dtype=np.int64)
        self._next_slot += n - take
        return np.concatenate([reused, fresh])

    def _drop_keys(self, keys: np.ndarray) -> None:
        if keys.size == 0:
            return
        slots, where = self._index.lookup(mix(keys), _same)
        if slots.min() < 0:
            raise ProtocolError(f"replica {self.name!r}: removed rows {keys[slots < 0][:5].tolist()} are not held")
        self._index.delete(where)
        self._free = np.concatenate([self._free, slots])

    def _add_keys(self, keys: np.ndarray, values: pa.Table) -> None:
        if keys.size == 0:
            return
        slots = self._alloc(keys.size)
        self.store.write(slots, values)
        self._index.insert(mix(keys), slots)

    # -- input (queued by the replicator's thread with `push`) -----------------------------------------
    def apply_pending(self, step, ops) -> Optional[TableUpdate]:
        if not ops:
            return None
        prev = self.rowset
        total: Optional[TableUpdate] = None
        for op in ops:
            u = self._sync(*op[1:]) if op[0] == "sync" else self._delta(*op[1:])
            total = u if total is None else total.coalesce(u, prev)
        self.prev_rowset = prev
        return None if total is None or total.is_empty() else total

    def _delta(self, removed: RowSet, shifts: RowSetShiftData, added: RowSet, added_values: pa.Table,
               mods: list[tuple[str, RowSet, pa.Array]]) -> TableUpdate:
        """One remote update, in the remote's key space: remove, shift, add, modify."""
        rows = self.rowset
        if not removed.is_subset_of(rows):
            raise ProtocolError(f"replica {self.name!r}: removed rows are not all held")
        self._drop_keys(removed.keys())
        rows = rows.minus(removed)
        if not shifts.is_empty():
            starts, ends, dests = shifts.to_wire()
            old, delta = [], []
            for s, e, d in zip(starts.tolist(), ends.tolist(), dests.tolist()):
                k = rows.subset_by_key_range(s, e).keys()
                old.append(k)
                delta.append(np.full(k.size, d - s, dtype=np.int64))
            old_keys = np.concatenate(old) if old else _EMPTY
            if old_keys.size:
                slots, where = self._index.lookup(mix(old_keys), _same)
                self._index.delete(where)
                self._index.insert(mix(old_keys + np.concatenate(delta)), slots)
            rows = shifts.apply(rows)
        if rows.overlaps(added):
            raise ProtocolError(f"replica {self.name!r}: added rows collide with rows held")
        self._add_keys(added.keys(), added_values)
        rows = rows.union(added)
        modified = RowSet()
        names = []
        for name, mrows, values in mods:
            if not mrows.is_subset_of(rows):
                raise ProtocolError(f"replica {self.name!r}: modified rows of {name!r} are not all held")
            col = self.store.columns[self.store.index[name]]
            col.write(self.slots(mrows.keys()), values)
            modified = modified.union(mrows)
            names.append(name)
        self.rowset = rows
        return TableUpdate(added=added, removed=removed, modified=modified.minus(added), shifted=shifts,
                           modified_columns=ModifiedColumnSet(names))

    def _sync(self, keys: np.ndarray, values: pa.Table) -> TableUpdate:
        """Makes the table hold exactly `keys` -> `values` (the remote's state), as the net
        difference from what it holds now."""
        d = difference(self.rowset.keys(), keys, values, lambda common: self.gather(None, common))
        self._drop_keys(d.removed)
        self._add_keys(keys[d.added], values.take(pa.array(d.added)))
        mod_idx = d.modified_rows
        if mod_idx.size:
            self.store.write(self.slots(keys[mod_idx]), values.take(pa.array(mod_idx)))
        self.rowset = RowSet.from_keys(keys) if keys.size else RowSet()
        return TableUpdate(added=RowSet.from_keys(keys[d.added]) if d.added.size else RowSet(),
                           removed=RowSet.from_keys(d.removed) if d.removed.size else RowSet(),
                           modified=RowSet.from_keys(keys[mod_idx]) if mod_idx.size else RowSet(),
                           modified_columns=ModifiedColumnSet([n for n in self.schema.names if n in d.modified]))


class Replicator:
    """Follows `table` of the Barrage server at `target` ("host:port") into `engine` as
    `local_name`; reconnects after `backoff` (first, most) seconds of the engine's clock."""

    def __init__(self, engine: Engine, target: str, table: str, *, local_name: Optional[str] = None,
                 psk: Optional[str] = None, tls: bool = False, root_certs: Optional[bytes] = None,
                 backoff: tuple[float, float] = (0.1, 5.0), connect_timeout: float = 30.0):
        self.engine = engine
        self.clock: Clock = engine.clock
        self.target = target
        self.remote = table
        self.name = local_name or table
        self.psk, self.tls, self.root_certs = psk, tls, root_certs
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.table: Optional[ReplicaTable] = None
        self.syncs = 0  # completed (re)synchronisations
        self.failures = 0
        self.messages = 0
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._call = None
        self._client: Optional[BarrageClient] = None

    @property
    def status(self) -> str:
        return self.table.status if self.table is not None else "connecting"

    def start(self, wait: bool = True) -> "Replicator":
        """Starts following; with `wait`, returns once the first snapshot is queued for the graph
        (raises TimeoutError after `connect_timeout`). Refused (ValueError) while another running
        replicator of the engine follows a table into the same local name."""
        held = self.engine.resolve(self.name, hidden=True)
        if held is not None and not isinstance(held, ReplicaTable):
            raise ValueError(f"replica {self.name!r}: a table named {self.name!r} that is not a replica exists; "
                             f"follow {self.target}/{self.remote} under another local name")
        _claim(self)
        self._thread = threading.Thread(target=self._run, name=f"tickwire-replica-{self.name}", daemon=True)
        self._thread.start()
        return self.wait_ready() if wait else self

    def wait_ready(self) -> "Replicator":
        """Returns once the first snapshot is queued for the graph (TimeoutError after `connect_timeout`)."""
        if not self._ready.wait(self.connect_timeout):
            raise TimeoutError(f"replica {self.name!r}: no snapshot from {self.target}/{self.remote} "
                               f"within {self.connect_timeout} s (status: {self.status})")
        return self

    def stop(self) -> None:
        """Stops following. Its thread ends first (a snapshot or an update it was writing is
        written whole), then the table is marked "stopped" and its name is free for another
        replicator: nothing of this one reaches the table after stop() returns, unless its thread
        did not end within 10 s (logged as a warning)."""
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(10)
            if self._thread.is_alive():
                log.warning("replica %r: its thread did not end within 10 s of stop()", self.name)
        if self._client is not None:
            self._client.close()
        if self.table is not None:
            self.table.status = "stopped"
        _release(self)

    # -- the replicator's thread ------------------------------------------------------------------
    def _run(self) -> None:
        delay = self.backoff[0]
        while not self._stop.is_set():
            synced_before = self.syncs
            try:
                self._follow()
                reason = "the upstream ended the stream"
            except grpc.RpcError as exc:
                reason = f"{exc.code().name}: {exc.details()}"
            except Exception as exc:  # noqa: BLE001 - reported, then retried
                reason = f"{type(exc).__name__}: {exc}"
                log.exception("replica %r: following %s/%s failed", self.name, self.target, self.remote)
            finally:
                if self._client is not None:
                    self._client.close()
                    self._client = None
            if self._stop.is_set():
                break
            self.failures += 1
            if self.table is not None:
                self.table.status = f"disconnected: {reason}"
            log.warning("replica %r: lost %s/%s (%s); retrying in %.1f s", self.name, self.target, self.remote,
                        reason, delay)
            if self.syncs > synced_before:
                delay = self.backoff[0]  # it had worked: start the backoff again
            self.clock.wait(self._stop, delay)
            delay = min(self.backoff[1], delay * 2)

    def _follow(self) -> None:
        client = self._client = BarrageClient(self.target, psk=self.psk, tls=self.tls, root_certs=self.root_certs)
        opening = exchange_opening(subscription_request(client.ticket(self.remote)))
        done = threading.Event()

        def outgoing():
            yield from opening
            done.wait()  # keep the stream open until the replicator stops or the call ends

        call = self._call = client.open_exchange(outgoing())
        try:
            if self._stop.is_set():
                return
            reader = ResponseReader()
            state: Optional[NaturalTableState] = None  # the remote's state while a snapshot is being collected
            for raw in call:
                for ev in reader.feed(raw):
                    if isinstance(ev, SchemaReceived):
                        if self.table is None:
                            self._create(ev.schema)
                        continue
                    self.messages += 1
                    if state is None and self._local.status != "connected":
                        state = NaturalTableState(reader.schema, viewport=False)
                        self._local.status = "syncing"
                    if state is not None:
                        state.apply(ev.update)
                        if ev.ends_full_snapshot:
                            self._sync(state)
                            state = None
                        continue
                    self._forward(ev.update, reader.schema)
        finally:
            done.set()
            self._call = None

    @property
    def _local(self) -> ReplicaTable:
        """The local table: made when the upstream's schema arrived, before any message."""
        assert self.table is not None, "a message before the schema"
        return self.table

    def _create(self, wire_schema: pa.Schema) -> None:
        empty = from_wire_arrays([pa.array([], f.type) for f in wire_schema], wire_schema)
        schema = pa.schema([pa.field(f.name, a.type) for f, a in zip(wire_schema, empty)])
        try:
            table, created = self.engine.get_or_create_source(ReplicaTable, self.name, schema)
        except CatalogError as exc:
            raise ValueError(f"replica {self.name!r}: {exc}") from None
        assert isinstance(table, ReplicaTable)  # get_or_create_source checks the class
        if created:
            table.attributes.update(attributes_from_schema(wire_schema))
        else:
            table.status = "syncing"  # left by a replicator now stopped: its rows are replaced by a resync
        self.table = table

    def _sync(self, state: NaturalTableState) -> None:
        values = state.table()
        table = self._local
        if values.schema.names != table.schema.names or values.schema.types != table.schema.types:
            raise ProtocolError(f"replica {self.name!r}: the upstream's schema changed to {values.schema}")
        values = pa.Table.from_arrays(values.columns, schema=table.schema)
        self.engine.write(table, ("sync", state.keys.copy(), values), wait=False)
        table.status = "connected"
        self.syncs += 1
        self._ready.set()
        log.info("replica %r: synchronised with %s/%s (%d rows)", self.name, self.target, self.remote,
                 state.keys.size)

    def _forward(self, u: BarrageUpdate, wire_schema: pa.Schema) -> None:
        md = u.metadata
        if md is None:
            raise ProtocolError(f"replica {self.name!r}: a batch without Barrage metadata")
        names = wire_schema.names
        added = _rows(md.added_rows_included if md.added_rows_included is not None else md.added_rows)
        added_values = pa.Table.from_arrays(natural_added(u, wire_schema, len(added)), schema=self._local.schema)
        mods = []
        for c, node in enumerate(md.mod_column_nodes or []):
            mrows = _rows(node)
            if len(mrows):
                vals = natural_modified(u, wire_schema, c)
                if len(vals) != len(mrows):
                    raise ProtocolError(f"replica {self.name!r}: column {names[c]!r} has {len(mrows)} modified "
                                        f"rows but {len(vals)} values")
                mods.append((names[c], mrows, vals))
        shifts = RowSetShiftData() if md.shift_data is None else RowSetShiftData.from_wire(*md.shift_data)
        self.engine.write(self._local, ("delta", _rows(md.removed_rows), shifts, added, added_values, mods),
                          wait=False)


# engine -> local name -> the running replicator that follows a table into it
_claims: "weakref.WeakKeyDictionary[Engine, dict[str, Replicator]]" = weakref.WeakKeyDictionary()
_claims_lock = threading.Lock()


def _claim(rep: Replicator) -> None:
    with _claims_lock:
        names = _claims.setdefault(rep.engine, {})
        other = names.get(rep.name)
        if other is not None and other is not rep:
            raise ValueError(f"replica {rep.name!r}: {other.target}/{other.remote} is already replicated as "
                             f"{rep.name!r}; follow {rep.target}/{rep.remote} under another local name "
                             f"(HOST:PORT/TABLE=LOCAL, or local_name=...)")
        names[rep.name] = rep


def _release(rep: Replicator) -> None:
    with _claims_lock:
        names = _claims.get(rep.engine, {})
        if names.get(rep.name) is rep:
            del names[rep.name]


class Upstream(NamedTuple):
    """One table to follow: `table` of the server at `target`, served here as `local`."""
    target: str
    table: str
    local: str

    def __str__(self) -> str:
        return f"{self.target}/{self.table}" + (f"={self.local}" if self.local != self.table else "")


def parse_replicate(spec: str) -> list[Upstream]:
    """"host:port/table[=local][,...]" -> [Upstream, ...]; refuses two tables served under one name."""
    out: list[Upstream] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        target, sep, rest = part.rpartition("/")
        table, eq, local = rest.partition("=")
        table, local = table.strip(), local.strip()
        if not sep or not target or not table or ":" not in target or (eq and not local):
            raise ValueError(f"--replicate wants HOST:PORT/TABLE or HOST:PORT/TABLE=LOCAL, got {part!r}")
        up = Upstream(target, table, local or table)
        same = next((u for u in out if u.local == up.local), None)
        if same is not None:
            raise ValueError(f"--replicate: {same.target}/{same.table} and {up.target}/{up.table} would both be "
                             f"served as {up.local!r}; name one HOST:PORT/TABLE=LOCAL")
        out.append(up)
    if not out:
        raise ValueError("--replicate names no table")
    return out

