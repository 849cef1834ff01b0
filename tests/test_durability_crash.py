"""Issue 15's "done when": durable tables across crashes and restarts.

1. A Spark query (rate source; an append table and a keyed table with upserts and deletes) writes
   into a server with a data directory, both in one child process (tests/durability_child.py).
   The whole child (its process group: Python, Spark's JVM, Spark's Python workers) is killed
   with SIGKILL at random moments (12 times under `make soak`, four in `make test`: one of each
   kind), some while a checkpoint is being written:
   those runs hold the checkpoint thread (only it) after the temporary Parquet file is written
   or after its rename, before the journal it covers is deleted, and the kill is sent while it
   is held (the test sees the file there first). Each restart uses the same Spark checkpoint
   and data directory. A last run goes until the query's N rows are in; the tables, read by
   DoGet from that server and from the data directory with a fresh engine, must equal an
   uninterrupted run's, computed from values 0..N-1: every value once, in order, with row key
   = value in the append table (none lost, none applied twice), the keyed state by key.
2. A replica (TickwireServer.replicate) and a pydeephaven-ticking subscriber follow a server
   that is stopped and started again on the same port and data directory, with a producer
   writing before and after: both end identical to the source. The replica reconnects by
   itself; the pydeephaven-ticking user opens a new session and listens again (its listener
   ends with an error when the server goes away).

Set TICKWIRE_CRASH_SEED to replay one schedule of kills.
"""
from __future__ import annotations

import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests.convergence import soak_factor
from tests.interop import close_dh_session
from tests.serving import start_again

pytestmark = pytest.mark.slow

ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
CHILD = Path(__file__).with_name("durability_child.py")
ROOT = Path(__file__).resolve().parent.parent

N_ROWS = 1200  # values 0..1199 of the rate source
ROWS_PER_BATCH = 20
CHECKPOINT_CYCLES = 5
#: 12 kills under `make soak` (TICKWIRE_SOAK set), one of each kind in `make test`
SOAK_KILL_PLAN = ["ckpt-tmp"] * 2 + ["ckpt-renamed"] * 2 + ["batch"] * 5 + ["ready"] * 3
CI_KILL_PLAN = ["ckpt-tmp", "ckpt-renamed", "batch", "ready"]
CHILD_TIMEOUT = 120.0


def expected_append() -> dict:
    v = np.arange(N_ROWS, dtype=np.int64)
    return {"value": v.tolist(), "k": (v % 50).tolist()}


def expected_keyed() -> dict:
    """k -> value after upserting (k = v % 50, v) for v = 0..N-1 in order, deleting k when v % 7 == 0."""
    state: dict = {}
    for v in range(N_ROWS):
        if v % 7 == 0:
            state.pop(v % 50, None)
        else:
            state[v % 50] = v
    return state


# ------------------------------------------------------------------------------------------------
# the child process
# ------------------------------------------------------------------------------------------------

