"""A bounds-checked flatbuffer table reader.

The flatbuffers runtime trusts its input: a bad offset raises IndexError or struct.error, or
silently reads unrelated bytes. Every access here is checked against the buffer size first and a
failure raises ProtocolError naming the table and field.
"""
from __future__ import annotations

import struct
from typing import Optional

from tickwire.errors import ProtocolError
from tickwire.protocol.flight import BytesLike

__all__ = ["FbTable", "root"]


class FbTable:
    """A flatbuffer table at `pos` in `buf`, every access checked against the buffer size."""

    __slots__ = ("buf", "pos", "vt", "vt_len", "what")

    def __init__(self, buf: bytes, pos: int, what: str):
        self.buf, self.pos, self.what = buf, pos, what
        n = len(buf)
        if pos < 0 or pos + 4 > n:
            raise ProtocolError(f"{what}: table offset {pos} outside the {n}-byte buffer")
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        if vt < 0 or vt + 4 > n:
            raise ProtocolError(f"{what}: vtable offset {vt} outside the {n}-byte buffer")
        vt_len, obj_len = struct.unpack_from("<HH", buf, vt)
        if vt_len < 4 or vt_len % 2 or vt + vt_len > n:
            raise ProtocolError(f"{what}: bad vtable (length {vt_len} at offset {vt})")
        if pos + obj_len > n:
            raise ProtocolError(f"{what}: table of {obj_len} bytes at {pos} runs past the buffer end")
        self.vt, self.vt_len = vt, vt_len

    def _field(self, slot: int, size: int, name: str) -> int:
        o = 4 + 2 * slot
        if o + 2 > self.vt_len:
            return 0
        rel: int = struct.unpack_from("<H", self.buf, self.vt + o)[0]
        if rel == 0:
            return 0
        p = self.pos + rel
        if p + size > len(self.buf):
            raise ProtocolError(f"{self.what}.{name}: field at offset {p} runs past the buffer end")
        return p

    def scalar(self, slot: int, fmt: str, default: int, name: str) -> int:
        """An integer field (`fmt` is one of struct's integer formats)."""
        p = self._field(slot, struct.calcsize(fmt), name)
        if p == 0:
            return default
        value: int = struct.unpack_from(fmt, self.buf, p)[0]
        return value

    def _indirect(self, slot: int, name: str) -> int:
        p = self._field(slot, 4, name)
        if p == 0:
            return 0
        target: int = p + struct.unpack_from("<I", self.buf, p)[0]
        if target + 4 > len(self.buf):
            raise ProtocolError(f"{self.what}.{name}: offset {target} outside the {len(self.buf)}-byte buffer")
        return target

    def vector(self, slot: int, name: str, elem: int = 1) -> Optional[tuple[int, int]]:
        """(start, count) of a vector, or None if absent."""
        p = self._indirect(slot, name)
        if p == 0:
            return None
        count = struct.unpack_from("<I", self.buf, p)[0]
        if p + 4 + count * elem > len(self.buf):
            raise ProtocolError(f"{self.what}.{name}: vector of {count} elements at {p} runs past the buffer end")
        return p + 4, count

    def bytes_field(self, slot: int, name: str) -> Optional[bytes]:
        v = self.vector(slot, name)
        return None if v is None else bytes(self.buf[v[0]:v[0] + v[1]])

    def table(self, slot: int, name: str) -> Optional["FbTable"]:
        p = self._indirect(slot, name)
        return None if p == 0 else FbTable(self.buf, p, f"{self.what}.{name}")

    def tables(self, slot: int, name: str) -> Optional[list["FbTable"]]:
        v = self.vector(slot, name, 4)
        if v is None:
            return None
        start, count = v
        out = []
        for i in range(count):
            at = start + 4 * i
            out.append(FbTable(self.buf, at + struct.unpack_from("<I", self.buf, at)[0], f"{self.what}.{name}[{i}]"))
        return out


def root(data: BytesLike, what: str) -> FbTable:
    buf = bytes(data)
    if len(buf) < 8:
        raise ProtocolError(f"{what}: {len(buf)} bytes is too short for a flatbuffer")
    return FbTable(buf, struct.unpack_from("<I", buf, 0)[0], what)
