"""Layers import downward only: protocol <- engine <- transports and adapters; clients use the
protocol, never the server. Read from the source (every `import` and `from ... import` of
tickwire modules), so a new module cannot break the rule unnoticed."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"protocol": "tickwire.protocol", "server": "tickwire.server", "clients": "tickwire.clients",
           "tickwire": "tickwire"}

# the engine: update graph, catalog, ingest, staging, storage and publishing
ENGINE = ("tickwire.server.engine", "tickwire.server.config")
# what sits on the engine: gRPC services, the web side, sessions, adapters (Spark, replication), the app
ABOVE_ENGINE = ("tickwire.server.services", "tickwire.server.web", "tickwire.server.app", "tickwire.server.adapters",
                "tickwire.server.observability")


def _modules() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for folder, package in FOLDERS.items():
        for f in (ROOT / folder).rglob("*.py"):
            rel = f.relative_to(ROOT / folder).with_suffix("")
            if f.name.endswith("_pb2.py") or f.name.endswith("_pb2_grpc.py") or "fb" in rel.parts:
                continue  # generated code
            name = ".".join((package, *rel.parts))
            deps = out.setdefault(name, set())
            for node in ast.walk(ast.parse(f.read_text(), str(f))):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    deps.add(node.module)
                elif isinstance(node, ast.Import):
                    deps.update(a.name for a in node.names)
    return out


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_rule_is_read_from_real_modules():
    mods = _modules()
    assert "tickwire.server.engine.staging" in mods and "tickwire.protocol.txn" in mods
    assert "tickwire.server.engine.ingest" in mods["tickwire.server.engine.staging"]  # the reader sees imports


def test_protocol_imports_neither_the_server_nor_the_clients():
    bad = {m: sorted(d for d in deps if _under(d, ("tickwire.server", "tickwire.clients")))
           for m, deps in _modules().items() if _under(m, ("tickwire.protocol",))}
    assert not {m: d for m, d in bad.items() if d}


def test_clients_do_not_import_the_server():
    bad = {m: sorted(d for d in deps if _under(d, ("tickwire.server",)))
           for m, deps in _modules().items() if _under(m, ("tickwire.clients",))}
    assert not {m: d for m, d in bad.items() if d}


def test_the_engine_imports_nothing_above_it():
    bad = {m: sorted(d for d in deps if _under(d, ABOVE_ENGINE))
           for m, deps in _modules().items() if _under(m, ENGINE)}
    assert not {m: d for m, d in bad.items() if d}
