"""The Arrow Flight service: discovery, DoGet snapshots, DoExchange subscriptions, DoPut uploads.

FlightData is read and written as raw bytes; requests are parsed with `tickwire.protocol`.
Flows follow docs/flows.md: DoGet (docs/flows.md#doget), subscriptions
(docs/flows.md#doexchange-subscriptions, docs/flows.md#view-changes), snapshot requests
(docs/flows.md#snapshot-requests), DoPut (docs/flows.md#doput), errors (docs/flows.md#errors-and-statuses)
and discovery (docs/flows.md#tickets-and-discovery).
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import secrets
import time
import weakref
from typing import Callable, Optional

import pyarrow as pa

from tickwire.errors import ProtocolError
from tickwire.protocol import barrage
from tickwire.protocol.exchange import ExchangeReader, Opening
from tickwire.protocol.proto import flight_pb2
from tickwire.protocol.proto.methods import FLIGHT_SERVICE
from tickwire.protocol.schema import BARRAGE_SCHEMA, attributes_from_schema, ipc_encapsulated_schema
from tickwire.protocol.tickets import (
    SCOPE_TABLE_HEADER,
    ExportTicket,
    ScopeTicket,
    SharedTicket,
    parse_ticket,
    ticket_from_path,
)
from tickwire.protocol.txn import (
    ACTION_ABORT,
    ACTION_COMMIT,
    ACTION_STAGING,
    Transaction,
    TxnError,
    parse_abort,
    parse_commit,
)
from tickwire.protocol.upload import KEYS_METADATA, Batch, Destination, UploadDecoder, UploadError
from tickwire.server.engine import Table, TableSpec, is_system, kind_of
from tickwire.server.engine.hierarchical import RollupHandle
from tickwire.server.engine.publishing import DogetSnapshot, EncodeOptions, TableWire, snapshot_message
from tickwire.server.engine.publishing.handle import (
    SubscriptionHandle,
    Waker,
    describe_view,
    encoded_payloads,
    outcome_of,
)
from tickwire.server.engine.publishing.views import requested, requested_columns, requested_viewport
from tickwire.server.engine.staging import StagedPart
from tickwire.server.observability.metrics import TransferCounters
from tickwire.server.services.context import ServerContext
from tickwire.server.services.doget_cache import DogetCache
from tickwire.server.services.flight_sql import (
    ACTION_CLOSE,
    ACTION_CREATE,
    TICKET_ROUTE,
    FlightSql,
    is_flight_sql_command,
    table_flight_info,
)
from tickwire.server.services.rpc import RAW, CallError, service_handlers
from tickwire.server.services.sessions import SHUTDOWN, ExportClaim, ResolveError, Session

__all__ = ["FlightService", "KEYS_METADATA"]

log = logging.getLogger(__name__)


def _past_deadline(context) -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise CallError("the call's deadline passed before its upload ended", "DEADLINE_EXCEEDED")


# How DoPut tells an upload that ended from one that was cut. grpc's asyncio server ends the request
# iterator the same way when the client half-closes and when the call is cut (cancelled, past its
# deadline, its connection lost); the cancellation of the handler that follows a cut comes from
# another completion (the call's close event), which a loaded machine can deliver any time later.
# What tells them apart without a race is the next thing sent on the call: gRPC fails a send on a
# call it has cut, and does not resume the handler (so nothing is written), while a call whose
# client only half-closed takes it. So once the stream has ended, before anything is written,
# DoPut sends one more (empty) PutResult. The per-batch ones cannot wait for it: pydeephaven reads
# the first batch's PutResult before it half-closes.


async def _half_closed(requests: asyncio.Queue) -> None:
    """Waits for the client's half-close of a DoExchange (None in its `requests`), dropping any
    request before it; raises the error that ends the request stream instead."""
    while True:
        req = await requests.get()
        if req is None:
            return
        if isinstance(req, BaseException):
            raise req


class FlightService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self._waker = Waker()
        self.counters = TransferCounters()  # calls, rows and bytes, for the server's metrics
        self.staging = ctx.engine.staging
        self.sql = FlightSql(ctx)  # Flight SQL's commands, 'q' tickets and actions
        self._doget_caches: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, DogetCache]" = \
            weakref.WeakKeyDictionary()

    def handlers(self) -> dict:
        return service_handlers(FLIGHT_SERVICE, {
            "Handshake": (self.handshake, None, None),
            "ListFlights": (self.list_flights, None, None),
            "GetFlightInfo": (self.get_flight_info, None, None),
            "GetSchema": (self.get_schema, None, None),
            "DoGet": (self.do_get, None, RAW),
            "DoExchange": (self.do_exchange, RAW, RAW),
            "DoPut": (self.do_put, RAW, None),
            "DoAction": (self.do_action, None, None),
            "ListActions": (self.list_actions, None, None),
        })

    # -- helpers ------------------------------------------------------------------------------------
    async def _resolve(self, ticket: bytes, session: Optional[Session]) -> Table:
        """The table a ticket names, to be read or subscribed to; an export of the session still
        being made is waited for. A rollup's own ticket is not a table to read (its View is), as
        Deephaven answers."""
        table = await self.ctx.resolve(ticket, session)
        if isinstance(table, RollupHandle):
            raise CallError(f"Ticket ({'/'.join(parse_ticket(ticket).to_path())}) is not a subscribable table.",
                            "FAILED_PRECONDITION")
        return table

    async def _resolve_descriptor(self, desc, session: Optional[Session]) -> tuple[Table, list[str]]:
        if desc.type != flight_pb2.FlightDescriptor.PATH:
            raise CallError("only PATH flight descriptors are supported", "FAILED_PRECONDITION")
        path = list(desc.path)
        t = ticket_from_path(path)
        return await self.ctx.resolve_parsed(t, session), path

    @staticmethod
    def _flight_info(table: Table, path: list[str]) -> flight_pb2.FlightInfo:
        desc = flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.PATH, path=path)
        return table_flight_info(table, desc, ticket_from_path(path).to_bytes())

    # -- discovery ----------------------------------------------------------------------------------
    async def handshake(self, request_iterator, context):
        session = await self.ctx.authenticate(context)
        async for _req in request_iterator:
            yield flight_pb2.HandshakeResponse(protocol_version=0, payload=session.token.encode())

    async def list_flights(self, criteria, context):
        await self.ctx.authenticate(context)
        if criteria.expression:
            raise CallError("Criteria expressions are not supported", "INVALID_ARGUMENT")
        for name in self.ctx.scope.names():
            try:
                table = self.ctx.scope.get(name)
            except ResolveError:
                continue  # removed meanwhile
            yield self._flight_info(table, ["scope", name])

    async def get_flight_info(self, desc, context):
        session = await self.ctx.authenticate(context)
        if is_flight_sql_command(desc):
            return await self.sql.flight_info(desc, session)
        table, path = await self._resolve_descriptor(desc, session)
        return self._flight_info(table, path)

    async def get_schema(self, desc, context):
        session = await self.ctx.authenticate(context, send_header=False)
        try:
            table, _ = await self._resolve_descriptor(desc, session)
        except BaseException:
            await self.ctx.send_session_header(context, session)
            raise
        # a scope table, whatever named it (an export FetchTable made): the header says which
        scope = ((SCOPE_TABLE_HEADER, table.name),) if self.ctx.engine.resolve(table.name) is table else ()
        await self.ctx.send_session_header(context, session, scope)
        return flight_pb2.SchemaResult(schema=ipc_encapsulated_schema(TableWire(table).schema))

    # -- DoGet ----------------------------------------------------------------------------------------
    async def do_get(self, ticket, context):
        counters = self.counters
        counters.doget_requests += 1
        session = await self.ctx.authenticate(context)
        if ticket.ticket[:1] == TICKET_ROUTE:  # a Flight SQL result or catalog: read once, then released
            table, release = await self.sql.open(ticket.ticket, session)
            try:
                async for p in self._snapshot(table):
                    yield p
            finally:
                await self.ctx.run(release)
            return
        table = await self._resolve(ticket.ticket, session)
        async for p in self._snapshot(table):
            yield p

    def _doget_cache(self) -> DogetCache:
        """This event loop's cache of encoded DoGets (the gRPC side and the web side may run on
        loops of their own)."""
        loop = asyncio.get_running_loop()
        cache = self._doget_caches.get(loop)
        if cache is None:
            cache = self._doget_caches[loop] = DogetCache(self.ctx.config.doget_cache_bytes)
        return cache

    async def _snapshot(self, table: Table):
        """A DoGet's messages for `table`: its schema, then its rows. DoGets of a table that has
        not changed share one encoding (doget_cache.py); a table of mostly stable rows, such as a
        history, is read and sent a piece at a time (see DogetSnapshot)."""
        counters = self.counters
        started = time.perf_counter()
        cache = self._doget_cache()
        version = DogetSnapshot.table_version(table)  # a failed table raises its status
        entry = cache.lookup(table, version)
        if entry is None and cache.shareable(table.schema, table.size):
            entry = cache.produce(table, version, functools.partial(self._doget_payloads, table))
        figures: dict = entry.figures if entry is not None else {}
        source = entry.follow() if entry is not None else self._doget_payloads(table, figures)
        sent = messages = 0
        first_at = None
        async for p in source:
            if first_at is None:
                first_at = time.perf_counter()
            counters.doget_bytes += len(p)
            sent += len(p)
            messages += 1
            yield p
        n = figures.get("rows", 0)
        counters.doget_rows += n
        counters.rows_out(table.name, n)
        read = first_at or time.perf_counter()
        self.ctx.record_snapshot(table, "doget", rows=n, columns=len(table.schema), nbytes=sent, messages=messages,
                                 snapshot_s=read - started, write_s=time.perf_counter() - read,
                                 step=figures.get("step", -1))

    async def _doget_payloads(self, table: Table, figures: dict):
        """The FlightData of a DoGet of `table`: its schema, then its rows, read a piece at a time
        when most of them are stable (DogetSnapshot); `figures` gets the rows and the step."""
        wire = TableWire(table)
        cfg = self.ctx.config
        snap = await self.ctx.run(functools.partial(DogetSnapshot.take, wire, limits=cfg.encode,
                                                    piece_rows=cfg.doget_piece_rows))
        figures["rows"], figures["step"], figures["version"] = snap.num_rows, snap.step, snap.version
        pieces = snap.messages()
        yield wire.schema_payload(False)
        if snap.num_rows or table.is_refreshing:  # an empty static table: the schema only (docs/flows.md#doget)
            msg = await self.ctx.run(next, pieces, None)
            while msg is not None:
                async for p in self._payloads(msg, EncodeOptions()):
                    yield p
                msg = await self.ctx.run(next, pieces, None)

    async def _payloads(self, msg, opts: EncodeOptions):
        async for p in encoded_payloads(msg, opts, self.ctx.executor, self.ctx.config.payloads_per_hop):
            yield p

    # -- DoExchange -----------------------------------------------------------------------------------
    async def do_exchange(self, request_iterator, context):
        session = await self.ctx.authenticate(context)
        requests: asyncio.Queue = asyncio.Queue()

        async def read():
            stream = ExchangeReader()
            try:
                async for raw in request_iterator:
                    if len(raw) > self.ctx.config.inline_request_bytes:
                        event = await self.ctx.run(stream.feed, raw)  # a large request is parsed off the loop
                    else:
                        event = stream.feed(raw)
                    if not isinstance(event, Opening):  # pyarrow's descriptor-only first message: nothing to do
                        requests.put_nowait(event.request)
                stream.close()
                requests.put_nowait(None)  # half-close
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the writer, which ends the call
                requests.put_nowait(exc)

        reader = asyncio.ensure_future(read())
        handle: Optional[SubscriptionHandle] = None
        follower = None
        forget_end: Optional[Callable[[], None]] = None
        sub_id, outcome = None, "ended (OK)"
        try:
            req = await requests.get()
            if req is None:
                return
            if isinstance(req, BaseException):
                raise req
            if isinstance(req, barrage.SnapshotRequest):
                async for p in self._snapshot_request(req, session, requests):
                    yield p
                return
            if not req.ticket:
                raise CallError("Ticket not specified.", "INVALID_ARGUMENT")
            table = await self._resolve(req.ticket, session)
            table, view, options = await self.ctx.run(self._subscription_args, req, session, table)
            cfg = self.ctx.config
            handle = SubscriptionHandle(self.ctx.registry, table, view, options, executor=self.ctx.executor,
                                        inline_cells=cfg.inline_cells, payloads_per_hop=cfg.payloads_per_hop,
                                        waker=self._waker)
            await handle.open()
            # the publisher's subscriber id: the SubscriptionId of tickwire.barrage_performance
            sub_id = handle.sub.id
            log.info("subscription %d started: table %r, %s (session %d, peer %s)", sub_id, table.name,
                     describe_view(view, len(table.schema)), session.id, context.peer(),
                     extra={"event": "subscription_start", "subscription": sub_id, "table": table.name,
                            "view": describe_view(view, len(table.schema)), "session": session.id,
                            "peer": context.peer()})
            # the session's end (closed, expired) stops its subscriptions, as Deephaven's does; a
            # server that stops leaves them to the transport (clients reconnect to the next one)
            loop, session_ended = asyncio.get_running_loop(), asyncio.Event()

            def stop(subscription: SubscriptionHandle = handle) -> None:
                session_ended.set()
                subscription.end()

            def session_over(reason: str) -> None:  # any thread: the one that ends the session
                if reason != SHUTDOWN:
                    with contextlib.suppress(RuntimeError):  # the loop is gone: nobody reads any more
                        loop.call_soon_threadsafe(stop)
            forget_end = session.on_end(session_over)
            follower = asyncio.ensure_future(self._follow(requests, handle, session, table, sub_id))
            counters = self.counters
            async for p in handle.payloads():
                counters.exchange_messages += 1
                counters.exchange_bytes += len(p)
                yield p
            if session_ended.is_set() and not follower.done():
                # nothing more is sent, and the call stays open until the client half-closes (then
                # OK), as Deephaven never half-closes a Barrage stream before its client does
                outcome = "stopped (its session ended)"
                follower.cancel()
                self.counters.retire(handle.sub)
                handle.close()
                await _half_closed(requests)
        except BaseException as exc:
            outcome = outcome_of(exc)
            raise
        finally:
            if sub_id is not None:
                log.info("subscription %d %s: table %r (session %d)", sub_id, outcome, handle.table.name, session.id,
                         extra={"event": "subscription_end", "subscription": sub_id, "table": handle.table.name,
                                "outcome": outcome, "session": session.id})
            elif outcome != "ended (OK)":  # before a subscription started: a refused request, or the client gone
                log.info("exchange %s before a subscription started (session %d, peer %s)", outcome, session.id,
                         context.peer(), extra={"event": "exchange_end", "outcome": outcome, "session": session.id,
                                                "peer": context.peer()})
            reader.cancel()
            if forget_end is not None:
                forget_end()
            if follower is not None:
                follower.cancel()
            if handle is not None:
                self.counters.retire(handle.sub)
                handle.close()

    async def _follow(self, requests: asyncio.Queue, handle: SubscriptionHandle, session, table: Table,
                      sub_id: int = 0) -> None:
        """Hands a running subscription's later requests to its handle: view changes, the end of
        the request stream, or the error that ends the call."""
        try:
            while True:
                req = await requests.get()
                if req is None:
                    handle.end()  # client half-closed: end with OK
                    return
                if isinstance(req, BaseException):
                    raise req
                if not isinstance(req, barrage.SubscriptionRequest):
                    raise CallError("expected a subscription request", "INVALID_ARGUMENT")
                _t, new_view, _o = await self.ctx.run(self._subscription_args, req, session, table)
                await handle.change(new_view)
                log.info("subscription %d changed: table %r, %s", sub_id, table.name,
                         describe_view(new_view, len(table.schema)),
                         extra={"event": "subscription_change", "subscription": sub_id, "table": table.name,
                                "view": describe_view(new_view, len(table.schema))})
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - ends the call with its status
            handle.end(exc)

    def _subscription_args(self, req: barrage.SubscriptionRequest, session, table: Table):
        view = requested(req.columns, req.viewport, bool(req.reverse_viewport), ncols=len(table.schema),
                         blink=bool(table.attributes.get("BlinkTable")),
                         max_ranges=self.ctx.config.max_viewport_ranges, table=table.name)
        return table, view, req.options

    async def _snapshot_request(self, req: barrage.SnapshotRequest, session, requests: asyncio.Queue):
        if not req.ticket:
            raise CallError("Ticket not specified.", "INVALID_ARGUMENT")
        table = await self._resolve(req.ticket, session)
        wire = TableWire(table)
        opts = EncodeOptions.of(req.options)

        def build():
            cols = requested_columns(req.columns, len(wire.names), "snapshot columns")
            viewport = requested_viewport(req.viewport, self.ctx.config.max_viewport_ranges)
            msg, n = snapshot_message(wire, columns=cols, viewport=viewport, reverse=bool(req.reverse_viewport),
                                      doget=False, limits=self.ctx.config.encode)
            return msg, n, len(wire.names) if cols is None else len(cols)
        started = time.perf_counter()
        msg, n, columns = await self.ctx.run(build)  # a failed table raises its status
        read = time.perf_counter()
        counters = self.counters
        counters.snapshot_reply(table.name, n)
        schema = wire.schema_payload(False)
        counters.exchange_messages += 1
        counters.exchange_bytes += len(schema)
        sent, messages = len(schema), 1
        yield schema
        async for p in self._payloads(msg, opts):
            counters.exchange_messages += 1
            counters.exchange_bytes += len(p)
            sent += len(p)
            messages += 1
            yield p
        self.ctx.record_snapshot(table, "snapshot", rows=n, columns=columns, nbytes=sent, messages=messages,
                        snapshot_s=read - started, write_s=time.perf_counter() - read, step=msg.step)
        # the stream ends (OK) once the client half-closes (docs/flows.md#half-close-and-end-of-stream)
        await _half_closed(requests)

    # -- DoPut ------------------------------------------------------------------------------------------
    async def do_put(self, request_iterator, context):
        """An upload is applied whole or not at all: its batches are decoded as they arrive (each
        acknowledged with a PutResult, and the stream's end with one more: see `_past_deadline`
        above), and only a stream that ends cleanly is written, in one
        write that the next cycle applies, before the call returns (read-your-writes). A refused
        message, a cut stream or a write the table refuses leaves the table, and the catalog, as
        they were.

        An upload whose app_metadata names a transaction (protocol/txn.py) is staged instead, under
        its producer, batch, part and attempt, within the staging area's bounds (a part that does
        not fit waits: the stream is not read meanwhile); it is committed at its end when the
        transaction says so. Its last PutResult's app_metadata is a JSON object saying what
        happened: {"staged": true, "rows", "bytes"} or {"applied", "replay", "rows"}.

        An upload to ['export', id] claims that export as soon as its descriptor is read: calls
        naming it meanwhile wait for the upload to end (and hear its error when it fails)."""
        counters = self.counters
        counters.doput_requests += 1
        session = await self.ctx.authenticate(context)
        upload = UploadDecoder()
        received: list[pa.Table] = []
        staged: Optional[_Staged] = None
        result: Optional[ExportClaim] = None
        try:
            async for raw in request_iterator:
                counters.doput_bytes += len(raw)
                for event in upload.feed(raw):
                    if isinstance(event, Destination):
                        result = self._claim_put(event.path, session)  # before anything is awaited
                        continue
                    if isinstance(event, Transaction):
                        staged = await self.ctx.run(self._begin_stage, upload, event)
                        continue
                    if not isinstance(event, Batch):
                        continue  # the destination, options and schema are kept by the decoder
                    if staged is None:
                        received.append(await self.ctx.run(event.decode))  # costs what the batch holds: off the loop
                    elif staged.part is not None:  # (a batch the table has: read, not kept)
                        t = await self.ctx.run(event.decode)
                        await self._reserve(staged.part, t.nbytes)
                        self.staging.add(staged.part, t)
                    yield flight_pb2.PutResult()
            end = upload.close()
            _past_deadline(context)
            yield flight_pb2.PutResult()  # on a cut call, the send fails and this is not resumed
            rows = sum(t.num_rows for t in received)
            if staged is not None:
                result = await self.ctx.run(self._end_stage, staged)
                rows = result.get("rows", 0)
                yield flight_pb2.PutResult(app_metadata=json.dumps(result).encode())
            else:
                await self.ctx.run(self._put, end, received, session, result)
        except (asyncio.CancelledError, GeneratorExit) as exc:
            if result is not None:
                result.fail(exc)
            if staged is not None and staged.part is not None:
                self.staging.cancel(staged.part)
            log.info("DoPut to %s cut by the client: nothing written (session %d)", upload.path, session.id,
                     extra={"event": "doput_refused", "path": upload.path, "session": session.id,
                            "outcome": "cancelled"})
            raise
        except BaseException as exc:
            if result is None and isinstance(exc, UploadError):
                # refused in the message that named the destination (its schema, say): the export
                # is claimed all the same, so a call naming it hears this refusal, not NOT_FOUND
                result = self._claim_refused(upload.path, session)
            if result is not None:
                result.fail(exc)
            if staged is not None and staged.part is not None:
                self.staging.cancel(staged.part)
            log.warning("DoPut to %s refused (session %d, peer %s): %s", upload.path, session.id, context.peer(),
                        outcome_of(exc), extra={"event": "doput_refused", "path": upload.path,
                                                "session": session.id, "peer": context.peer(),
                                                "outcome": outcome_of(exc)})
            raise
        counters.doput_rows += rows
        log.debug("DoPut to %s: %d rows (session %d)", end.path, rows, session.id,
                  extra={"event": "doput", "path": end.path, "rows": rows, "session": session.id})

    # -- staged, exactly-once uploads (tickwire.server.engine.staging) -----------------------------------------
    def _scope_name(self, path: list[str], what: str) -> str:
        t = ticket_from_path(path)
        if not isinstance(t, ScopeTicket):
            raise CallError(f"{what} names a table as ['scope', name], got {path}", "INVALID_ARGUMENT")
        existing = self.ctx.engine.resolve(t.name, hidden=True)
        if t.name.startswith("__") or (existing is not None and existing.hidden):
            raise CallError(f"{what}: scope names starting with '__' are reserved, "
                                                f"got {t.name!r}", "INVALID_ARGUMENT")
        return t.name

    def _begin_stage(self, upload: UploadDecoder, txn: Transaction) -> "_Staged":
        if upload.schema is None:
            raise CallError("DoPut: the transaction must follow the schema", "INVALID_ARGUMENT")
        assert upload.path is not None  # the schema came after the descriptor, which names the path
        name = self._scope_name(upload.path, "a DoPut transaction")
        writer = self.staging.destination(name, txn.mode, txn.keys, txn.delete_column, txn.max_rows, upload.keys)
        if self.staging.applied(name, txn.producer, txn.batch):
            return _Staged(writer, txn, None)
        plain = pa.schema([pa.field(f.name, f.type) for f in upload.schema])
        return _Staged(writer, txn, self.staging.begin(writer, plain, txn.producer, txn.batch, txn.part, txn.attempt))

    async def _reserve(self, part: StagedPart, nbytes: int) -> None:
        """Room for `nbytes` more of a staged part; waits (not reading the stream) while the
        staging area is full, up to its wait timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.staging.wait_timeout
        delay = 0.005
        while not self.staging.try_reserve(part, nbytes):
            if loop.time() > deadline:
                raise CallError(f"DoPut: no room to stage batch {part.batch} part {part.part!r} of producer "
                                f"{part.producer!r} within {self.staging.wait_timeout:.0f} s (staging area full)",
                                "RESOURCE_EXHAUSTED")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _end_stage(self, staged: "_Staged") -> dict:
        txn = staged.txn
        if staged.part is None:
            log.info("DoPut to %r: batch %d of producer %r was already applied; acknowledged, not applied again",
                     staged.writer.name, txn.batch, txn.producer)
            return {"applied": False, "replay": True, "rows": 0}
        self.staging.finish(staged.part)
        if not txn.commit:
            return {"staged": True, "rows": staged.part.rows, "bytes": staged.part.nbytes}
        return self.staging.commit(staged.writer, txn.producer, txn.batch, [(txn.part, txn.attempt)])

    def _claim_put(self, path: list[str], session: Session) -> Optional[ExportClaim]:
        """The claim of an upload's destination when it is an export (None for a scope table)."""
        t = ticket_from_path(path)
        if not isinstance(t, ExportTicket):
            return None
        if t.export_id <= 0:
            raise CallError(f"DoPut export id must be positive, got {t.export_id}", "INVALID_ARGUMENT")
        return session.claim(t.export_id)

    def _claim_refused(self, path: Optional[list[str]], session: Session) -> Optional[ExportClaim]:
        """The claim of a refused upload's export destination, to be failed with the refusal
        (None for a scope table, no destination, or an id that cannot be claimed)."""
        if path is None:
            return None
        try:
            return self._claim_put(path, session)
        except (CallError, ResolveError, ProtocolError):
            return None

    def _put(self, end, received: list[pa.Table], session: Session, result: Optional[ExportClaim] = None) -> None:
        data = [t for t in received if t.num_rows]
        rows = (pa.concat_tables(data) if len(data) > 1 else data[0]) if data else None
        table = self._put_target(end.path, end.schema, end.keys, session, result, rows)
        if rows is not None and table.is_refreshing:  # (a static export was made holding them)
            self.ctx.engine.write(table, rows)

    def _put_target(self, path: list[str], schema: pa.Schema, keys: tuple[str, ...], session: Session,
                    result: Optional[ExportClaim] = None, rows: Optional[pa.Table] = None) -> Table:
        """The table an upload writes. An upload to an export without key columns makes a static
        table holding `rows` (the whole upload), as Deephaven's is: what derives from it is
        static too (so it may use the row variables `i`, `ii`). A keyed upload to an export
        makes a keyed table, and one to ['scope', name] appends to (or upserts into) the named
        table, made unless it exists; the caller writes `rows` into those."""
        t = ticket_from_path(path)
        engine = self.ctx.engine
        plain = pa.schema([pa.field(f.name, f.type) for f in schema])
        attrs = {k: v for k, v in attributes_from_schema(schema).items() if k not in ("AppendOnly", "AddOnly")}
        attrs[BARRAGE_SCHEMA] = plain  # served with the uploaded types Deephaven keeps (docs/types.md)
        if isinstance(t, ScopeTicket):
            existing = engine.resolve(t.name, hidden=True)
            if t.name.startswith("__") or (existing is not None and existing.hidden):
                # the same answer whether or not such a table exists: session tables stay unreachable
                raise CallError(f"DoPut: scope names starting with '__' are reserved, "
                                                    f"got {t.name!r}", "INVALID_ARGUMENT")
            if existing is not None:
                if kind_of(existing) not in ("append", "keyed"):
                    raise CallError(f"table {t.name!r} is a {type(existing).__name__}; "
                                    "DoPut appends only to append-only or keyed tables", "FAILED_PRECONDITION")
                return existing
            spec = TableSpec(t.name, "keyed" if keys else "append", plain, keys=keys, attributes=attrs)
            table, _created = engine.get_or_create(spec)
            return table
        if isinstance(t, SharedTicket):  # Deephaven's answer: a shared ticket is only published to
            raise CallError(f"Could not publish 'Flight.Descriptor' to shared ticket '{t.shared_id.hex()}' (hex): "
                            "can only publish directly from a session export to a shared ticket", "FAILED_PRECONDITION")
        if not isinstance(t, ExportTicket):
            raise CallError(f"DoPut destination must be ['scope', name] or ['export', id], "
                                                f"got {path}", "INVALID_ARGUMENT")
        if result is None:  # (do_put claims it when the descriptor arrives)
            result = self._claim_put(path, session)
        assert result is not None  # an export ticket: _claim_put claims it
        # the name says nothing about the session, and nobody can guess it
        name = f"__export.put.{secrets.token_hex(8)}"
        if keys:
            spec = TableSpec(name, "keyed", plain, keys=keys, hidden=True, attributes=attrs)
        else:
            held = plain.empty_table() if rows is None else pa.Table.from_arrays(rows.columns, schema=plain)
            spec = TableSpec(name, "static", data=held, hidden=True, attributes=attrs)
        table, _created = engine.get_or_create(spec)
        # owned by the session like any export: hidden, and freed by Release, CloseSession or expiry
        ops = self.ctx.ops
        ops.adopt(table)
        ops.hold(table)
        try:
            result.fulfil(table)
        except BaseException:
            ops.drop(table)  # removes it again
            raise
        return table

    # -- actions ------------------------------------------------------------------------------------------
    ACTIONS = {"list-tables": "JSON list of the published tables: name, rows, refreshing, kind, columns, system",
               ACTION_COMMIT: "exactly-once commit of a staged batch (JSON body, see protocol/txn.py); "
                              "answers {applied, replay, rows}",
               ACTION_ABORT: "discard the staged parts of a batch (JSON body {producer, batch}); answers {discarded}",
               ACTION_STAGING: "JSON status of the staging area: bytes staged, limits, staged batches and parts"}

    async def do_action(self, action, context):
        session = await self.ctx.authenticate(context)
        if action.type in (ACTION_CREATE, ACTION_CLOSE):
            for body in self.sql.do_action(action, session):
                yield flight_pb2.Result(body=body)
            return
        if action.type == "list-tables":
            yield flight_pb2.Result(body=json.dumps(await self.ctx.run(self._list_tables)).encode())
            return
        if action.type in (ACTION_COMMIT, ACTION_ABORT, ACTION_STAGING):
            yield flight_pb2.Result(body=json.dumps(await self.ctx.run(self._staging_action, action.type,
                                                                       action.body)).encode())
            return
        raise CallError(f"unknown action {action.type!r}; known: {sorted(self.ACTIONS)} and Flight SQL's "
                        f"{ACTION_CREATE} and {ACTION_CLOSE}", "UNIMPLEMENTED")

    def _staging_action(self, kind: str, body: bytes) -> dict:
        if kind == ACTION_STAGING:
            return self.staging.status()
        try:
            if kind == ACTION_ABORT:
                abort = parse_abort(body)
                n = self.staging.abort(abort.producer, abort.batch)
                log.info("batch %d of producer %r aborted: %d staged part(s) discarded", abort.batch,
                         abort.producer, n)
                return {"discarded": n}
            req = parse_commit(body)
        except TxnError as exc:
            raise CallError(str(exc), "INVALID_ARGUMENT") from None
        name = self._scope_name(["scope", req.table], f"action {ACTION_COMMIT}")
        writer = self.staging.destination(name, req.mode, req.keys, req.delete_column, req.max_rows)
        result = self.staging.commit(writer, req.producer, req.batch, list(req.parts))
        log.debug("batch %d of producer %r committed into %r: %s", req.batch, req.producer, name, result)
        return result

    def _list_tables(self) -> list[dict]:
        from tickwire.protocol.schema import served_types

        with self.ctx.engine.reading() as engine:
            return [{"name": t.name, "rows": t.size, "refreshing": t.is_refreshing, "kind": type(t).__name__,
                     "columns": [{"name": f.name, "type": str(w)}  # the type DoGet and subscriptions send
                                 for f, w in zip(t.schema, served_types(t.schema, t.attributes))],
                     "system": is_system(t)}
                    for t in engine.tables(system=self.ctx.scope.list_system)]

    async def list_actions(self, _empty, context):
        await self.ctx.authenticate(context)
        for name, desc in self.ACTIONS.items():
            yield flight_pb2.ActionType(type=name, description=desc)


class _Staged:
    """A DoPut being staged: the writer its transaction describes, and its part (None when the
    table has the batch already: the upload is read and acknowledged, nothing is kept)."""

    __slots__ = ("writer", "txn", "part")

    def __init__(self, writer, txn: Transaction, part: Optional[StagedPart]):
        self.writer, self.txn, self.part = writer, txn, part
