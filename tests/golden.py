"""Access to the golden captures recorded from a real Deephaven 42.7 server (../shared/golden).

`.cap` format: repeated records `dir:1 byte ('C' client->server | 'S' server->client)`,
`t_us:uint64 LE`, `len:uint32 LE`, `payload` (one serialized protobuf message).
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

GOLDEN = Path(os.environ.get("TICKWIRE_GOLDEN", Path(__file__).resolve().parents[1].parent / "shared" / "golden"))


@dataclass(frozen=True)
class Record:
    direction: str  # "C" (client to server) or "S" (server to client)
    t_us: int
    payload: bytes


def golden_dirs() -> list[Path]:
    if not GOLDEN.exists():
        return []
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir() and (p / "decoded.txt").exists())


def read_cap(path: Path) -> list[Record]:
    data = path.read_bytes()
    out: list[Record] = []
    pos = 0
    while pos < len(data):
        direction = chr(data[pos])
        t_us, length = struct.unpack_from("<QI", data, pos + 1)
        start = pos + 13
        out.append(Record(direction, t_us, data[start:start + length]))
        pos = start + length
    if pos != len(data):
        raise ValueError(f"{path}: trailing bytes")
    return out


def captures(method_suffix: str) -> list[Path]:
    """All capture files whose name ends with `_<method_suffix>.cap`, e.g. 'FlightService_DoExchange'."""
    return sorted(p for d in golden_dirs() for p in d.glob(f"*_{method_suffix}.cap"))
