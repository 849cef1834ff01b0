"""The names `tickwire` exports are the public API: this list changes only on purpose."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tickwire

EXPORTED = ["Agg", "BarrageClient", "Destination", "Engine", "EngineConfig", "ManualClock", "ServerConfig", "TableSpec",
            "TickwireError", "TickwireServer", "__version__", "sink"]


def test_exported_names():
    assert sorted(tickwire.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(tickwire, name) is not None, name


def test_exported_names_are_the_implementations():
    from tickwire.clients.client import BarrageClient
    from tickwire.clock import ManualClock
    from tickwire.errors import TickwireError
    from tickwire.server.adapters.spark import sink
    from tickwire.server.app import TickwireServer
    from tickwire.server.config import ServerConfig
    from tickwire.server.engine import Destination, Engine, EngineConfig, TableSpec

    assert tickwire.Engine is Engine and tickwire.TickwireServer is TickwireServer
    assert tickwire.BarrageClient is BarrageClient and tickwire.sink is sink
    assert tickwire.EngineConfig is EngineConfig and tickwire.ServerConfig is ServerConfig
    assert tickwire.TableSpec is TableSpec and tickwire.Destination is Destination
    assert tickwire.ManualClock is ManualClock and tickwire.TickwireError is TickwireError


def test_the_update_graph_is_not_public():
    """The update graph is the engine's own (MIGRATION: `UpdateGraph` is engine-internal): the
    package exports neither it nor the per-graph lookup that reached the engine from it."""
    for name in ("UpdateGraph", "engine_of"):
        assert not hasattr(tickwire, name), name


def test_import_tickwire_is_light_and_unknown_names_fail():
    code = ("import sys, tickwire; assert 'grpc' not in sys.modules and 'pyarrow' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'pyarrow')); "
            "from tickwire import Engine, TableSpec, TickwireServer, BarrageClient; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr
    try:
        tickwire.NoSuchThing  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("an unknown name must raise AttributeError")


def test_the_package_is_marked_typed():
    assert (Path(tickwire.__file__).parent / "py.typed").exists()
