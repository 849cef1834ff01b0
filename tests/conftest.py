"""Fixtures shared by the whole suite.

One real Deephaven server (PyPI `deephaven-server`, a JVM) serves every interop test of a run
that needs one with anonymous access, and one more every test that needs pre-shared-key access:
starting a Deephaven server costs tens of seconds of this machine's two cores, so each module adds
its own tables to the shared server (`deephaven_server.tables(script)`, removed again when the
module is done) instead of starting its own. Both start on first use, so a run that selects no
interop test starts neither.
"""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Iterator

import pytest

from tests.interop.dh_server import DH_CYCLE_MS, DH_PSK, DhServer, deephaven_server_available, start_dh_server


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test` runs two pytest-xdist workers (`--dist loadfile`): a module's tests stay on one
    worker, so its module-scoped servers are made once, and the modules that use a shared Deephaven
    server (they name its fixture) all run on one worker, so a run starts each JVM once."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "deephaven" if _uses_shared_deephaven(str(config.rootpath / path)) else path

    return Scheduling(config, log)


@functools.lru_cache(maxsize=None)
def _uses_shared_deephaven(path: str) -> bool:
    try:
        source = Path(path).read_text(encoding="utf-8")
    except OSError:
        return False
    return "deephaven_server" in source or "deephaven_psk_server" in source


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

