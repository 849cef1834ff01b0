"""The names `tickwire` exports are the public API: this list changes only on purpose."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import tickwire

EXPORTED = ["BarrageClient", "ServerConfig", "TableSpec", "TickwireError", "TickwireServer", "UpdateGraph",
            "__version__", "engine_of", "sink"]


def test_exported_names():
    assert sorted(tickwire.__all__) == EXPORTED
    for name in EXPORTED:
        assert getattr(tickwire, name) is not None, name


def test_exported_names_are_the_implementations():
    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine.graph import UpdateGraph
    from tickwire.server.adapters.spark import sink

    assert tickwire.UpdateGraph is UpdateGraph and tickwire.TickwireServer is TickwireServer
    assert tickwire.BarrageClient is BarrageClient and tickwire.sink is sink


def test_import_tickwire_is_light_and_unknown_names_fail():
    code = ("import sys, tickwire; assert 'grpc' not in sys.modules and 'pyarrow' not in sys.modules, "
            "sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'pyarrow')); "
            "from tickwire import UpdateGraph, TickwireServer, BarrageClient; print('ok')")
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