class Child:
    """One run of tests/durability_child.py in its own process group; its stdout lines arrive on
    `lines` (None once it closed)."""

    def __init__(self, data_dir: Path, spark_ck: Path, log: Path, pause=None):
        args = [sys.executable, str(CHILD), str(data_dir), str(spark_ck), "--rows", str(N_ROWS),
                "--rows-per-batch", str(ROWS_PER_BATCH), "--checkpoint-cycles", str(CHECKPOINT_CYCLES)]
        if pause:  # held until the kill: the test first finds the file, which a loaded machine may make slow
            args += ["--pause-checkpoint", pause, "120"]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                     cwd=ROOT, env=env, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.batches = 0
        self.replays = 0  # batches Spark re-ran after a kill that a table already had (skipped)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def next_line(self, deadline: float, missing_ok: bool = False):
        """The next line (None: the child closed its stdout, or nothing came by the deadline and
        `missing_ok`); fails past the deadline otherwise."""
        try:
            line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            if missing_ok:
                return None
            raise AssertionError(f"the child said nothing new in time; it said {self.seen[-5:]}") from None
        if line is not None:
            self.seen.append(line)
            if line.startswith("BATCH "):
                self.batches += 1
                self.replays = sum(int(x) for x in line.split()[3:5])
        return line

    def wait_for(self, prefix: str, timeout: float = CHILD_TIMEOUT) -> str:
        """The next line starting with `prefix`, or "DONE ..." if the query finished first."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next_line(deadline)
            if line is None:
                raise AssertionError(f"the child ended (rc {self.proc.wait()}) before {prefix!r}; "
                                     f"it said {self.seen[-5:]}")
            if line.startswith((prefix, "DONE")):
                return line

    def kill(self) -> None:
        """SIGKILL to the whole process group (the Python process, Spark's JVM and its workers)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"the child ended by itself (rc {self.proc.returncode}); it said {self.seen[-5:]}")
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self.log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and _group_alive(self.proc.pid):
            time.sleep(0.05)
        assert not _group_alive(self.proc.pid), "a process of the killed child's group survived SIGKILL"

    def finish(self) -> int:
        """Closes its stdin (it then stops cleanly) and returns its exit code."""
        self.proc.stdin.close()
        rc = self.proc.wait(60)
        self.log.close()
        return rc


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _checkpoint_files(data_dir: Path) -> tuple[list, list, list]:
    ns = data_dir / "default"
    tmp = sorted(ns.glob("*/checkpoints/checkpoint-*.parquet.tmp"))
    final = sorted(ns.glob("*/checkpoints/checkpoint-*.parquet"))
    journals = sorted(ns.glob("*/intraday/*/*/journal-*.twj"))
    return tmp, final, journals


def _kill_round(kind: str, rng: random.Random, data_dir: Path, spark_ck: Path, log: Path) -> dict:
    """Starts the child, kills it as `kind` says; returns what happened."""
    pause = {"ckpt-tmp": "tmp", "ckpt-renamed": "renamed"}.get(kind)
    child = Child(data_dir, spark_ck, log, pause)
    out = {"kind": kind}
    try:
        child.wait_for("READY")
        t_ready = time.monotonic()
        if kind == "ready":  # Spark resuming its query, the first (re-run) batch, a cycle ...
            delay = rng.uniform(0.0, 6.0)
            out["after"] = f"{delay:.2f}s after READY"
            deadline = t_ready + delay
            while time.monotonic() < deadline:
                line = child.next_line(deadline, missing_ok=True)
                if line is None or line.startswith("DONE"):
                    break
        elif kind == "batch":  # somewhere inside a later batch: between the two tables, in a cycle, ...
            n = rng.randint(1, 3)
            for _ in range(n):
                if child.wait_for("BATCH").startswith("DONE"):
                    break
            delay = rng.uniform(0.0, 0.4)
            out["after"] = f"{delay:.2f}s after batch line {n}"
            time.sleep(delay)
        else:  # a checkpoint thread held at the named point: the kill lands there
            line = child.wait_for("CKPT-")
            if line.startswith("DONE"):
                raise AssertionError(f"the query finished before a checkpoint was written ({kind})")
            path = Path(line.split(" ", 1)[1])
            tmp, final, journals = _checkpoint_files(data_dir)
            if kind == "ckpt-tmp":
                assert line.startswith("CKPT-TMP ") and path in tmp, (line, tmp)
            else:
                assert line.startswith("CKPT-RENAMED ") and final, (line, final)
            out["after"] = line.split(" ", 1)[0]
            out["files"] = (len(tmp), len(final), len(journals))
        if any(s.startswith("DONE") for s in child.seen):
            out["killed"] = False
            assert child.finish() == 0
            return out
        child.kill()
        out["killed"] = True
    except BaseException:
        if child.proc.poll() is None:
            os.killpg(child.proc.pid, signal.SIGKILL)
            child.proc.wait(30)
        raise
    finally:
        out["batches"], out["replays"] = child.batches, child.replays
    if kind in ("ckpt-tmp", "ckpt-renamed"):  # what the kill left behind
        tmp, final, journals = _checkpoint_files(data_dir)
        out["left"] = {"tmp": len(tmp), "checkpoints": len(final), "journals": len(journals)}
    return out


def _doget(port: int, name: str) -> pa.Table:
    client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
    try:
        return client.do_get(fl.Ticket(f"s/{name}".encode()), ANON).read_all()
    finally:
        client.close()


def _check_tables(appended: pa.Table, latest: pa.Table, where: str) -> None:
    got = appended.select(["value", "k"]).to_pydict()
    values = got["value"]
    assert len(values) == len(set(values)), f"{where}: a batch was applied twice: {len(values) - len(set(values))} " \
                                            f"duplicate values"
    missing = sorted(set(range(N_ROWS)) - set(values))
    assert not missing, f"{where}: {len(missing)} values lost, first {missing[:10]}"
    assert got == expected_append(), f"{where}: the append table's rows are not in the uninterrupted run's order"
    keyed = latest.select(["k", "value"]).to_pydict()
    assert len(keyed["k"]) == len(set(keyed["k"])), f"{where}: a key appears twice in the keyed table"
    assert dict(zip(keyed["k"], keyed["value"])) == expected_keyed(), f"{where}: the keyed table differs"


def test_spark_into_a_durable_server_survives_sigkill_at_random_moments(tmp_path):
    pytest.importorskip("pyspark")
    if subprocess.run(["java", "-version"], capture_output=True).returncode != 0:
        pytest.skip("Spark needs a Java 17 runtime on PATH")
    from tickwire.server.engine import Engine

    seed = int(os.environ.get("TICKWIRE_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    data_dir, spark_ck, log = tmp_path / "data", tmp_path / "spark-ck", tmp_path / "child.log"
    plan = list(SOAK_KILL_PLAN if soak_factor() > 1 else CI_KILL_PLAN)
    rng.shuffle(plan)
    rounds = []
    t0 = time.monotonic()
    for kind in plan:
        rounds.append(_kill_round(kind, rng, data_dir, spark_ck, log))
    t_kills = time.monotonic() - t0

    report = [f"seed {seed}; {len(rounds)} rounds in {t_kills:.0f}s"] + [str(r) for r in rounds]
    print("\n".join(report))
    killed = [r for r in rounds if r["killed"]]
    # a round whose moment never comes (the query finished first) is not a kill; nearly all must be
    assert len(killed) >= len(plan) - max(1, len(plan) // 6), report
    for kind in ("ckpt-tmp", "ckpt-renamed"):  # the moments a checkpoint is most fragile, every time
        assert sum(r["kind"] == kind for r in killed) == plan.count(kind), report
    for r in killed:
        if r["kind"] == "ckpt-tmp":  # killed mid-write: the temporary file is left, and ignored
            assert r["files"][0] >= 1, r
        if r["kind"] == "ckpt-renamed":  # killed between the rename and deleting the journal it covers
            assert r["files"][1] >= 1, r

    # the last run: no kill; the query goes until its N rows are in
    child = Child(data_dir, spark_ck, log)
    try:
        port = int(child.wait_for("READY").split()[1])
        child.wait_for("DONE")
        appended, latest = _doget(port, "appended"), _doget(port, "latest")
    except BaseException:
        os.killpg(child.proc.pid, signal.SIGKILL)
        child.proc.wait(30)
        raise
    assert child.finish() == 0, log.read_text()[-3000:]
    _check_tables(appended, latest, f"DoGet after the last run (seed {seed})")

    text = log.read_text(errors="replace")
    torn = text.count("dropping a torn last record")
    print(f"final run: {child.batches} batches, {child.replays} replays; torn records dropped over all "
          f"restarts: {torn}; {time.monotonic() - t0:.0f}s in all")
    for bad in ("not recovered", "NOT recovered", "refuses writes", "Traceback"):
        assert bad not in text, f"the child's log says {bad!r}:\n" + text[max(0, text.find(bad) - 2000):][:4000]

    # and the data directory alone, in a fresh engine: the same tables, the same row keys
    engine = Engine(interval_ms=3_600_000)
    found = {t.name: t for t in engine.open_storage(data_dir)}
    try:
        assert set(found) == {"appended", "latest"} and not engine.storage.errors
        with engine.reading():
            keys = found["appended"].rowset.keys()
            rows = found["appended"].gather(None)
            keyed = found["latest"].gather(None)
        assert np.array_equal(keys, np.arange(N_ROWS)), "the append table's row keys differ from an uninterrupted run"
        _check_tables(rows, keyed, f"the data directory (seed {seed})")
        # every batch of the query is remembered by both tables (a re-run of any is ignored)
        qid = next(b[1] for b in _batch_ids(found["appended"]))
        batches = -(-N_ROWS // ROWS_PER_BATCH)
        assert all(found["appended"].has_batch(("spark", qid, b)) for b in range(batches))
        assert all(found["latest"].has_batch(("spark", qid, b)) for b in range(batches))
    finally:
        engine.close_storage()


def _batch_ids(table) -> list:
    state = table.batch_memory().state()
    return [tuple(scope) + (n,) for scope, _floor, recent in state["scopes"] for n in recent]


# ------------------------------------------------------------------------------------------------
# a replica and a pydeephaven-ticking subscriber across a restart
# ------------------------------------------------------------------------------------------------

def _wait_until(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _state(engine, table) -> tuple[np.ndarray, pa.Table]:
    """(row keys, rows) of `table`, a table of `engine`, at one cycle boundary."""
    with engine.reading():
        keys = table.rowset.keys().copy()
        return keys, table.gather(None, keys)


def _plain(t: pa.Table) -> pa.Table:
    return pa.table({f.name: t.column(i) for i, f in enumerate(t.schema)})


def _ticking_current(update) -> pa.Table:
    cur = update.update.current
    rows = cur.get_row_sequence()
    names = cur.schema.names if hasattr(cur.schema, "names") else [f.name for f in cur.schema]
    return pa.table({name: cur.get_column_by_name(name, True).get_chunk(rows) for name in names})


class Subscriber:
    """What a pydeephaven-ticking user does: a session, `listen` on each table; after the server
    went away, a new session and new listeners. Right after a restart the first connection
    attempts may be refused for about a second (gRPC's subchannel, shared by the process, backs
    off after the old server went away), so opening the session is retried."""

    def __init__(self, port: int, names):
        from pydeephaven import Session
        from pydeephaven_ticking.table_listener import listen

        deadline = time.monotonic() + 15
        while True:  # gRPC's shared subchannel may still be backing off from the old server: retry
            try:
                self.session = Session(host="127.0.0.1", port=port)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.current: dict = {}
        self.errors: list = []
        self.handles = []
        for name in names:
            handle = listen(self.session.open_table(name), self._on_update(name), self.errors.append)
            handle.start()
            self.handles.append(handle)

    def _on_update(self, name):
        def on_update(update):
            self.current[name] = _ticking_current(update)
        return on_update

    def close(self) -> None:
        for h in self.handles:
            try:
                h.stop()
            except Exception:  # noqa: BLE001 - the server it listened to is gone
                pass
        close_dh_session(self.session)  # its server may be gone


@pytest.mark.interop
def test_a_replica_and_a_ticking_subscriber_follow_a_durable_server_across_a_restart(tmp_path):
    pytest.importorskip("pydeephaven_ticking")
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Durability, Engine, EngineConfig, TableSpec

    schema = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])
    rng = np.random.default_rng(5)
    data_dir = tmp_path / "data"
    durable = EngineConfig(interval_ms=20, data_dir=data_dir, durability=Durability(checkpoint_cycles=5))

    def rows(keys, c):
        keys = np.asarray(keys, dtype=np.int64)
        return pa.table({"k": keys, "v": keys * 0.5 + c, "s": [f"s{k}-{c}" for k in keys]}, schema=schema)

    def produce(engine, cycles: range):
        for c in cycles:
            engine.write(engine.resolve("trades"), rows(np.arange(10 * c, 10 * c + int(rng.integers(1, 10))), c),
                         batch_id=("producer", "trades", c))
            engine.write(engine.resolve("prices"), rows(rng.integers(0, 40, 12), c),
                         delete=pa.table({"k": rng.integers(0, 40, 3)}), batch_id=("producer", "prices", c))

    def same(engine, src, rep) -> bool:
        ka, va = _state(engine, src)
        kb, vb = _state(local, rep)
        return np.array_equal(ka, kb) and va.equals(vb)

    def ticking_same(sub, engine, name) -> bool:
        got = sub.current.get(name)
        if got is None:
            return False
        _step, expected = engine.snapshot(engine.resolve(name))
        return got.num_rows == expected.num_rows and got.equals(_plain(expected).cast(got.schema))

    engine = Engine(durable)  # the server opens its data directory at start
    server = TickwireServer(engine, port=0, web=False).start()
    port = server.port  # the restart below listens on it again
    engine.get_or_create(TableSpec("trades", "append", schema))
    engine.get_or_create(TableSpec("prices", "keyed", schema, keys=("k",)))
    produce(engine, range(12))

    local = Engine(interval_ms=10)
    follower = TickwireServer(local, port=0, web=False).start()
    replicas = {name: follower.replicate(f"127.0.0.1:{port}", name) for name in ("trades", "prices")}
    sub = Subscriber(port, ["trades", "prices"])
    server2 = None
    try:
        produce(engine, range(12, 20))
        for name, rep in replicas.items():
            _wait_until(lambda name=name, rep=rep: same(engine, engine.resolve(name), rep.table), 20,
                        f"replica {name} before the restart")
            _wait_until(lambda name=name: ticking_same(sub, engine, name), 20, f"ticking {name} before the restart")
        before = {name: _state(engine, engine.resolve(name)) for name in replicas}

        server.stop()  # a clean restart: the same port, the same data directory, a new process's objects
        engine.stop()
        _wait_until(lambda: all(r.status.startswith("disconnected") for r in replicas.values()), 10,
                    "the replicas to notice")
        _wait_until(lambda: len(sub.errors) >= 1, 10, "the ticking listeners to end")
        sub.close()

        def restart():
            fresh = Engine(durable)
            try:
                return TickwireServer(fresh, port=port, web=False).start()
            except BaseException:
                fresh.stop()
                raise

        server2 = start_again(restart)
        engine2 = server2.engine
        assert {t.name for t in server2.recovered} == {"trades", "prices"}
        for name, (keys, data) in before.items():
            k2, d2 = _state(engine2, engine2.resolve(name))
            assert np.array_equal(k2, keys) and d2.equals(data), f"{name} did not come back as it was"
        # the producer resends its last batch (it did not know it was applied) and goes on
        assert not engine2.write(engine2.resolve("trades"), rows([1], 0), batch_id=("producer", "trades", 19))
        produce(engine2, range(20, 35))
        sub = Subscriber(port, ["trades", "prices"])  # what a pydeephaven-ticking user does after a restart
        produce(engine2, range(35, 45))
        for name, rep in replicas.items():
            _wait_until(lambda name=name, rep=rep: same(engine2, engine2.resolve(name), rep.table), 30,
                        f"replica {name} after the restart")
            _wait_until(lambda name=name: ticking_same(sub, engine2, name), 20, f"ticking {name} after the restart")
            assert rep.status == "connected" and rep.failures >= 1
        assert not sub.errors, sub.errors
        assert len(engine2.resolve("trades").rowset) > len(before["trades"][0])
    finally:
        sub.close()
        follower.stop()
        local.stop()
        if server2 is not None:
            server2.stop()
            server2.engine.stop()
        server.stop()
        engine.stop()
