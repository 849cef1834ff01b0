"""The server's tuning knobs in one place, passed from `TickwireServer` down to the services and
publishing. Every field has a default that works without configuration."""
from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ServerConfig", "EncodeLimits", "DEFAULT_MAX_INBOUND_MESSAGE_SIZE"]

#: Deephaven's default limit on one inbound gRPC message (a DoPut batch, a Barrage request)
DEFAULT_MAX_INBOUND_MESSAGE_SIZE = 100 * 1024 * 1024


@dataclass(frozen=True)
class EncodeLimits:
    """How messages are cut into FlightData.

    A message of more than `chunk_rows` added rows is encoded chunk by chunk, each about
    `chunk_bytes` (one record batch unless the client's batch_size / max_message_size cut it
    further), while the previous one is written. Smaller messages are encoded whole, once, and
    shared by every subscriber that gets them, in record batches of about `shared_batch_bytes`, so a
    subscriber that stops reading holds one small piece of a shared message in its transport."""

    chunk_rows: int = 1 << 17
    chunk_bytes: int = 1 << 20
    shared_batch_bytes: int = 1 << 17

    def __post_init__(self):
        for f in fields(self):
            if getattr(self, f.name) <= 0:
                raise ValueError(f"{f.name} must be positive, got {getattr(self, f.name)}")


@dataclass(frozen=True)
class ServerConfig:
    """Tuning of one server.

    - `workers`: threads of the pool that runs blocking work (the graph's lock, encoding, decoding).
    - `session_duration_ms`: a session without calls for this long expires (Deephaven's
      `http.session.durationMs`).
    - `max_inbound_message_size`: the largest gRPC message a client may send.
    - `outbox`: messages queued for one subscriber's writer; past it, changes are coalesced.
    - `inline_cells`: messages of up to this many values are encoded on the event loop (cheaper
      than a trip to the pool); larger ones in the pool, `payloads_per_hop` FlightData per trip.
    - `inline_request_bytes`: Barrage requests larger than this are decoded in the pool.
    - `max_viewport_ranges`: distinct position ranges one viewport may name.
    - `piece_target_ms`, `min_piece_cells`, `max_piece_cells`: large initial snapshots of ticking
      tables are read in pieces sized to about `piece_target_ms` of reading under the graph's lock.
    - `shared_snapshots`: initial snapshots a published table keeps for later subscribers that ask
      for the same columns (the oldest is let go past it).
    - `encode`: how messages are cut into FlightData (`EncodeLimits`).
    - `list_fields_poll_s`: how often the open ApplicationService.ListFields streams (one watcher
      for all) look for new or removed tables, and an open TableService.ExportedTableUpdates
      stream reads its session's export sizes.
    - `staging_producer_bytes`, `staging_total_bytes`, `staging_ttl_s`, `staging_wait_s`: the
      staging area of exactly-once writes from other processes (tickwire.server.engine.staging): bytes one
      producer and all producers may have staged, how long an uncommitted batch's parts live after
      their last write, and how long an upload waits for room before RESOURCE_EXHAUSTED."""

    workers: int = 4
    session_duration_ms: int = 300_000
    max_inbound_message_size: int = DEFAULT_MAX_INBOUND_MESSAGE_SIZE
    outbox: int = 2
    inline_cells: int = 16_384
    payloads_per_hop: int = 2
    inline_request_bytes: int = 4_096
    max_viewport_ranges: int = 1 << 20
    piece_target_ms: float = 3.0
    min_piece_cells: int = 65_536
    max_piece_cells: int = 1 << 24
    shared_snapshots: int = 4
    encode: EncodeLimits = EncodeLimits()
    list_fields_poll_s: float = 1.0
    staging_producer_bytes: int = 256 << 20
    staging_total_bytes: int = 1 << 30
    staging_ttl_s: float = 600.0
    staging_wait_s: float = 60.0

    def __post_init__(self):
        for name in ("staging_producer_bytes", "staging_total_bytes", "staging_ttl_s", "staging_wait_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("workers", "session_duration_ms", "outbox", "payloads_per_hop", "max_viewport_ranges",
                     "min_piece_cells", "max_piece_cells", "shared_snapshots"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("inline_cells", "inline_request_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be zero or more, got {getattr(self, name)}")
        if not 0 < self.max_inbound_message_size <= 2**31 - 1:
            raise ValueError(f"max_inbound_message_size must be 1..{2**31 - 1} bytes, got "
                             f"{self.max_inbound_message_size}")
        if self.piece_target_ms <= 0 or self.list_fields_poll_s <= 0:
            raise ValueError("piece_target_ms and list_fields_poll_s must be positive")
        if self.min_piece_cells > self.max_piece_cells:
            raise ValueError("min_piece_cells must not exceed max_piece_cells")
