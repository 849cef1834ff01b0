"""Deephaven's TableService: FetchTable, ApplyPreviewColumns, GetExportedTableCreationResponse, the
table operations of `tickwire.server.services.table_ops` (Sort, Filter, UnstructuredFilter, View, Select,
Update, UpdateView, LazyUpdate, Head, Tail, and those registered by other modules, such as
`basic_ops`: DropColumns, Slice, Flatten, Snapshot, MetaTable, ComputeColumnStatistics, and the
source-less EmptyTable and TimeTable) alone or in a Batch, SeekRow, and ExportedTableUpdates (the
sizes of a session's exports, held open). Every other method answers UNIMPLEMENTED by name."""
from __future__ import annotations

import asyncio
import uuid
from typing import Any, Union

from tickwire.protocol.proto import table_pb2
from tickwire.protocol.proto.methods import TABLE_SERVICE
from tickwire.protocol.schema import ipc_encapsulated_schema
from tickwire.protocol.tickets import ExportTicket
from tickwire.server.engine import Table
from tickwire.server.engine.publishing import TableWire
from tickwire.server.services import (
    aggregations,  # noqa: F401  (registers Aggregate, AggregateAll, ...)
    group_ops,  # noqa: F401  (registers HeadBy, TailBy, Ungroup)
    join_ops,  # noqa: F401  (registers NaturalJoinTables, ExactJoinTables, WhereIn, ...)
    update_by_ops,  # noqa: F401  (registers UpdateBy)
)
from tickwire.server.services.basic_ops import SOURCELESS, answers_source, make_sourceless, seek_row
from tickwire.server.services.context import ServerContext
from tickwire.server.services.exports import claim, export, export_id
from tickwire.server.services.input_table_service import create_input_table, input_table_for
from tickwire.server.services.rpc import CallError, CreationError, service_handlers, short
from tickwire.server.services.sessions import ExportClaim, Session
from tickwire.server.services.table_ops import EXTRA_SOURCES, OPERATIONS, SOURCE_FIELDS, SOURCE_LISTS

__all__ = ["TableService"]

#: operations whose result is their source table itself
_AS_IS = ("fetch_table", "apply_preview_columns")


class _FailedStep:
    """A Batch step the engine could not make, or one made from such a step: `context` is the
    reference its answer and its dependents' answers carry, as Deephaven's do."""

    __slots__ = ("context",)

    def __init__(self, context: str):
        self.context = context


class _DependencyFailed(Exception):
    """A Batch step names a failed step by its batch_offset."""

    def __init__(self, failed: _FailedStep):
        super().__init__(failed.context)
        self.failed = failed


#: what a Batch step names by batch_offset: a table made, or a failed step
_Step = Union[Table, _FailedStep]


def _set_result_id(resp: table_pb2.ExportedTableCreationResponse, result_ticket: bytes,
                   batch_offset: int | None) -> None:
    """An answer's result_id: the export ticket, or, for a Batch step without one, its batch_offset."""
    if result_ticket or batch_offset is None:
        resp.result_id.ticket.ticket = result_ticket
    else:
        resp.result_id.batch_offset = batch_offset


