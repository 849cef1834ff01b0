"""tickwire: a Barrage-compatible Apache Arrow Flight server for live tables.

The public names load on first use, so `import tickwire` stays light:

    from tickwire import Engine, TableSpec, TickwireServer, BarrageClient
"""

__version__ = "0.1.0"

_EXPORTS = {
    "Engine": ("tickwire.server.engine", "Engine"),
    "EngineConfig": ("tickwire.server.engine", "EngineConfig"),
    "TableSpec": ("tickwire.server.engine", "TableSpec"),
    "Destination": ("tickwire.server.engine", "Destination"),
    "Agg": ("tickwire.server.engine", "Agg"),
    "TickwireServer": ("tickwire.server.app", "TickwireServer"),
    "ServerConfig": ("tickwire.server.config", "ServerConfig"),
    "BarrageClient": ("tickwire.clients.client", "BarrageClient"),
    "sink": ("tickwire.server.adapters.spark", "sink"),
    "TickwireError": ("tickwire.errors", "TickwireError"),
    "ManualClock": ("tickwire.clock", "ManualClock"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    target = _EXPORTS.get(name)
    if target is None:
        raise AttributeError(f"module 'tickwire' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(target[0]), target[1])
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
