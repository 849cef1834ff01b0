"""Deephaven -> tickwire -> tickwire: replicas of a real Deephaven server's tables.

The Deephaven tables tick for a while and then stop changing (time tables cut by `head`), so
that the end state can be compared exactly: while they tick, the replicas follow (appends,
modifications of a last_by, shifts of a sort with Deephaven's sparse row keys); once they stop,
both replicas in the chain hold exactly the Deephaven server's rows and values, and the second
replica holds the same row keys as the first."""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from tests.interop.dh_server import deephaven_server_available
from tests.waiting import wait_until
from tickwire.clients.client import BarrageClient
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine

pytestmark = pytest.mark.slow

_skip = deephaven_server_available()
if _skip:
    pytest.skip(_skip, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

#: The ticking tables tick for TICK_S seconds (1,000 ticks of 30 ms) from when the script runs:
#: the chain test runs it again just before it starts replicating, so that its replicas follow
#: them for that long however slowly the server started or the replicas subscribed.
TICK_S = 30
TICKING = '''
from deephaven import time_table

rep_growing = time_table("PT0.03S").head(1000).update(["Seq = ii", "Px = 100.0 + ii * 0.25"])
rep_keyed = time_table("PT0.03S").head(1000).update(["Key = (int) (ii % 17)", "Val = ii * 3"]).last_by("Key")
rep_sorted = time_table("PT0.03S").head(1000).update([
    "Key = (int) (ii % 40)", "SortVal = (int) ((ii * 7919) % 101)", "Label = `k` + Key",
]).last_by("Key").sort("SortVal")
'''
TABLES = r'''
from deephaven import empty_table

rep_static = empty_table(500).update(["I = i", "S = i % 7 == 0 ? null : `s` + i", "D = i * 0.5"])
''' + TICKING
NAMES = ("rep_static", "rep_growing", "rep_keyed", "rep_sorted")


@pytest.fixture(scope="module")
def dh(deephaven_server):
    with deephaven_server.tables(TABLES) as server:
        yield server


def _state(engine, table):
    """(row keys, rows) of a table of `engine`, at one cycle boundary."""
    with engine.reading():
        keys = table.rowset.keys()
        return keys, table.gather(None, keys)


def test_deephaven_to_tickwire_to_tickwire_chain_converges(dh):
    engine1 = Engine(interval_ms=20)
    first = TickwireServer(engine1, port=0).start()
    engine2 = Engine(interval_ms=20)
    second = TickwireServer(engine2, port=0).start()
    host, port = dh.target.rsplit(":", 1)
    session = pydeephaven.Session(host=host, port=int(port))
    try:
        # fresh ticking tables, so that they tick for TICK_S seconds from here, however long the
        # server took to start or other tests ran before
        session.run_script(TICKING)
        reps1 = {n: first.replicate(dh.target, n) for n in NAMES}
        reps2 = {n: second.replicate(first.target, n) for n in NAMES}
        with BarrageClient(dh.target) as upstream:
            # the ticking tables stop after 1,000 ticks (TICK_S seconds); Deephaven sends a
            # subscription update at most once a second, so a replica may be up to a second behind
            assert wait_until(lambda: upstream.snapshot("rep_growing").num_rows == 1000, TICK_S + 60)

            def settled(name):
                want = upstream.snapshot(name)
                k1, v1 = _state(engine1, reps1[name].table)
                k2, v2 = _state(engine2, reps2[name].table)
                return v1.equals(want) and v2.equals(want) and np.array_equal(k1, k2)

            for name in NAMES:
                assert wait_until(lambda name=name: settled(name), 30), \
                    f"{name}: the chain did not converge to Deephaven"
        # they followed live updates, not just a final snapshot
        for name in ("rep_growing", "rep_keyed", "rep_sorted"):
            assert reps1[name].messages > 3, f"{name}: only {reps1[name].messages} messages"
        # Deephaven's sorted table uses a sparse key space; the replica kept it
        keys, _ = _state(engine1, reps1["rep_sorted"].table)
        assert keys.size == 40 and keys.max() > 40
    finally:
        session.close()
        second.stop(), first.stop(), engine2.stop(), engine1.stop()


def test_tickwire_serve_replicate_command_line(dh):
    """`tickwire serve --replicate HOST:PORT/TABLE` serves a replica of Deephaven's table."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "tickwire", "serve", "--port", str(port), "--duration", "60",
                             "--replicate", f"{dh.target}/rep_static,{dh.target}/rep_keyed"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    local = None
    try:
        deadline = time.monotonic() + 60
        names = []
        while time.monotonic() < deadline:
            try:  # the server starts listening after a moment
                local = local or BarrageClient(f"127.0.0.1:{port}")
                names = local.tables()
                if {"rep_static", "rep_keyed"} <= set(names):
                    break
            except Exception:  # noqa: BLE001
                pass
            time.sleep(0.2)
        assert {"rep_static", "rep_keyed"} <= set(names), names
        with BarrageClient(dh.target) as upstream:
            assert wait_until(lambda: local.snapshot("rep_static").equals(upstream.snapshot("rep_static")), 30)
            assert wait_until(lambda: local.snapshot("rep_keyed").equals(upstream.snapshot("rep_keyed")), 60)
    finally:
        if local is not None:
            local.close()
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "replicating" in out
