"""The one exception type the protocol layer raises for bad input."""

from tickwire.errors import TickwireError


class ProtocolError(TickwireError, ValueError):
    """Malformed or unsupported wire data.

    Every decoder in `tickwire.protocol` raises this (and only this) for input it cannot accept:
    truncated row sets, bad command bytes, a wrong Barrage magic, flatbuffers whose offsets point
    outside the buffer, Arrow messages that do not match their schema. The message says what was
    wrong and where, so a server can pass it on as an INVALID_ARGUMENT status.
    """
