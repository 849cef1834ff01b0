"""Every option of a tickwire server in one frozen object, `ServerConfig`.

The command line, the `TICKWIRE_*` environment and a TOML file build one
(`tickwire.options.server_config`); Python builds one directly. `TickwireServer(engine, config)`
takes it whole, or its fields as keywords (`TickwireServer(engine, port=0, psk="k")`); the
engine's own options (cycle interval, data directory, staging, performance tables) are its
`engine` field, an `EngineConfig`, from which `Engine(config.engine)` is built. Every field has a
default that works without configuration, and is checked when the object is made."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from tickwire.server.engine.config import EncodeLimits, EngineConfig, PublishingConfig

__all__ = ["ServerConfig", "merge_time", "seconds_until", "EncodeLimits", "EngineConfig", "PublishingConfig",
           "DEFAULT_MAX_INBOUND_MESSAGE_SIZE"]

#: Deephaven's default limit on one inbound gRPC message (a DoPut batch, a Barrage request)
DEFAULT_MAX_INBOUND_MESSAGE_SIZE = 100 * 1024 * 1024


def merge_time(text: str) -> tuple[int, int]:
    """(hour, minute) of a daily merge time "HH:MM" (UTC); ValueError otherwise."""
    hh, sep, mm = text.strip().partition(":")
    if sep and hh.isdigit() and mm.isdigit() and len(mm) == 2 and 0 <= int(hh) <= 23 and 0 <= int(mm) <= 59:
        return int(hh), int(mm)
    raise ValueError(f"merge_at {text!r}: use HH:MM (UTC), for example 18:30")


def seconds_until(now_s: float, hour: int, minute: int) -> float:
    """Seconds from `now_s` (Unix time) to the next HH:MM UTC strictly after it."""
    day = 86_400.0
    at = hour * 3600 + minute * 60
    delta = (at - now_s % day) % day
    return delta if delta > 0 else day


@dataclass(frozen=True)
class ServerConfig:
    """One server's options.

    Where it listens and who may call:
    - `host`, `port` (0 picks a free one); `psk`: require Deephaven's pre-shared-key
      authentication (else anonymous access); `tls_cert`/`tls_key`: PEM files that switch the port
      to TLS.
    - `web`: serve browsers (Deephaven's JS API and grid page) on the same port, or on `web_port`
      (needed with TLS; 0 picks a free one); `web_assets`: a deephaven-web jar or directory to serve
      instead of the installed deephaven-server package's.
    - `metrics_port`: serve /metrics and /healthz on a port of their own (0 picks a free one).
    - `show_system_tables`: list the performance tables with the others.
    - `history`: (NAME, URI) pairs: Hive-partitioned Parquet datasets served as history-plus-live
      tables (Engine.history) once the data directory is open; `history_refresh_s`: how often their
      datasets are looked at for new files (Engine.refresh_history; None: only at start);
      `merge_at`: "HH:MM" (UTC) at which, each day, every history table merges its intraday dates
      before the day's (Engine.merge_before; None: merges only when asked);
    - `replicate`: tables of other Barrage servers to follow as local tables ("HOST:PORT/TABLE", or
      "HOST:PORT/TABLE=LOCAL" to serve one under another name),
      with `upstream_psk` and `upstream_tls`.

    - `worker_of`: the target of an engine process this server is a fan-out worker of
      (tickwire.server.worker): it serves scope-table subscriptions from replicas and forwards
      every other call there; `reuse_port`: share the port with other processes (SO_REUSEPORT),
      as an engine process's workers do; `forward_key`: a key an engine process and its workers
      share, under which a worker names each forwarded call's client (FORWARDED_FOR) and the
      engine process believes it (None: a worker names nobody, an engine process believes nobody).

    How it serves:
    - `workers`: threads of the pool that runs blocking work (reading tables, encoding, decoding).
    - `session_duration_ms`: a session without calls for this long expires (Deephaven's
      `http.session.durationMs`).
    - `max_inbound_message_size`: the largest gRPC message a client may send.
    - `inline_cells`: messages of up to this many values are encoded on the event loop (cheaper
      than a trip to the pool); larger ones in the pool, `payloads_per_hop` FlightData per trip.
    - `inline_request_bytes`: Barrage requests larger than this are decoded in the pool.
    - `list_fields_poll_s`: how often the open ApplicationService.ListFields streams (one watcher
      for all) look for new or removed tables, and an open TableService.ExportedTableUpdates
      stream reads its session's export sizes.
    - `export_wait_s`: how long a call naming an export of its session that is not made yet (a
      client pipelines: it names the result of a call still running, or not yet started) waits
      for a call to make it before it answers NOT_FOUND. Deephaven waits without bound.
    - publishing (`publishing` gathers them): `outbox`, `max_viewport_ranges`, `piece_target_ms`,
      `min_piece_cells`, `max_piece_cells`, `shared_snapshots`, `encode` (see PublishingConfig).

    `engine`: the options of the engine a server builds for itself when it is given none."""

    host: str = "127.0.0.1"
    port: int = 10000
    psk: Optional[str] = None
    tls_cert: Optional[Path] = None
    tls_key: Optional[Path] = None
    web: bool = True
    web_port: Optional[int] = None
    web_assets: Optional[Path] = None
    metrics_port: Optional[int] = None
    show_system_tables: bool = False
    replicate: tuple[str, ...] = ()
    history: tuple[tuple[str, str], ...] = ()
    history_refresh_s: Optional[float] = None
    merge_at: Optional[str] = None
    upstream_psk: Optional[str] = None
    upstream_tls: bool = False
    workers: int = 4
    worker_of: Optional[str] = None
    reuse_port: bool = False
    forward_key: Optional[str] = None
    session_duration_ms: int = 300_000
    max_inbound_message_size: int = DEFAULT_MAX_INBOUND_MESSAGE_SIZE
    inline_cells: int = 16_384
    payloads_per_hop: int = 2
    inline_request_bytes: int = 4_096
    list_fields_poll_s: float = 1.0
    export_wait_s: float = 30.0
    doget_piece_rows: int = 1 << 18
    doget_cache_bytes: int = 256 << 20
    # the publishing options, with PublishingConfig's defaults (`publishing` below builds it)
    outbox: int = PublishingConfig.outbox
    max_viewport_ranges: int = PublishingConfig.max_viewport_ranges
    piece_target_ms: float = PublishingConfig.piece_target_ms
    min_piece_cells: int = PublishingConfig.min_piece_cells
    max_piece_cells: int = PublishingConfig.max_piece_cells
    shared_snapshots: int = PublishingConfig.shared_snapshots
    encode: EncodeLimits = field(default_factory=EncodeLimits)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        for name in ("tls_cert", "tls_key", "web_assets"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        object.__setattr__(self, "history", tuple((str(n), str(u)) for n, u in self.history))
        if isinstance(self.replicate, str):
            object.__setattr__(self, "replicate", tuple(p.strip() for p in self.replicate.split(",") if p.strip()))
        else:
            object.__setattr__(self, "replicate", tuple(self.replicate))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        for name in ("port", "web_port", "metrics_port"):
            value = getattr(self, name)
            if value is not None and not 0 <= int(value) <= 65535:
                raise ValueError(f"{name} must be 0-65535, got {value}")
        if self.history_refresh_s is not None and not self.history_refresh_s > 0:
            raise ValueError(f"history_refresh_s must be positive, got {self.history_refresh_s}")
        if self.merge_at is not None:
            merge_time(self.merge_at)  # ValueError names a malformed one
        for name in ("workers", "session_duration_ms", "payloads_per_hop", "list_fields_poll_s", "export_wait_s",
                     "doget_piece_rows"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("inline_cells", "inline_request_bytes", "doget_cache_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be zero or more, got {getattr(self, name)}")
        if not 0 < self.max_inbound_message_size <= 2**31 - 1:
            raise ValueError(f"max_inbound_message_size must be 1..{2**31 - 1} bytes, got "
                             f"{self.max_inbound_message_size}")
        self.publishing  # checks the publishing fields  # noqa: B018

    @property
    def publishing(self) -> PublishingConfig:
        """The publishing fields as the engine's publishers take them."""
        return PublishingConfig(outbox=self.outbox, max_viewport_ranges=self.max_viewport_ranges,
                                piece_target_ms=self.piece_target_ms, min_piece_cells=self.min_piece_cells,
                                max_piece_cells=self.max_piece_cells, shared_snapshots=self.shared_snapshots,
                                encode=self.encode)
