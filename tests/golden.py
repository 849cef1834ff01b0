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


def _capture_dirs() -> list[Path]:
    if not GOLDEN.exists():
        return []
    return sorted(p for p in GOLDEN.iterdir() if p.is_dir() and (p / "decoded.txt").exists())


def golden_dirs() -> list[Path]:
    """Captures of clients speaking gRPC to the server (Flight and Deephaven's services). The
    browsers' captures (`browser_*`) travel over Deephaven's multiplexed websocket transport and
    call services of the web side; they are read by `browser_golden_dirs`."""
    return [p for p in _capture_dirs() if not p.name.startswith("browser_")]


def browser_golden_dirs() -> list[Path]:
    """Captures of Deephaven's JavaScript API and web UI in a browser."""
    return [p for p in _capture_dirs() if p.name.startswith("browser_")]


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


def flight_streams():
    """Every DoGet/DoExchange capture as (path, client options, server payloads).

    Client options come from the first Barrage request of a DoExchange (None for DoGet, whose
    client record is a Ticket)."""
    from tickwire.protocol.barrage import unwrap
    from tickwire.protocol.flight import decode_flight_data

    out = []
    for p in captures("FlightService_DoExchange") + captures("FlightService_DoGet"):
        options = None
        client_md = []
        server = []
        for r in read_cap(p):
            if r.direction == "S":
                server.append(r)
            elif "DoExchange" in p.name:
                fd = decode_flight_data(r.payload)
                if fd.app_metadata is not None:
                    client_md.append(fd.app_metadata)
                    if options is None:
                        options = unwrap(fd.app_metadata)[1].options
        out.append((p, options, client_md, server))
    return out


def decoded_sections(folder: Path) -> dict[int, str]:
    """decoded.txt split by call: {call number: text of that call's section}."""
    import re

    text = (folder / "decoded.txt").read_text()
    parts = re.split(r"^=== \[(\d+)\] ", text, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def decoded_records(section: str) -> dict[int, str]:
    """A call's section split by record: {record number (1-based, both directions): text}."""
    import re

    parts = re.split(r"^  (?:C->S|S->C) #(\d+) ", section, flags=re.M)
    return {int(parts[i]): parts[i + 1] for i in range(1, len(parts) - 1, 2)}
