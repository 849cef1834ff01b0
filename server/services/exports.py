"""What the session and table services share: export tickets, claiming result tickets and holding
exported tables."""
from __future__ import annotations

from tickwire.protocol.tickets import ExportTicket, TicketError, parse_ticket
from tickwire.server.engine import Table
from tickwire.server.services.rpc import CallError
from tickwire.server.services.sessions import ExportClaim, Session

__all__ = ["export_id", "claim", "export"]


def export_id(ticket: bytes, what: str) -> int:
    """The export id of an `e` + int32 LE ticket; INVALID_ARGUMENT (or the ticket's own status) else."""
    try:
        t = parse_ticket(ticket)
    except TicketError as exc:
        raise CallError(f"{what}: {exc}", exc.code) from None
    if not isinstance(t, ExportTicket):
        raise CallError(f"{what} must be an export ticket ('e' + int32 LE), got {ticket!r}", "INVALID_ARGUMENT")
    return t.export_id


def claim(session: Session, result_ticket: bytes, what: str = "result_id") -> ExportClaim:
    """Claims `result_ticket` in `session` for the running call (before its first await): calls
    naming it from now on wait for the table the call makes, or hear why it could not."""
    return session.claim(export_id(result_ticket, what))


def export(ops, claim: ExportClaim, table: Table) -> None:
    """Fulfils `claim` with `table`; the export holds it until released."""
    ops.hold(table)  # before the export: a session ending meanwhile drops this hold
    try:
        claim.fulfil(table)
    except BaseException:
        ops.drop(table)
        raise
