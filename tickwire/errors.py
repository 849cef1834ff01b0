"""The one root of tickwire's errors.

Every error tickwire raises on purpose is a `TickwireError` whose `code` names the gRPC status a
server answers it with ("INVALID_ARGUMENT", "NOT_FOUND", ...). The gRPC boundary maps it to a
status in one place; anything else that escapes a handler is a defect of the server (INTERNAL,
logged with a reference id).
"""
from __future__ import annotations

from typing import Optional

__all__ = ["TickwireError", "ProtocolError", "CODES"]

#: the gRPC status names an error may carry
CODES = frozenset({
    "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
    "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
    "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
})


class TickwireError(Exception):
    """An error with the gRPC status it is answered with. Subclasses set a default `code`; an
    instance may carry another (`TickwireError(message, "NOT_FOUND")`)."""

    code: str = "INVALID_ARGUMENT"

    def __init__(self, message: str = "", code: Optional[str] = None):
        super().__init__(message)
        if code is not None:
            if code not in CODES:
                raise ValueError(f"unknown status code {code!r}")
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ProtocolError(TickwireError, ValueError):
    """Malformed or unsupported wire data.

    Every decoder in `tickwire.protocol` raises this (and only this) for input it cannot accept:
    truncated row sets, bad command bytes, a wrong Barrage magic, flatbuffers whose offsets point
    outside the buffer, Arrow messages that do not match their schema. The message says what was
    wrong and where, so a server can pass it on as an INVALID_ARGUMENT status (or the status a
    subclass carries)."""
