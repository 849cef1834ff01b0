"""The engine's settings: what an `Engine` is built from (`EngineConfig`) and what publishing to
subscribers is tuned with (`PublishingConfig`). Every field has a default that works without
configuration; each object checks its fields when made. `tickwire.server.config.ServerConfig`
holds an EngineConfig (`engine`) and the publishing fields of the server built on it."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Iterable, Optional

__all__ = ["EngineConfig", "Durability", "StagingLimits", "PerfTablesConfig", "PublishingConfig", "EncodeLimits"]

MiB = 1 << 20


def _positive(obj: object, names: Iterable[str]) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise ValueError(f"{name} must be positive, got {value}")


@dataclass(frozen=True)
class Durability:
    """`fsync`: "cycle" (each cycle's records are synced before the cycle's writers are
    acknowledged), "interval" (every `fsync_interval_ms`), "off" (the OS writes when it likes). A
    checkpoint is taken after `checkpoint_cycles` journaled cycles or `checkpoint_bytes` of journal,
    whichever comes first. `namespace` and `source` name the folders of the data directory."""

    fsync: str = "cycle"
    fsync_interval_ms: int = 1000
    checkpoint_cycles: int = 10_000
    checkpoint_bytes: int = 256 * MiB
    namespace: str = "default"
    source: str = "tickwire"

    def __post_init__(self) -> None:
        if self.fsync not in ("cycle", "interval", "off"):
            raise ValueError(f"fsync must be cycle, interval or off, not {self.fsync!r}")
        _positive(self, ("fsync_interval_ms", "checkpoint_cycles", "checkpoint_bytes"))


@dataclass(frozen=True)
class StagingLimits:
    """The staging area of exactly-once writes from other processes (tickwire.server.engine.staging):
    bytes one producer (`producer_bytes`) and all producers (`total_bytes`) may have staged, parts
    one producer (`max_parts`) and all (`max_parts_total`) may have, how long an uncommitted
    batch's parts live after their last write (`ttl_s`) and how long an upload waits for room
    before RESOURCE_EXHAUSTED (`wait_s`)."""

    producer_bytes: int = 256 * MiB
    total_bytes: int = 1024 * MiB
    ttl_s: float = 600.0
    wait_s: float = 60.0
    max_parts: int = 10_000
    max_parts_total: int = 100_000

    def __post_init__(self) -> None:
        _positive(self, [f.name for f in fields(self)])


@dataclass(frozen=True)
class PerfTablesConfig:
    """The performance tables (tickwire.server.engine.perf_tables): `capacity` rows each keeps (the
    oldest go first); `barrage_interval_s`: how often each subscription's figures are recorded;
    `flush_interval_s`: how often the rows recorded per cycle and per snapshot are written (one
    write a table per interval, not per cycle: at a 10 ms cycle a write a cycle cost the server more
    than the cycle of a small table it describes)."""

    capacity: int = 10_000
    barrage_interval_s: float = 1.0
    flush_interval_s: float = 0.25

    def __post_init__(self) -> None:
        _positive(self, ("capacity", "barrage_interval_s", "flush_interval_s"))


@dataclass(frozen=True)
class EngineConfig:
    """What an Engine is built from.

    - `interval_ms`: the update graph's cycle interval.
    - `data_dir`: makes append, keyed and ring tables durable there (tickwire.server.engine.storage);
      `durability` sets the fsync policy and the checkpoint interval. None: in memory only.
    - `staging`: the bounds of staged exactly-once writes (`StagingLimits`).
    - `perf_tables`: the performance tables' settings, or None for none.
    - `max_errors`: cycle errors remembered (`Engine.errors`).
    - `cycle_on_write`: a write starts the next cycle at once instead of waiting for its time
      (a fan-out worker's replicas: each upstream update reaches its subscribers as it comes;
      without writes, cycles still run every `interval_ms`)."""

    interval_ms: float = 100.0
    cycle_on_write: bool = False
    data_dir: Optional[Path] = None
    durability: Durability = field(default_factory=Durability)
    staging: StagingLimits = field(default_factory=StagingLimits)
    perf_tables: Optional[PerfTablesConfig] = field(default_factory=PerfTablesConfig)
    max_errors: int = 1000

    def __post_init__(self) -> None:
        if self.data_dir is not None and not isinstance(self.data_dir, Path):
            object.__setattr__(self, "data_dir", Path(self.data_dir))
        _positive(self, ("interval_ms", "max_errors"))


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

    def __post_init__(self) -> None:
        _positive(self, [f.name for f in fields(self)])


@dataclass(frozen=True)
class PublishingConfig:
    """How one server publishes tables to its subscribers (tickwire.server.engine.publishing).

    - `outbox`: messages queued for one subscriber's writer; past it, changes are coalesced.
    - `max_viewport_ranges`: distinct position ranges one viewport may name.
    - `piece_target_ms`, `min_piece_cells`, `max_piece_cells`: large initial snapshots of ticking
      tables are read in pieces sized to about `piece_target_ms` of reading under the graph's lock.
    - `shared_snapshots`: initial snapshots a published table keeps for later subscribers that ask
      for the same columns (the oldest is let go past it).
    - `encode`: how messages are cut into FlightData (`EncodeLimits`)."""

    outbox: int = 2
    max_viewport_ranges: int = 1 << 20
    piece_target_ms: float = 3.0
    min_piece_cells: int = 65_536
    max_piece_cells: int = 1 << 24
    shared_snapshots: int = 4
    encode: EncodeLimits = field(default_factory=EncodeLimits)

    def __post_init__(self) -> None:
        _positive(self, ("outbox", "max_viewport_ranges", "piece_target_ms", "min_piece_cells", "max_piece_cells",
                         "shared_snapshots"))
        if self.min_piece_cells > self.max_piece_cells:
            raise ValueError("min_piece_cells must not exceed max_piece_cells")
