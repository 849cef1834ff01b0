"""What the session and table services share: export tickets and holding exported tables."""
from __future__ import annotations

from tickwire.protocol.tickets import ExportTicket, TicketError, parse_ticket
from tickwire.server.engine import Table
from tickwire.server.services.rpc import CallError
from tickwire.server.services.sessions import Session

__all__ = ["export_id", "export"]


def export_id(ticket: bytes, what: str) -> int:
    """The export id of an `e` + int32 LE ticket; INVALID_ARGUMENT (or the ticket's own status) else."""
    try:
        t = parse_ticket(ticket)
    except TicketError as exc:
        raise CallError(f"{what}: {exc}", exc.code) from None
    if not isinstance(t, ExportTicket):
        raise CallError(f"{what} must be an export ticket ('e' + int32 LE), got {ticket!r}", "INVALID_ARGUMENT")
    return t.export_id


def export(ops, session: Session, result_ticket: bytes, table: Table) -> None:
    """Exports `table` as the session's `result_ticket`; the export holds it until released."""
    eid = export_id(result_ticket, "result_id")
    ops.hold(table)  # before the export: a session ending meanwhile drops this hold
    try:
        session.export(eid, table)
    except BaseException:
        ops.drop(table)
        raise
