"""Layers import downward only, nothing imports in a circle, and the update graph stays the engine's.

Layers, lowest first: the shared roots (`tickwire.errors`, `tickwire.clock`) <- the protocol
(`tickwire.protocol`) <- the clients (`tickwire.clients`) and the engine (`tickwire.server.engine`)
<- the server's configuration (`tickwire.server.config`) <- the transports (`tickwire.server.services`,
`tickwire.server.web`, `tickwire.server.observability`) and the adapters (`tickwire.server.adapters`)
<- the server (`tickwire.server.app`) <- the command line (`tickwire.cli`, `tickwire.options`,
`tickwire.demo`, `tickwire.logs`).

Read from the source (every `import` and `from ... import` of tickwire modules, those inside
functions included; imports only for the type checker, under `if TYPE_CHECKING:`, are not run and
are left out), so a new module cannot break the rules unnoticed."""
from __future__ import annotations

import ast
import contextlib
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"protocol": "tickwire.protocol", "server": "tickwire.server", "clients": "tickwire.clients",
           "tickwire": "tickwire"}

BASE = ("tickwire.errors", "tickwire.clock")
PROTOCOL = ("tickwire.protocol",)
CLIENTS = ("tickwire.clients",)
ENGINE = ("tickwire.server.engine",)
SERVER_CONFIG = ("tickwire.server.config",)
TRANSPORTS = ("tickwire.server.services", "tickwire.server.web", "tickwire.server.observability")
ADAPTERS = ("tickwire.server.adapters",)
APP = ("tickwire.server.app",)
TOP = ("tickwire.cli", "tickwire.options", "tickwire.demo", "tickwire.logs", "tickwire.__main__")

