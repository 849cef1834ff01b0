"""tickwire: a Barrage-compatible Apache Arrow Flight server for live tables.

The public names load on first use, so `import tickwire` stays light:

    from tickwire import UpdateGraph, TickwireServer, BarrageClient
"""

__version__ = "0.1.0"

_EXPORTS = {
    "UpdateGraph": ("tickwire.server.engine.graph", "UpdateGraph"),
    "TickwireServer": ("tickwire.server.app", "TickwireServer"),
    "ServerConfig": ("tickwire.server.config", "ServerConfig"),
    "TableSpec": ("tickwire.server.engine", "TableSpec"),
    "engine_of": ("tickwire.server.engine", "engine_of"),
    "BarrageClient": ("tickwire.clients.client", "BarrageClient"),
    "sink": ("tickwire.server.adapters.spark", "sink"),
    "TickwireError": ("tickwire.errors", "TickwireError"),
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
