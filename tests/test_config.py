"""ServerConfig: one frozen set of tuning knobs, validated, passed from TickwireServer down."""
from __future__ import annotations

import dataclasses
import threading

import pytest

from tickwire.server.app import TickwireServer
from tickwire.server.config import EncodeLimits, ServerConfig
from tickwire.server.engine import Engine


def test_defaults_and_validation():
    c = ServerConfig()
    assert c.max_inbound_message_size == 100 * 1024 * 1024 and c.outbox == 2 and c.encode == EncodeLimits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.outbox = 3
    for bad in ({"workers": 0}, {"outbox": 0}, {"max_inbound_message_size": 0}, {"max_inbound_message_size": 2**31},
                {"piece_target_ms": 0}, {"inline_cells": -1}, {"min_piece_cells": 10, "max_piece_cells": 5}):
        with pytest.raises(ValueError):
            ServerConfig(**bad)
    with pytest.raises(ValueError):
        EncodeLimits(chunk_bytes=0)


def test_the_server_passes_its_config_down():
    cfg = ServerConfig(outbox=1, min_piece_cells=100, max_piece_cells=200, inline_cells=0,
                       encode=EncodeLimits(shared_batch_bytes=4096), list_fields_poll_s=0.25)
    srv = TickwireServer(Engine(interval_ms=1000), port=0, config=cfg, session_duration_ms=5000)
    assert srv.config == dataclasses.replace(cfg, port=0, session_duration_ms=5000)  # keyword arguments override
    assert srv.ctx.config is srv.config
    assert srv.registry.outbox == 1 and srv.registry.limits.shared_batch_bytes == 4096
    assert srv.registry.min_piece_cells == 100 and srv.registry.max_piece_cells == 200
    app = next(s for s in srv.services if type(s).__name__ == "ApplicationService")
    assert srv.sessions.duration_ms == 5000 and app.watch.interval == 0.25
    # the pool runs `workers` threads: as many tasks that wait each hold one, and one more waits for a thread
    release = threading.Event()
    before = set(threading.enumerate())
    futures = [srv.executor.submit(release.wait) for _ in range(cfg.workers + 1)]
    try:
        started = [t for t in threading.enumerate() if t not in before and t.name.startswith("tickwire-work")]
        assert len(started) == cfg.workers
    finally:
        release.set()
    assert all(f.result() for f in futures)
