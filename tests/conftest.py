"""Fixtures shared by the whole suite.

One real Deephaven server (PyPI `deephaven-server`, a JVM) serves every interop test of a run
that needs one with anonymous access, and one more every test that needs pre-shared-key access:
starting a Deephaven server costs tens of seconds of this machine's two cores, so each module adds
its own tables to the shared server (`deephaven_server.tables(script)`, removed again when the
module is done) instead of starting its own. Both start on first use, so a run that selects no
interop test starts neither.
"""
from __future__ import annotations

from typing import Iterator

import pytest

from tests.interop.dh_server import DH_CYCLE_MS, DH_PSK, DhServer, deephaven_server_available, start_dh_server


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs two pytest-xdist workers (`--dist loadgroup`): a module's tests stay on one
    worker, so its module-scoped servers are made once, and the modules that use a shared Deephaven
    server all run on the same worker, so a run starts each JVM once."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    for module, its in modules.items():
        shares = any({"deephaven_server", "deephaven_psk_server"} & set(getattr(i, "fixturenames", ()))
                     for i in its)
        group = "deephaven" if shares else module
        for item in its:
            item.add_marker(pytest.mark.xdist_group(group))


def _start(psk: str | None) -> Iterator[DhServer]:
    why = deephaven_server_available()
    if why:
        pytest.skip(why)
    with start_dh_server(psk=psk, extra_jvm_args=[f"-DPeriodicUpdateGraph.targetCycleDurationMillis={DH_CYCLE_MS}"]
                         ) as server:
        yield server


@pytest.fixture(scope="session")
def deephaven_server() -> Iterator[DhServer]:
    """A real Deephaven 42.7 with anonymous access and the tables of
    tests/interop/dh_server.py's DEFAULT_TABLES, shared by the run."""
    yield from _start(None)


@pytest.fixture(scope="session")
def deephaven_psk_server() -> Iterator[DhServer]:
    """A real Deephaven 42.7 that accepts only the pre-shared key DH_PSK, shared by the run."""
    yield from _start(DH_PSK)
