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
import os
from pathlib import Path
from typing import Iterator

import pytest

from tests.interop.dh_server import DH_CYCLE_MS, DH_PSK, DhServer, deephaven_server_available, start_dh_server

# the suite's Spark JVMs, in this process and in its child processes, take the defaults in
# tests/spark-conf (options for short-lived JVMs; see its spark-defaults.conf)
os.environ.setdefault("SPARK_CONF_DIR", str(Path(__file__).resolve().parent / "spark-conf"))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`make test` runs pytest-xdist workers (`--dist loadfile`): a module's tests stay on one
    worker, so its module-scoped servers are made once, and the modules that use a shared Deephaven
    server (they name its fixture) all run on one worker, so a run starts each JVM once. The
    longest units go first (MODULE_SECONDS)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Scheduling(LoadFileScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "deephaven" if _uses_shared_deephaven(str(config.rootpath / path)) else path

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:  # the first assignment: the whole run is known
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: -_cost(unit[0], len(unit[1])))
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return Scheduling(config, log)


# Seconds the longest modules took in one `make test` on a 2-core machine (pytest --durations=0,
# summed by module; only their order matters). The scheduler hands out the longest units first, so
# that no worker starts a long one when the others are nearly done; a module not named here counts
# a tenth of a second a test.
MODULE_SECONDS = {
    "tests/test_spark_remote.py": 445, "tests/test_durability_crash.py": 225, "tests/test_browser.py": 140,
    "tests/test_convergence.py": 115, "tests/test_docker_steps.py": 95, "tests/test_readme.py": 85,
    "tests/test_expr_conformance.py": 80, "tests/test_spark_sinks.py": 75, "tests/test_demo.py": 70,
    "tests/test_graph_ops.py": 50, "tests/test_cli.py": 45, "tests/test_interop_dh_java.py": 45,
    "tests/test_barrage_publisher.py": 45, "tests/test_fuzz_requests.py": 40, "tests/test_graph_tables.py": 40,
    "tests/test_exports_lifecycle.py": 35, "tests/test_replica_deephaven.py": 35,
    "tests/test_interop_tickwire_java.py": 25, "tests/test_engine.py": 25, "tests/test_client_deephaven.py": 20,
    "tests/test_convergence_joins.py": 900, "tests/test_convergence_update_by.py": 600,
    "tests/test_convergence_update_by_time.py": 600, "tests/test_update_by_conformance.py": 200,
    "tests/test_graph_update_by.py": 60, "tests/test_graph_joins.py": 120, "tests/test_join_conformance.py": 120,
    "tests/test_soak_demo.py": 320, "tests/test_browser_https.py": 40,
}


def _cost(scope: str, tests: int) -> float:
    if scope == "deephaven":
        root = Path(__file__).resolve().parent.parent
        return sum(s for m, s in MODULE_SECONDS.items() if _uses_shared_deephaven(str(root / m)))
    return MODULE_SECONDS.get(scope, 0.1 * tests)


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



@pytest.fixture(scope="module")
def browser():
    """A headless Chromium for a module's browser tests (skipped when none can be found or installed)."""
    from tests.browser.cdp import launch_chromium

    with launch_chromium() as b:
        yield b


@pytest.fixture()
def page(browser):
    """A fresh page of the module's browser, closed after the test."""
    p = browser.new_page()
    yield p
    p.close()