class TableService:
    def __init__(self, ctx: ServerContext):
        self.ctx = ctx
        self.ops = ctx.ops

    def handlers(self) -> dict:
        impls = {
            "FetchTable": (self.fetch_table, None, None),
            "ApplyPreviewColumns": (self.apply_preview_columns, None, None),
            "ExportedTableUpdates": (self.exported_table_updates, None, None),
            "GetExportedTableCreationResponse": (self.get_exported, None, None),
            "Batch": (self.batch, None, None),
            "SeekRow": (self.seek_row, None, None),
            "CreateInputTable": (create_input_table(self.ctx), None, None),
            "LeftJoinTables": (self.left_join_tables, None, None),
        }
        for method, field_name in OPERATIONS.items():
            impls[method] = (self._operation(field_name), None, None)
        return service_handlers(TABLE_SERVICE, impls)

    def _creation_response(self, result_ticket: bytes, table: Table,
                           batch_offset: int | None = None) -> table_pb2.ExportedTableCreationResponse:
        """The answer for a made table: `result_id` is its export ticket, or, for a Batch step
        without one, the step's `batch_offset` (as Deephaven answers: its clients skip those)."""
        wire = TableWire(table)
        resp = table_pb2.ExportedTableCreationResponse(success=True, is_static=not table.is_refreshing,
                                                       size=table.size,
                                                       schema_header=ipc_encapsulated_schema(wire.schema))
        _set_result_id(resp, result_ticket, batch_offset)
        return resp

    @staticmethod
    def _failure_response(result_ticket: bytes, batch_offset: int,
                          error_info: str) -> table_pb2.ExportedTableCreationResponse:
        """The answer for a Batch step that was not made (see `batch`)."""
        resp = table_pb2.ExportedTableCreationResponse(success=False, error_info=error_info)
        _set_result_id(resp, result_ticket, batch_offset)
        return resp

    async def _source(self, ref, session: Session, earlier: list[_Step] | None = None) -> Table:
        """The source table of an operation; an export of the session still being made (by a
        call the client sent before this one, or an earlier step of this batch) is waited for."""
        which = ref.WhichOneof("ref")
        if which == "ticket":
            return await self.ctx.resolve(ref.ticket.ticket, session)
        if which == "batch_offset":
            i = ref.batch_offset
            if earlier is None or not 0 <= i < len(earlier):
                raise CallError(f"batch_offset {i} does not name an earlier operation", "INVALID_ARGUMENT")
            step = earlier[i]
            if isinstance(step, _FailedStep):
                raise _DependencyFailed(step)
            return step
        raise CallError("source_id not supplied", "INVALID_ARGUMENT")

    async def _main_source(self, kind: str, req, session: Session,
                           earlier: list[_Step] | None = None) -> Table | None:
        """An operation's main source: None for an operation without one, the first of the
        list for an operation on a list of tables, else the table its source field names."""
        if kind in SOURCELESS:
            return None
        listed = SOURCE_LISTS.get(kind)
        if listed is not None:
            refs = listed(req)
            if not refs:
                raise CallError("Cannot merge zero source tables." if kind == "merge"
                                else "Cannot join zero source tables." if kind == "multi_join"
                                else f"{kind}: no source tables supplied", "INVALID_ARGUMENT")
            return await self._source(refs[0], session, earlier)
        return await self._source(getattr(req, SOURCE_FIELDS.get(kind, "source_id")), session, earlier)

    async def _extra_sources(self, kind: str, req, session: Session,
                             earlier: list[_Step] | None = None) -> dict[str, Any]:
        """The tables an operation's other TableReference fields name (those set), by field, and
        for an operation on a list of tables, all of them (`sources`)."""
        out: dict[str, Any] = {f: await self._source(getattr(req, f), session, earlier)
               for f in EXTRA_SOURCES.get(kind, ()) if req.HasField(f)}
        listed = SOURCE_LISTS.get(kind)
        if listed is not None:
            out["sources"] = [await self._source(r, session, earlier) for r in listed(req)]
        return out

    def _apply_op(self, kind: str, req, source: Table | None, result: ExportClaim | None = None,
                  step: int | None = None, extras: dict[str, Any] | None = None
                  ) -> tuple[table_pb2.ExportedTableCreationResponse, Table]:
        """Makes (or, for fetch_table, finds) the table of one operation on `source` and exports
        it under the claimed result ticket, when there is one; otherwise the table is held for
        the running Batch (the caller drops that hold when the batch ends). Runs off the event loop."""
        if kind in SOURCELESS:
            table = make_sourceless(self.ops, kind, req)
        elif kind == "create_input_table":
            table = input_table_for(self.ctx, req, source)
        else:
            if source is None:
                raise CallError(f"{kind}: source_id not supplied", "INVALID_ARGUMENT")
            if kind in _AS_IS or answers_source(kind, req, source):
                table = source
            else:
                table = self.ops.build(kind, req, source, extras)
        if result is not None:
            export(self.ops, result, table)  # an owned table nobody holds goes at once on failure
        else:
            self.ops.hold(table)
        return self._creation_response(req.result_id.ticket if result is not None else b"", table, step), table

    @staticmethod
    def _need_result(req, name: str) -> None:
        # Deephaven refuses a one-shot operation without a result ticket (its result would be
        # unreachable); a Batch step may omit it when later steps use it by batch_offset
        if not req.result_id.ticket:
            raise CallError(f"{name}: No result ticket supplied", "FAILED_PRECONDITION")

    async def _one_shot(self, kind: str, name: str, req, context):
        """One operation with its own result ticket: claimed before anything is awaited (a call
        the client pipelines after this one, naming the result, waits for it), then the source
        is resolved (waited for, when it is itself pending) and the table made and exported."""
        session = self.ctx.session_of(context)
        try:
            self._need_result(req, name)
            result = claim(session, req.result_id.ticket)
        except BaseException:
            await self.ctx.send_session_header(context, session)
            raise
        with result:  # an error fails the claim: the calls waiting for it hear the same status
            await self.ctx.send_session_header(context, session)
            source = await self._main_source(kind, req, session)
            extras = await self._extra_sources(kind, req, session)
            resp, _t = await self.ctx.run(self._apply_op, kind, req, source, result, None, extras)
            return resp

    def _operation(self, kind: str):
        method = next(m for m, f in OPERATIONS.items() if f == kind)

        async def handler(req, context):
            return await self._one_shot(kind, method, req, context)
        return handler

    async def left_join_tables(self, req, context):
        """Deephaven 42.7 does not serve LeftJoinTables either; its answer, word for word."""
        await self.ctx.authenticate(context)
        raise CallError("LeftJoinTables is currently unimplemented", "UNIMPLEMENTED")

    async def fetch_table(self, req, context):
        return await self._one_shot("fetch_table", "FetchTable", req, context)

    async def apply_preview_columns(self, req, context):
        """The result is an export of the source table itself, answered like FetchTable.

        Deephaven answers with its source table when no column needs a preview; otherwise with a
        view in which array and vector columns become string previews (when `convert_arrays`)
        and columns of a type not named in `unpreviewed_types` are wrapped for display. tickwire
        makes no previews: every column goes out as it is (the types the JS API names there,
        numbers, booleans, strings, BigDecimal, BigInteger, Instant, LocalDate, LocalTime, as
        themselves; list and binary columns as Arrow lists and binaries, not as strings).
        A preview for those, if a browser needs one, belongs here."""
        return await self._one_shot("apply_preview_columns", "ApplyPreviewColumns", req, context)

    async def seek_row(self, req, context):
        """Deephaven's SeekRow: the position of a value in a column of an exported table (see
        `basic_ops.seek_row`); -1 when no row has it."""
        session = await self.ctx.authenticate(context)
        if not req.source_id.ticket:
            raise CallError("No consoleId supplied", "FAILED_PRECONDITION")  # Deephaven's words
        table = await self.ctx.resolve(req.source_id.ticket, session)
        row = await self.ctx.run(seek_row, self.ops, table, req)
        return table_pb2.SeekRowResponse(result_row=row)

    async def get_exported(self, ticket, context):
        session = await self.ctx.authenticate(context)
        if not ticket.ticket:
            raise CallError("No request ticket supplied", "FAILED_PRECONDITION")
        table = await self.ctx.resolve(ticket.ticket, session)
        return await self.ctx.run(self._creation_response, ticket.ticket, table)

    async def batch(self, req, context):
        """Deephaven's Batch: one answer per step, in order. A step with a result ticket is
        exported; one without is answered with its `batch_offset` and lives only as long as the
        batch's later steps need it (as the parent of what they made).

        Every result ticket is claimed before anything is awaited, so that a call the client
        sends right after the Batch, naming one of them, waits for it.

        A step the engine cannot make (a CreationError) is answered as Deephaven answers it:
        success=false with error_info "<reference> cause: <status>: <message>", and every later
        step made from it success=false with error_info "<reference>" (their tickets fail with
        DEPENDENCY_FAILED); the other steps are made, and the call then ends with the first such
        step's status. Any other refusal ends the batch at once, and every result not made yet
        fails with its status."""
        session = self.ctx.session_of(context)
        results: dict[int, ExportClaim] = {}
        try:
            allowed = {*_AS_IS, *OPERATIONS.values(), "create_input_table"}
            for i, op in enumerate(req.ops):  # refuse the whole batch before exporting anything
                which = op.WhichOneof("op")
                if which not in allowed:
                    raise CallError(f"TableService.Batch operation {i} {which!r} is not supported", "UNIMPLEMENTED")
                ticket = getattr(op, which).result_id.ticket
                if ticket:
                    export_id(ticket, f"Batch operation {i} result_id")
            for i, op in enumerate(req.ops):
                ticket = getattr(op, op.WhichOneof("op")).result_id.ticket
                if ticket:
                    results[i] = claim(session, ticket, f"Batch operation {i} result_id")
        except BaseException as exc:
            for r in results.values():
                r.fail(exc)
            await self.ctx.send_session_header(context, session)
            raise
        done: list[_Step] = []
        unexported: list[Table] = []  # held only while this batch runs
        first_failure: CreationError | None = None
        try:
            await self.ctx.send_session_header(context, session)
            for i, op in enumerate(req.ops):
                which = op.WhichOneof("op")
                step = getattr(op, which)
                try:
                    if which == "create_input_table":  # its source, if any, is the table whose schema it takes
                        source = await self._source(step.source_table_id, session, done) \
                            if step.WhichOneof("definition") == "source_table_id" else None
                    else:
                        source = await self._main_source(which, step, session, done)
                    extras = await self._extra_sources(which, step, session, done)
                    resp, table = await self.ctx.run(self._apply_op, which, step, source, results.get(i), i, extras)
                except _DependencyFailed as dep:
                    done.append(dep.failed)
                    if i in results:
                        results[i].fail(dep)  # (not a status of its own: DEPENDENCY_FAILED)
                    yield self._failure_response(step.result_id.ticket, i, dep.failed.context)
                    continue
                except CreationError as exc:
                    failed = _FailedStep(str(uuid.uuid4()))
                    done.append(failed)
                    first_failure = first_failure or exc
                    if i in results:
                        results[i].fail(exc)
                    yield self._failure_response(step.result_id.ticket, i,
                                                 f"{failed.context} cause: {exc.code}: {exc}")
                    continue
                done.append(table)
                if i not in results:
                    unexported.append(table)
                yield resp
            if first_failure is not None:
                raise first_failure
        except BaseException as exc:  # a refused step, or the call cancelled: nothing more is made
            for r in results.values():
                r.fail(exc)  # (those already made stay)
            raise
        finally:
            if unexported:
                try:  # not awaited: a cancelled call must still let go of its steps
                    self.ctx.executor.submit(self.ops.drop_all, unexported[::-1])
                except RuntimeError:  # the server is stopping: its worker pool is gone
                    pass

    # -- ExportedTableUpdates ---------------------------------------------------------------------
    def _export_sizes(self, session: Session) -> dict[int, tuple[Table, int, str]]:
        """{export id: (table, size, failure message)} of the session's exports, read at one cycle
        boundary (under the graph's lock: off the event loop). A failed table's size is -1."""
        items = session.export_items()
        out = {}
        with self.ctx.engine.reading():
            for eid, table in items:
                failure = table.failure
                if failure is None:
                    out[eid] = (table, table.size, "")
                else:
                    out[eid] = (table, -1, short(str(failure)) or "table failed")
        return out

    async def exported_table_updates(self, _req, context):
        """Held open: an ExportedTableUpdateMessage(export_id, size) for each of the session's
        table exports when it is first seen and whenever its size changes (size -1 and
        `update_failure_message` once it has failed), read every `list_fields_poll_s` and at
        once after an export is added. Ends (OK, as Deephaven's does) when the session ends."""
        session = await self.ctx.authenticate(context)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        over = False

        def poke(*_args) -> None:  # any thread: a worker adding an export, the session's end
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop is gone
                pass

        def ended(_reason: str) -> None:
            nonlocal over
            over = True
            poke()

        forget_end = session.on_end(ended)
        forget_exports = session.on_exports(poke)
        sent: dict[int, tuple[Table, int, str]] = {}
        try:
            while not over:
                wake.clear()  # before the read: a change during it wakes the next one
                sizes = await self.ctx.run(self._export_sizes, session)
                if over:
                    break
                for eid, (table, size, failure) in sizes.items():
                    before = sent.get(eid)
                    if before is not None and before[0] is table and before[1:] == (size, failure):
                        continue
                    sent[eid] = (table, size, failure)
                    msg = table_pb2.ExportedTableUpdateMessage(size=size, update_failure_message=failure)
                    msg.export_id.ticket = ExportTicket(eid).to_bytes()
                    yield msg
                for eid in [e for e in sent if e not in sizes]:
                    del sent[eid]  # released: a new export of that id is new again
                # not asyncio.wait_for: before Python 3.12 it returns instead of raising when the
                # call is cancelled (its socket closed) in the loop iteration the wake-up arrives,
                # and the stream ran on after its call had ended
                woken = asyncio.ensure_future(wake.wait())
                try:
                    await asyncio.wait((woken,), timeout=self.ctx.config.list_fields_poll_s)
                finally:
                    woken.cancel()
        finally:
            forget_end()
            forget_exports()
