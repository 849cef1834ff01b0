"""tickwire.protocol: sans-I/O Barrage and Arrow Flight wire code.

Bytes in, objects out, and back. Nothing in this package opens sockets, starts threads or
imports gRPC; the server (`tickwire.server`) and the client (`tickwire.clients`) both build on it.
"""
from tickwire.errors import ProtocolError

__all__ = ["ProtocolError"]