#: attributes only the engine may name: the update graph, its lock and intake, and the source
#: tables' queues (producers write with Engine.write)
ENGINE_PRIVATE = {"graph", "intake_lock", "_intake_lock", "exclusive", "add_table", "queue_rows", "queue_ops",
                  "queue_delete", "queue_update"}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterable[ast.AST]:
    """Every import node that runs (all but those under `if TYPE_CHECKING:`)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        todo.extend(ast.iter_child_nodes(node))


class Source:
    """The tickwire modules of the repository: their names, files, syntax trees and imports."""

    def __init__(self):
        self.files: dict[str, Path] = {}
        self.trees: dict[str, ast.AST] = {}
        for folder, package in FOLDERS.items():
            for f in (ROOT / folder).rglob("*.py"):
                rel = f.relative_to(ROOT / folder).with_suffix("")
                if f.name.endswith("_pb2.py") or f.name.endswith("_pb2_grpc.py") or "fb" in rel.parts:
                    continue  # generated code
                parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
                name = ".".join((package, *parts))
                self.files[name] = f
                self.trees[name] = ast.parse(f.read_text(), str(f))
        self.deps: dict[str, set[str]] = {}
        for name, tree in self.trees.items():
            deps = self.deps.setdefault(name, set())
            for node in _imports(tree):
                if isinstance(node, ast.ImportFrom):
                    if node.level or not node.module or not node.module.startswith("tickwire"):
                        continue
                    for alias in node.names:  # `from a import b` imports the module a.b when there is one
                        sub = f"{node.module}.{alias.name}"
                        deps.add(sub if sub in self.files else node.module)
                else:
                    deps.update(a.name for a in node.names if a.name.startswith("tickwire"))
            deps.discard(name)


_SOURCE: list[Source] = []


def source() -> Source:
    if not _SOURCE:
        _SOURCE.append(Source())
    return _SOURCE[0]


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _violations(importers, forbidden) -> dict[str, list[str]]:
    src = source()
    out = {}
    for m, deps in src.deps.items():
        if _under(m, importers):
            bad = sorted(d for d in deps if _under(d, forbidden))
            if bad:
                out[m] = bad
    return out


def test_the_rules_are_read_from_real_modules():
    src = source()
    assert "tickwire.server.engine.staging" in src.deps and "tickwire.protocol.txn" in src.deps
    assert "tickwire.server.engine.ingest" in src.deps["tickwire.server.engine.staging"]  # imports are seen
    # an import inside a function is seen too (the Spark sinks' session starts lazily)
    assert "tickwire.server.adapters.spark.launch" in src.deps["tickwire.demo"]


def test_the_shared_roots_import_nothing_of_tickwire():
    assert _violations(BASE, ("tickwire",)) == {}


def test_the_protocol_imports_neither_the_server_nor_the_clients():
    assert _violations(PROTOCOL, ("tickwire.server", "tickwire.clients", *TOP)) == {}


def test_the_clients_do_not_import_the_server():
    assert _violations(CLIENTS, ("tickwire.server", *TOP)) == {}


def test_the_engine_imports_nothing_above_it():
    assert _violations(ENGINE, (*SERVER_CONFIG, *TRANSPORTS, *ADAPTERS, *APP, *TOP, *CLIENTS)) == {}


def test_transports_and_adapters_import_neither_each_other_nor_what_is_above_them():
    assert _violations(TRANSPORTS, (*ADAPTERS, *APP, *TOP)) == {}
    assert _violations(ADAPTERS, (*TRANSPORTS, *APP, *TOP)) == {}
    assert _violations(("tickwire.server",), TOP) == {}


def test_no_import_cycles():
    """Tarjan's strongly connected components of the import graph: every module alone."""
    deps = source().deps
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(root: str) -> None:  # iterative, so a deep chain of imports cannot overflow
        work = [(root, iter(sorted(deps.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in deps:
                    continue  # not a module of this repository (a name re-exported by a package)
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(deps.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        scc.append(m)
                        if m == node:
                            break
                    if len(scc) > 1:
                        cycles.append(sorted(scc))

    for m in sorted(deps):
        if m not in index:
            visit(m)
    assert cycles == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above can fail: a planted cycle through a function-level import is found."""
    src = source()
    saved = {k: set(v) for k, v in src.deps.items()}
    try:
        src.deps["tickwire.server.engine.graph.row_set"].add("tickwire.server.engine.core")
        try:
            test_no_import_cycles()
        except AssertionError as exc:
            assert "tickwire.server.engine.core" in str(exc)
        else:
            raise AssertionError("a planted import cycle went unnoticed")
    finally:
        src.deps.clear()
        src.deps.update(saved)


def _engine_private_uses(modules) -> dict[str, list[str]]:
    src = source()
    out = {}
    for name in modules:
        found = []
        for node in ast.walk(src.trees[name]):
            if isinstance(node, ast.Attribute) and node.attr in ENGINE_PRIVATE:
                found.append(f"line {node.lineno}: .{node.attr}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names]
                module = getattr(node, "module", None) or ""
                if module == "tickwire.server.engine.graph.graph" or "UpdateGraph" in names:
                    found.append(f"line {node.lineno}: imports the update graph")
        if found:
            out[name] = found
    return out


def test_nothing_outside_the_engine_reaches_into_the_update_graph():
    """The graph, its lock, its intake and the sources' queues are the engine's: everything else
    reads through `Engine.reading()`/`writing()` and writes through `Engine.write`."""
    outside = [m for m in source().trees if not _under(m, ENGINE)]
    assert "tickwire.server.services.flight_service" in outside
    assert _engine_private_uses(outside) == {}


@contextlib.contextmanager
def _planted(code: str, module: str = "tickwire.server.services.table_ops"):
    """`module` read as `code` while the block runs: proves a check can fail."""
    src = source()
    saved = src.trees[module]
    src.trees[module] = ast.parse(code)
    try:
        yield module
    finally:
        src.trees[module] = saved


def test_the_engine_private_check_sees_a_use():
    with _planted("def f(engine):\n    with engine.graph.lock:\n        pass\n") as planted:
        assert _engine_private_uses([planted]) == {planted: ["line 2: .graph"]}


# -- call contexts ------------------------------------------------------------------------------------
def _context_members() -> set[str]:
    from tickwire.server.services.rpc import CallContext

    return {n for n, v in vars(CallContext).items() if callable(v) and not n.startswith("_")}


def _context_uses_beyond(members: set[str], modules) -> dict[str, list[str]]:
    """Calls `context.<name>(...)` whose name is not in `members`, module by module."""
    src = source()
    out = {}
    for name in modules:
        found = [f"line {n.lineno}: context.{n.func.attr}" for n in ast.walk(src.trees[name])
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                 and isinstance(n.func.value, ast.Name) and n.func.value.id == "context"
                 and n.func.attr not in members]
        if found:
            out[name] = found
    return out


def test_handlers_use_only_what_every_transport_s_call_context_has():
    """The browser (websocket and gRPC-Web) and in-process transports stand in for grpc.aio's
    ServicerContext: each has every method of `CallContext`, and the handlers call no other (a
    method one transport lacked once made every DoPut over the websocket answer INTERNAL)."""
    import grpc.aio

    from tests.test_engine import _FakeContext
    from tickwire.server.services.inprocess import _Context
    from tickwire.server.web.calls import CallContext as _CallContext

    members = _context_members()
    assert {"peer", "abort", "time_remaining", "send_initial_metadata", "invocation_metadata"} <= members
    for cls in (grpc.aio.ServicerContext, _CallContext, _Context, _FakeContext):
        assert {m for m in members if not callable(getattr(cls, m, None))} == set(), cls.__name__
    # the forwarder is a grpc.aio generic handler and nothing else: no other transport runs it, and
    # it passes on grpc's own trailing metadata
    grpc_only = {"tickwire.server.services.forward"}
    server = [m for m in source().trees if _under(m, ("tickwire.server",)) and m not in grpc_only]
    assert "tickwire.server.services.flight_service" in server
    assert _context_uses_beyond(members, server) == {}


def test_the_call_context_check_sees_a_use_beyond_it():
    with _planted("async def f(req, context):\n    context.set_code(1)\n    context.peer()\n") as planted:
        assert _context_uses_beyond(_context_members(), [planted]) == {planted: ["line 2: context.set_code"]}
