"""Deephaven ticket and Flight descriptor routing (docs/flows.md#tickets-and-discovery).

| kind   | ticket bytes                      | descriptor PATH                     |
|--------|-----------------------------------|-------------------------------------|
| scope  | b"s/" + name (UTF-8)              | ["scope", name]                     |
| export | b"e" + int32 LE (exactly 5 bytes) | ["export", "<decimal id>"]          |
| app    | b"a/" + app + b"/f/" + field      | ["app", app, "field", field]        |
| shared | b"h" + raw id bytes               | ["shared", "<hex of id>"]           |

Routing is by the first ticket byte (or by path[0] for descriptors). Errors carry the gRPC status
name Deephaven uses for the same mistake (`code`), so a server can map them one to one.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from tickwire.errors import ProtocolError

__all__ = [
    "SCOPE_TABLE_HEADER",
    "TicketError",
    "ScopeTicket",
    "ExportTicket",
    "AppTicket",
    "SharedTicket",
    "Ticket",
    "parse_ticket",
    "ticket_from_path",
    "scope_ticket",
    "export_ticket",
]


class TicketError(ProtocolError):
    """A ticket or descriptor that cannot be routed; `code` is the gRPC status name to answer with."""

    def __init__(self, message: str, code: str = "FAILED_PRECONDITION"):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ScopeTicket:
    name: str

    def to_bytes(self) -> bytes:
        return b"s/" + self.name.encode("utf-8")

    def to_path(self) -> list[str]:
        return ["scope", self.name]


@dataclass(frozen=True)
class ExportTicket:
    export_id: int

    def to_bytes(self) -> bytes:
        return b"e" + struct.pack("<i", self.export_id)

    def to_path(self) -> list[str]:
        return ["export", str(self.export_id)]


@dataclass(frozen=True)
class AppTicket:
    app_id: str
    field: str

    def to_bytes(self) -> bytes:
        return f"a/{self.app_id}/f/{self.field}".encode("utf-8")

    def to_path(self) -> list[str]:
        return ["app", self.app_id, "field", self.field]


@dataclass(frozen=True)
class SharedTicket:
    shared_id: bytes

    def to_bytes(self) -> bytes:
        return b"h" + self.shared_id

    def to_path(self) -> list[str]:
        return ["shared", self.shared_id.hex()]


Ticket = ScopeTicket | ExportTicket | AppTicket | SharedTicket

#: a response header of a tickwire server's GetSchema when the table it names (an export made by
#: FetchTable, say) is a scope table itself: its name. A fan-out worker serves a subscription to
#: such an export from its replica of that table (tickwire.server.worker).
SCOPE_TABLE_HEADER = "x-tickwire-scope-table"


def scope_ticket(name: str) -> bytes:
    return ScopeTicket(name).to_bytes()


def export_ticket(export_id: int) -> bytes:
    return ExportTicket(export_id).to_bytes()


def _brief(value: object, limit: int = 80) -> str:
    """repr(value) for an error message, cut to about `limit` characters (a ticket or a path can be
    arbitrarily long, and the message is sent back to the client)."""
    r = repr(value)
    return r if len(r) <= limit else f"{r[:limit]}... ({len(r)} characters)"


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TicketError(f"{what} is not valid UTF-8: {exc}", "INVALID_ARGUMENT") from None


def _name(text: str, what: str) -> str:
    """A variable, application or field name: printable text (no control or format characters,
    which no table is named with and which an error message must not echo)."""
    if not text.isprintable():
        raise TicketError(f"{what} {_brief(text)} has unprintable characters", "INVALID_ARGUMENT")
    return text


def parse_ticket(ticket: bytes) -> Ticket:
    """Routes ticket bytes to a typed ticket, or raises TicketError saying why not."""
    t = bytes(ticket)
    if not t:
        raise TicketError("ticket not supplied (empty ticket)")
    route = t[:1]
    if route == b"s":
        if len(t) < 3 or t[1:2] != b"/":
            raise TicketError(f"scope ticket must be 's/<name>', got {_brief(t)}")
        return ScopeTicket(_name(_text(t[2:], "scope ticket name"), "scope ticket name"))
    if route == b"e":
        if len(t) != 5:
            raise TicketError(f"export ticket must be 'e' + 4-byte little-endian id, found 0x{t.hex()} (hex)")
        export_id = struct.unpack("<i", t[1:])[0]
        if export_id == 0:
            raise TicketError("export id 0 is invalid", "INVALID_ARGUMENT")
        return ExportTicket(export_id)
    if route == b"a":
        text = _text(t, "application ticket")
        parts = text.split("/")
        if len(parts) != 4 or parts[0] != "a" or parts[2] != "f" or not parts[1] or not parts[3]:
            raise TicketError(f"application ticket must be 'a/<app>/f/<field>', got {_brief(text)}")
        return AppTicket(_name(parts[1], "application id"), _name(parts[3], "field name"))
    if route == b"h":
        if len(t) < 2:
            raise TicketError("shared ticket has no id")
        return SharedTicket(t[1:])
    shown = f"'{route.decode()}' " if 0x20 < t[0] < 0x7F else ""  # the byte itself only when printable
    raise TicketError(f"no resolver for route {shown}(0x{t[0]:02x}) in ticket 0x{t[:16].hex()}"
                      + ("..." if len(t) > 16 else ""))


def ticket_from_path(path: list[str] | tuple[str, ...]) -> Ticket:
    """Routes a Flight descriptor PATH to a typed ticket (docs/flows.md#tickets-and-discovery)."""
    if not path:
        raise TicketError("descriptor path is empty")
    head = path[0]
    if head == "scope":
        if len(path) != 2 or not path[1]:
            raise TicketError(f"scope descriptor must be ['scope', <name>], got {_brief(list(path))}")
        return ScopeTicket(_name(path[1], "scope descriptor name"))
    if head == "export":
        if len(path) != 2:
            raise TicketError(f"export descriptor must be ['export', <id>], got {_brief(list(path))}")
        try:
            export_id = int(path[1])
        except ValueError:
            raise TicketError(f"export descriptor id must be a decimal integer, got {_brief(path[1])}") from None
        if export_id == 0 or not -(2**31) <= export_id < 2**31:
            raise TicketError(f"export id {export_id} is invalid", "INVALID_ARGUMENT")
        return ExportTicket(export_id)
    if head == "app":
        if len(path) != 4 or path[2] != "field":
            raise TicketError("application descriptor must be ['app', <app>, 'field', <field>], "
                              f"got {_brief(list(path))}")
        return AppTicket(_name(path[1], "application id"), _name(path[3], "field name"))
    if head == "shared":
        if len(path) != 2:
            raise TicketError(f"shared descriptor must be ['shared', <hex id>], got {_brief(list(path))}")
        try:
            return SharedTicket(bytes.fromhex(path[1]))
        except ValueError:
            raise TicketError(f"shared descriptor id must be hex, got {_brief(path[1])}") from None
    raise TicketError(f"no resolver for descriptor path starting with {_brief(head)}")
