"""Spark beyond one process: `writeStream.format("tickwire")` from a Spark driver in another
process than the server (tickwire.clients.spark.datasource).

Every Spark query runs in a child process (tests/spark_remote_child.py: its own SparkSession,
`local[2]`), and the server it writes into runs in this process (or, for the server-restart
test, in a child process of its own with a data directory). The input is deterministic: a
directory of Parquet files written before the query starts, read one file per micro-batch with
the available-now trigger, so batch i is file i and the query ends by itself.

1. Every mode (append, a ring table, upsert with deletes, replace from a complete-mode
   aggregation, blink) against tickwire's in-process `foreachBatch` sinks fed the same input in
   the same child (one Spark JVM for all of them): the same tables, row keys and cycle-by-cycle
   updates; each micro-batch is one engine cycle, and a Barrage subscriber never sees a
   batch split across updates; a table the server refuses the rows of (a column of another
   type) fails the query with the server's message.
2. Faults (`local[2,4]` where Spark must retry tasks): a Python worker killed in the middle of
   its upload and another one after staging its part (the retried attempts' parts are the ones
   committed, the dead ones are discarded); the driver killed before and after its commit, the
   query restarted from its checkpoint; the server killed and restarted on its data directory
   between staging and commit, the query stopping with the server's message and restarted from
   its checkpoint in the same Spark application (whose Python workers hold sessions the
   restarted server no longer knows: they log in again, without a failed task). Each ends with
   every row once, none missing, and nothing left staged.
3. A Spark Connect session (`SparkSession.builder.remote("local[2]")`) writing through the data
   source registered on it. The `spark` extra installs what pyspark's Spark Connect client needs
   (grpcio-status, googleapis-common-protos, zstandard); where they are missing the test skips
   with pyspark's own words.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pyarrow.parquet as pq
import pytest

pytest.importorskip("pyspark.sql.datasource")

from tests import waiting  # noqa: E402
from tests.serving import port_held  # noqa: E402
from tests.spark_remote_child import Recorder  # noqa: E402
from tickwire.server.app import TickwireServer  # noqa: E402
from tickwire.server.engine import Engine, TableSpec  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
CHILD = Path(__file__).with_name("spark_remote_child.py")
ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=30)
TIMEOUT = 240.0  # seconds for one child's queries (Spark's JVM starts in ~15 s on 2 cores)

SCHEMA = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int64()), ("Seq", pa.int64()),
                    ("Closed", pa.bool_())])
DDL = "Sym STRING, Price DOUBLE, Size BIGINT, Seq BIGINT, Closed BOOLEAN"
SYMS = ["A", "B", "C", "D", "E", "F"]
ROWS_PER_FILE = [9, 7, 10, 8]
RING = 7
REPLACE_LIMIT = 12  # the replace query keeps the groups whose Total is below it (spark_remote_child.shaped)


@pytest.fixture(autouse=True, scope="module")
def _java():
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java 17 runtime on PATH")


# ------------------------------------------------------------------------------------------------
# input, processes, servers
# ------------------------------------------------------------------------------------------------

def input_files(folder: Path, rows_per_file=ROWS_PER_FILE) -> list[pa.Table]:
    """Parquet files, one per micro-batch, with increasing modification times (the order Spark's
    file source takes them in). Seq is unique; B closes in file 2 and D in file 3."""
    folder.mkdir(parents=True)
    files = []
    now = time.time()
    for i, n in enumerate(rows_per_file):
        seq = [100 * i + j for j in range(n)]
        sym = [SYMS[(s * 5 + i) % len(SYMS)] for s in seq]
        closed = [(i == 2 and x == "B") or (i == 3 and x == "D") for x in sym]
        t = pa.table({"Sym": sym, "Price": [s * 0.25 for s in seq], "Size": [s % 5 + 1 for s in seq], "Seq": seq,
                      "Closed": closed}, schema=SCHEMA)
        path = folder / f"part-{i:03d}.parquet"
        pq.write_table(t, path)
        os.utime(path, (now - 100 + 10 * i, now - 100 + 10 * i))
        files.append(t)
    return files


class Child:
    """A process of tests/spark_remote_child.py in its own process group; its stdout lines arrive
    on a queue, its stderr goes to `log`."""

    def __init__(self, args: list[str], log: Path):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        self.log_path = log
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, str(CHILD), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, cwd=ROOT, env=env,
                                     start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for raw in self.proc.stdout:
            self.lines.put(raw.decode().rstrip("\n"))
        self.lines.put(None)

    def tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def wait_for(self, prefix: str, timeout: float = TIMEOUT) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {prefix!r} from the child in {timeout:.0f} s; it said {self.seen[-8:]}; "
                                     f"its log ends:\n{self.tail()}") from None
            if line is None:
                raise AssertionError(f"the child ended (rc {self.proc.wait()}) before {prefix!r}; it said "
                                     f"{self.seen[-8:]}; its log ends:\n{self.tail()}")
            self.seen.append(line)
            if line.startswith(prefix):
                return line

    def outcomes(self, timeout: float = TIMEOUT) -> dict[str, str]:
        """Waits for ALL-DONE: each query's "DONE" or its failure message."""
        self.wait_for("ALL-DONE", timeout)
        out = {}
        for line in self.seen:
            kind, _, rest = line.partition(" ")
            if kind == "DONE":
                out[rest] = "DONE"
            elif kind == "FAILED":
                name, _, message = rest.partition(" ")
                out[name] = json.loads(message)
        self.finish()
        return out

    def kill(self) -> None:
        """SIGKILL to the whole group (the Python driver, Spark's JVM and its Python workers)."""
        assert self.proc.poll() is None, f"the child ended by itself (rc {self.proc.returncode}); {self.seen[-8:]}"
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _group_alive(self.proc.pid):
            time.sleep(0.05)
        self.log.close()

    def finish(self, timeout: float = 60) -> int:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            rc = self.proc.wait(30)
        self.log.close()
        return rc

    def stop(self) -> None:
        """Whatever state it is in: gone afterwards (for finalizers)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(30)
        if not self.log.closed:
            self.log.close()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def run_child(tmp: Path, name: str, queries: list[dict], *, master: str = "local[2]", connect: bool = False,
              local_out: Path | None = None) -> Child:
    spec = {"master": master, "connect": connect, "queries": queries,
            "local_out": str(local_out) if local_out else None}
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    return Child(["run", str(path)], tmp / f"{name}.log")


def remote_query(name: str, folder: Path, tmp: Path, port: int, table: str, *, shape: str = "raw",
                 output_mode: str = "append", fmt: str = "tickwire", checkpoint: str | None = None,
                 **options) -> dict:
    opts = {"uri": f"grpc://127.0.0.1:{port}", "table": table, **options}
    return {"name": name, "input": str(folder), "ddl": DDL, "shape": shape, "output_mode": output_mode,
            "checkpoint": str(tmp / (checkpoint or f"ck-{name}")), "sink": "remote", "format": fmt,
            "options": opts}


def local_query(name: str, folder: Path, tmp: Path, tables: list[dict], *, shape: str = "raw",
                output_mode: str = "append") -> dict:
    return {"name": name, "input": str(folder), "ddl": DDL, "shape": shape, "output_mode": output_mode,
            "checkpoint": str(tmp / f"ck-{name}"), "sink": "local", "tables": tables}


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def staging_status(port: int) -> dict:
    with fl.connect(f"grpc://127.0.0.1:{port}") as client:
        (res,) = list(client.do_action(fl.Action("tickwire.staging", b""), options=ANON))
    return json.loads(res.body.to_pybytes())


def doget(port: int, table: str) -> pa.Table:
    with fl.connect(f"grpc://127.0.0.1:{port}") as client:
        return client.do_get(fl.Ticket(b"s/" + table.encode()), options=ANON).read_all()


def assert_nothing_staged(port: int) -> dict:
    status = staging_status(port)
    assert status["bytes"] == 0 and status["batches"] == [] and status["producers"] == {}, status
    return status


def assert_each_row_once(table: pa.Table, files: list[pa.Table]) -> None:
    """Every input row once, none missing, each batch's rows together in batch order."""
    want = pa.concat_tables(files)
    got = table.select(SCHEMA.names)
    assert sorted(got.column("Seq").to_pylist()) == sorted(want.column("Seq").to_pylist())
    assert got.sort_by("Seq").equals(want.sort_by("Seq"))
    batch_of = [s // 100 for s in got.column("Seq").to_pylist()]
    assert batch_of == sorted(batch_of), "the batches are not in order"


def seqs(rows: list[dict]) -> list[int]:
    return [r["Seq"] for r in rows]


# ------------------------------------------------------------------------------------------------
# 1. every mode from another process equals the in-process sink
# ------------------------------------------------------------------------------------------------

REMOTE_TABLES = ["append", "ring", "upserts", "totals", "ticks", "clash"]


@pytest.fixture(scope="module")
def modes(tmp_path_factory):
    """One child runs every mode twice, through the data source into this process's server and
    through the in-process sinks into its own engine; the tests below read what each side did."""
    from tickwire.clients.client import BarrageClient

    tmp = tmp_path_factory.mktemp("modes")
    folder = tmp / "in"
    files = input_files(folder)
    engine = Engine(interval_ms=20)
    server = TickwireServer(engine, port=0, web=False).start()
    recorder = Recorder(engine, REMOTE_TABLES)
    # the append table exists before the query (so a subscriber can be there from the start), as
    # the sink makes it; "clash" has Seq as a string, which the query's rows cannot go into
    engine.get_or_create(TableSpec("append", "append", SCHEMA))
    clash = pa.schema([f if f.name != "Seq" else pa.field("Seq", pa.string()) for f in SCHEMA])
    engine.get_or_create(TableSpec("clash", "append", clash))
    client = BarrageClient(f"127.0.0.1:{server.port}")
    seen = []
    sub = client.subscribe("append", on_update=seen.append)
    port = server.port
    queries = [
        remote_query("r_append", folder, tmp, port, "append"),
        remote_query("r_ring", folder, tmp, port, "ring", max_rows=str(RING)),
        remote_query("r_upsert", folder, tmp, port, "upserts", shape="keyed", mode="upsert", keys="Sym",
                     delete_column="Closed"),
        remote_query("r_update_mode", folder, tmp, port, "totals_by_update", shape="totals", output_mode="update",
                     mode="upsert", keys="Sym", delete_column="Closed"),
        remote_query("r_replace", folder, tmp, port, "totals", shape="replace", output_mode="complete",
                     mode="replace", keys="Sym"),
        remote_query("r_blink", folder, tmp, port, "ticks", mode="blink"),
        remote_query("r_clash", folder, tmp, port, "clash"),
        local_query("l_raw", folder, tmp, [{"table": "append"}, {"table": "ring", "max_rows": RING},
                                           {"table": "ticks", "mode": "blink"}]),
        local_query("l_upsert", folder, tmp, [{"table": "upserts", "mode": "upsert", "keys": ["Sym"],
                                               "delete_column": "Closed"}], shape="keyed"),
        local_query("l_replace", folder, tmp, [{"table": "totals", "mode": "replace", "keys": ["Sym"]}],
                    shape="replace", output_mode="complete"),
    ]
    child = run_child(tmp, "modes", queries, local_out=tmp / "local.json")
    try:
        outcomes = child.outcomes()
        local = json.loads((tmp / "local.json").read_text())
        total = sum(f.num_rows for f in files)
        assert sub.wait_for(lambda s: s.size >= total, timeout=60), (sub.size, total)

        def blink_emptied() -> bool:  # every batch added, and the cycle after the last one removed it
            with recorder.lock:
                ups = list(recorder.updates["ticks"])
            return sum(len(u["added"]) for u in ups) == total and bool(ups) and not ups[-1]["added"]
        # the blink table's last rows leave in the next cycle; when they never do, the blink test says how
        waiting.wait_until(blink_emptied, 30)
        yield {"files": files, "outcomes": outcomes, "local": local, "remote": recorder.dump(),
               "subscribed": list(seen), "port": port, "staging": staging_status(port),
               "update_mode_table": engine.resolve("totals_by_update")}
    finally:
        child.stop()
        sub.close()
        client.close()
        server.stop()
        engine.stop()


def updates_of(side: dict, table: str) -> list[tuple]:
    return [(u["added"], u["removed"], u["modified"], u["modified_columns"]) for u in side[table]["updates"]]


def assert_same_table(modes, table: str) -> None:
    """The remote table equals the in-process sink's: columns and types, rows in row-key order,
    row keys, and the same update in every cycle that changed it."""
    remote, local = modes["remote"][table], modes["local"][table]
    assert remote["kind"] == local["kind"]
    assert remote["schema"] == local["schema"]
    assert remote["rows"] == local["rows"]
    assert remote["keys"] == local["keys"]
    assert updates_of(modes["remote"], table) == updates_of(modes["local"], table)


def test_every_query_ends_as_expected_and_nothing_stays_staged(modes):
    assert {n: o for n, o in modes["outcomes"].items() if n not in ("r_clash", "r_update_mode")} == dict.fromkeys(
        ("r_append", "r_ring", "r_upsert", "r_replace", "r_blink", "l_raw", "l_upsert", "l_replace"), "DONE")
    status = modes["staging"]
    assert status["bytes"] == 0 and status["batches"] == [], status
    # 4 batches for each of the 5 remote queries that succeeded, each committed once
    assert status["committed"] == 5 * len(ROWS_PER_FILE) and status["replays"] == 0


def test_append_and_ring_tables_equal_the_in_process_sinks(modes):
    # Batch i is file i for both queries, split by the same hash partitioning into the same two
    # partitions; the in-process sink appends a batch in the order Spark collects it (partition
    # 0, then 1), and a commit concatenates the staged parts in the order the driver names them
    # (by partition). So the tables are equal row for row, with the same row keys.
    files = modes["files"]
    for table in ("append", "ring"):
        assert_same_table(modes, table)
    remote = modes["remote"]
    assert_each_row_once(pa.Table.from_pylist(remote["append"]["rows"], schema=SCHEMA), files)
    assert remote["append"]["keys"] == list(range(sum(ROWS_PER_FILE)))
    # one cycle per batch, with exactly that batch's rows
    added = [sorted(seqs(u["added"])) for u in remote["append"]["updates"]]
    assert added == [sorted(f.column("Seq").to_pylist()) for f in files]
    last = remote["append"]["rows"][-RING:]
    assert remote["ring"]["rows"] == last and remote["ring"]["kind"] == "RingTable"


def test_upsert_with_deletes_equals_the_in_process_sink(modes):
    # rows partitioned by key: within a batch the rows of a key keep their input order, so the
    # last row of each key (the one that counts) is the same on both sides
    assert_same_table(modes, "upserts")
    # and both equal the upserts done here: the last row of each Sym, closed ones deleted
    state = {}
    for r in pa.concat_tables(modes["files"]).to_pylist():
        closed = r.pop("Closed")
        if closed:
            state.pop(r["Sym"], None)
        else:
            state[r["Sym"]] = r
    rows = modes["remote"]["upserts"]["rows"]
    assert {r["Sym"]: r for r in rows} == state and len(rows) == len(state)
    assert modes["remote"]["upserts"]["schema"] == [["Sym", "string"], ["Price", "double"], ["Size", "int64"],
                                                     ["Seq", "int64"]]
    updates = modes["remote"]["upserts"]["updates"]
    assert len(updates) == len(ROWS_PER_FILE)
    assert sum(u["removed"] for u in updates) >= 2 and sum(u["modified"] for u in updates) > 0


def test_update_output_mode_is_refused_by_spark(modes):
    # Spark's Python data sources take append and complete output modes only (their write
    # builder supports truncation, not update-as-append): an aggregation in update mode fails at
    # its start, before writing anything; complete mode with mode "replace" is the way there
    message = modes["outcomes"]["r_update_mode"]
    assert "tickwire does not support Update mode" in message, message
    assert modes["update_mode_table"] is None


def test_replace_from_a_complete_aggregation_equals_the_in_process_sink(modes):
    assert_same_table(modes, "totals")
    rows = pa.concat_tables(modes["files"]).to_pylist()
    totals = {s: sum(r["Size"] for r in rows if r["Sym"] == s) for s in SYMS}
    expected = {s: (t, max(r["Seq"] for r in rows if r["Sym"] == s)) for s, t in totals.items() if t < REPLACE_LIMIT}
    got = {r["Sym"]: (r["Total"], r["Last"]) for r in modes["remote"]["totals"]["rows"]}
    assert got == expected
    updates = modes["remote"]["totals"]["updates"]
    # groups crossed the limit (removed) and others changed (modified): the diff, not a reload
    assert sum(u["removed"] for u in updates) > 0 and sum(u["modified"] for u in updates) > 0


def test_blink_batches_live_one_cycle_each_as_in_process(modes):
    files = modes["files"]
    for side in ("remote", "local"):
        updates = modes[side]["ticks"]["updates"]
        with_rows = [u for u in updates if u["added"]]
        # each batch arrives whole in one cycle, in batch order
        assert [sorted(seqs(u["added"])) for u in with_rows] == [sorted(f.column("Seq").to_pylist()) for f in files]
        # and leaves in the next one (with the next batch, or alone)
        held = 0
        for u in updates:
            assert u["removed"] == held
            held = len(u["added"])
        assert held == 0 and modes[side]["ticks"]["rows"] == []
    assert [u["added"] for u in modes["remote"]["ticks"]["updates"] if u["added"]] == \
        [u["added"] for u in modes["local"]["ticks"]["updates"] if u["added"]]


def test_a_subscriber_never_sees_a_batch_split(modes):
    batches = [set(f.column("Seq").to_pylist()) for f in modes["files"]]
    arrived = []
    for u in modes["subscribed"]:
        assert u.removed_rows.size == 0 and not u.modified_columns
        got = set(u.added.column("Seq").to_pylist()) if u.added.num_rows else set()
        for b in batches:
            assert not (got & b) or b <= got, f"an update holds part of a batch: {sorted(got & b)}"
        arrived += u.added.column("Seq").to_pylist() if u.added.num_rows else []
    assert arrived == seqs(modes["remote"]["append"]["rows"])


def test_a_server_refusal_fails_the_batch_with_the_servers_message(modes):
    message = modes["outcomes"]["r_clash"]
    assert message != "DONE"
    assert "table 'clash'" in message and "column 'Seq' is int64 in the batch but string in the table" in message, \
        message
    assert modes["remote"]["clash"]["rows"] == [] and modes["remote"]["clash"]["updates"] == []


# ------------------------------------------------------------------------------------------------
# 2. faults
# ------------------------------------------------------------------------------------------------

@pytest.fixture
def server():
    engine = Engine(interval_ms=20)
    srv = TickwireServer(engine, port=0, web=False).start()
    yield srv
    srv.stop()
    engine.stop()


def table_rows(srv: TickwireServer, name: str) -> pa.Table:
    t = srv.engine.resolve(name)
    return t.to_arrow() if t is not None else SCHEMA.empty_table()


def test_a_task_killed_mid_write_is_retried_and_its_part_discarded(server, tmp_path):
    folder = tmp_path / "in"
    files = input_files(folder)
    log, marker, go = tmp_path / "kills.jsonl", tmp_path / "held", tmp_path / "go"
    fault = {"log": str(log),
             # partition 0's first attempt dies once partition 1 is staged, so the bytes the
             # server holds beyond staged parts are its own
             "kill": [{"batch": 1, "partition": 0, "when": "mid", "after": ["1"]},
                      {"batch": 2, "partition": 1, "when": "staged"}],
             "hold": {"batch": 2, "when": "before", "marker": str(marker), "go": str(go)}}
    child = run_child(tmp_path, "kills", [remote_query("q", folder, tmp_path, server.port, "trades",
                                                       fmt="tickwire_faulty", fault=fault)], master="local[2,4]")
    try:
        wait_until(marker.exists, TIMEOUT, "the commit of batch 2")
        held = json.loads(marker.read_text())
        kills = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(k["batch"], k["partition"], k["when"]) for k in kills] == [(1, 0, "mid"), (2, 1, "staged")]
        assert kills[0]["in_flight_bytes"] > 0  # the first attempt had sent rows when it died
        # the dead attempt of batch 2 staged its part: it is there beside the retry's, which the
        # commit names instead
        dead = kills[1]["attempt"]
        (staged,) = [b for b in staging_status(server.port)["batches"] if b["batch"] == 2]
        assert staged["producer"] == held["producer"]
        assert sorted((p["part"], p["attempt"]) for p in staged["parts"]) == \
            sorted([("1", dead)] + [(p, a) for p, a, _rows in held["parts"]])
        assert ("1", dead) not in [(p, a) for p, a, _rows in held["parts"]]
        assert "1" in [p for p, _a, _rows in held["parts"]]
        go.touch()
        assert child.outcomes() == {"q": "DONE"}
    finally:
        child.stop()
    assert_nothing_staged(server.port)
    assert_each_row_once(table_rows(server, "trades"), files)


def test_the_driver_killed_before_and_after_its_commit(server, tmp_path):
    folder = tmp_path / "in"
    files = input_files(folder)
    port = server.port

    def query(fmt: str, hold: dict | None) -> dict:
        extra = {"fault": {"hold": hold}} if hold else {}
        return remote_query("q", folder, tmp_path, port, "trades", fmt=fmt, checkpoint="ck", **extra)

    # 1: killed while the commit of batch 1 is about to be sent: its parts stay staged
    marker1 = tmp_path / "held-1"
    child = run_child(tmp_path, "run1", [query("tickwire_faulty", {"batch": 1, "when": "before",
                                                                   "marker": str(marker1), "go": None})])
    try:
        wait_until(marker1.exists, TIMEOUT, "the commit of batch 1")
        held1 = json.loads(marker1.read_text())
        (staged,) = staging_status(port)["batches"]
        assert (staged["producer"], staged["batch"]) == (held1["producer"], 1)
        assert sorted((p["part"], p["attempt"]) for p in staged["parts"]) == \
            sorted((p, a) for p, a, _rows in held1["parts"])
        child.kill()
    finally:
        child.stop()
    assert_each_row_once(table_rows(server, "trades"), files[:1])
    # 2: the query restarts from its checkpoint, writes batch 1 again (committing its new parts,
    # the old ones dropped), then is killed after the server applied batch 2, before Spark
    # recorded it
    marker2 = tmp_path / "held-2"
    child = run_child(tmp_path, "run2", [query("tickwire_faulty", {"batch": 2, "when": "after",
                                                                   "marker": str(marker2), "go": None})])
    try:
        wait_until(marker2.exists, TIMEOUT, "the commit of batch 2")
        held2 = json.loads(marker2.read_text())
        assert held2["producer"] == held1["producer"]  # the query's id, kept in the checkpoint
        assert_each_row_once(table_rows(server, "trades"), files[:3])
        assert_nothing_staged(port)
        child.kill()
    finally:
        child.stop()
    replays = staging_status(port)["replays"]
    # 3: restarted again: Spark runs batch 2 once more, which the server acknowledges without
    # applying it, then the rest
    child = run_child(tmp_path, "run3", [query("tickwire", None)])
    try:
        assert child.outcomes() == {"q": "DONE"}
    finally:
        child.stop()
    status = assert_nothing_staged(port)
    assert status["replays"] == replays + 1
    assert_each_row_once(table_rows(server, "trades"), files)


class ServerChild:
    """tests/spark_remote_child.py serve: a server with a data directory, on `port` (0: one the
    system picks; `self.port` is the one it listens on). A restart on the port its clients know
    is tried again for a while when the port cannot be listened on yet."""

    def __init__(self, tmp: Path, port: int, data: Path, n: int, retry_s: float = 20.0):
        deadline = time.monotonic() + retry_s
        for attempt in range(1, 1000):
            log = tmp / (f"server-{n}.log" if attempt == 1 else f"server-{n}-{attempt}.log")
            self.child = Child(["serve", "--port", str(port), "--data-dir", str(data)], log)
            try:
                ready = self.child.wait_for("READY", 60)
                break
            except AssertionError:
                self.child.stop()
                if not (port and port_held(self.child.tail()) and time.monotonic() < deadline):
                    raise
                time.sleep(0.5)
        self.port = int(ready.split()[1])
        assert port in (0, self.port), ready


def test_the_server_killed_between_staging_and_commit(tmp_path):
    folder = tmp_path / "in"
    files = input_files(folder)
    data = tmp_path / "data"
    marker, go = tmp_path / "held", tmp_path / "go"
    server = ServerChild(tmp_path, 0, data, 1)  # a port of its own; the restart below takes it again
    port = server.port
    query = remote_query("q", folder, tmp_path, port, "trades", fmt="tickwire_faulty", checkpoint="ck",
                         fault={"hold": {"batch": 2, "when": "before", "marker": str(marker), "go": str(go)}})
    # failed, the query is started again from its checkpoint in the same Spark application, whose
    # Python workers knew the server before its restart
    query["then"] = dict(query, name="again", format="tickwire",
                         options={k: v for k, v in query["options"].items() if k != "fault"})
    # no task retries: the restarted query's tasks must not fail for the server's restart
    child = run_child(tmp_path, "run", [query], master="local[2]")
    try:
        wait_until(marker.exists, TIMEOUT, "the commit of batch 2")
        held = json.loads(marker.read_text())
        (staged,) = staging_status(port)["batches"]
        assert (staged["producer"], staged["batch"]) == (held["producer"], 2)
        server.child.kill()
        server = ServerChild(tmp_path, port, data, 2)
        # batches 0 and 1 are back from the data directory; batch 2's staged parts are gone
        assert_each_row_once(doget(port, "trades"), files[:2])
        assert_nothing_staged(port)
        go.touch()
        failed = child.wait_for("FAILED q")
        # the query stops with the server's message ...
        message = json.loads(failed.split(" ", 2)[2])
        assert "batch 2 of producer" in message and "is not staged" in message, message
        assert held["producer"] in message
        assert_each_row_once(doget(port, "trades"), files[:2])
        # ... and restarted from its checkpoint, writes batch 2 again, then batch 3
        assert child.outcomes()["again"] == "DONE"
    finally:
        child.stop()
    try:
        status = assert_nothing_staged(port)
        assert status["committed"] == 2 and status["replays"] == 0  # batches 2 and 3, since the restart
        assert_each_row_once(doget(port, "trades"), files)
    finally:
        server.child.finish()


# ------------------------------------------------------------------------------------------------
# 3. Spark Connect
# ------------------------------------------------------------------------------------------------

def connect_unavailable() -> str | None:
    """Why pyspark's Spark Connect client cannot load here (pyspark's own message), or None."""
    try:
        from pyspark.sql.connect.utils import check_dependencies
        check_dependencies()
    except ImportError as exc:
        return str(exc)
    return None


def test_a_spark_connect_session_writes_through_the_data_source(server, tmp_path):
    reason = connect_unavailable()
    if reason is not None:
        pytest.skip(f"Spark Connect's Python client cannot load: {reason}")
    folder = tmp_path / "in"
    files = input_files(folder)
    child = run_child(tmp_path, "connect", [remote_query("q", folder, tmp_path, server.port, "trades")],
                      connect=True)
    try:
        _spark, version, session = child.wait_for("SPARK").split()
        assert version.startswith("4.") and session == "pyspark.sql.connect.session"
        assert child.outcomes() == {"q": "DONE"}
    finally:
        child.stop()
    assert_nothing_staged(server.port)
    assert_each_row_once(table_rows(server, "trades"), files)


# ------------------------------------------------------------------------------------------------
# 4. stopping a query: nothing a user reads as a failure
# ------------------------------------------------------------------------------------------------

NOISE = ("Exception", "Traceback", "Abort", "abort", "leaked", "ERROR")


def test_a_query_stopped_mid_upload_or_mid_commit_prints_nothing(server, tmp_path):
    """`StreamingQuery.stop()` interrupts the batch that runs: here once while its tasks upload
    (Spark kills them: "Aborting task" with the TaskKilledException's stack, "Aborting commit for
    partition", "Data source write support ... is aborting") and once while the driver commits it
    (the commit, held until the query is marked stopped, ends in the interrupted thread; PySpark's
    accumulator server may then print an EOFError); and SparkSession.stop() may then log the late status update of a
    killed task ("Exception in statusUpdate"). With spark_session's quiet logging, the default, the child's stderr
    says none of it, while other ERRORs of the same JVM loggers still show."""
    folder = tmp_path / "in"
    input_files(folder)
    stalled, held, go = tmp_path / "stalled", tmp_path / "held", tmp_path / "go"
    queries = [
        dict(remote_query("mid_upload", folder, tmp_path, server.port, "t1", fmt="tickwire_faulty",
                          fault={"stall": {"batch": 0, "marker": str(stalled)}}), stop_on=str(stalled)),
        dict(remote_query("mid_commit", folder, tmp_path, server.port, "t2", fmt="tickwire_faulty",
                          fault={"hold": {"batch": 0, "when": "before", "marker": str(held), "go": str(go)}}),
             stop_on=str(held), go_on_stop=str(go)),
    ]
    shown = "tickwire test: an error that is shown"
    scheduler = "org.apache.spark.scheduler.TaskSchedulerImpl"
    # the line a task killed by the stop logs when its status arrives after SparkSession.stop()
    # began (the race cannot be forced here: it is logged as Spark logs it), and another error of
    # the same logger, which shows
    late, other = "Exception in statusUpdate", "tickwire test: another scheduler error"
    spec = tmp_path / "stops.json"
    spec.write_text(json.dumps({"queries": queries, "log_error": shown,
                                "log_lines": [[scheduler, late], [scheduler, other]]}))
    child = Child(["run", str(spec)], tmp_path / "stops.log")
    try:
        child.wait_for("ALL-DONE")
        assert child.finish() == 0, child.tail()
    finally:
        child.stop()
    assert [ln for ln in child.seen if ln.startswith("STOPPED")] == ["STOPPED mid_upload", "STOPPED mid_commit"]
    assert stalled.exists() and held.exists()  # each query was stopped where it was meant to be
    log = (tmp_path / "stops.log").read_text(errors="replace")
    assert shown in log and other in log, log[-3000:]
    assert late not in log, log[-3000:]
    noise = [ln for ln in log.splitlines() if shown not in ln and other not in ln and any(word in ln for word in NOISE)]
    assert not noise, "\n".join(noise[:20]) + "\n--- the child's stderr ends:\n" + log[-3000:]


def test_the_accumulator_servers_eof_is_logged_not_printed(capsys, caplog):
    """PySpark's accumulator server (a socketserver in the driver's Python process) raises EOFError
    when the JVM's end of its connection closes (the JVM's thread sending an update was
    interrupted, as a stopped query's is, or the JVM exited), and socketserver prints it with its
    traceback. spark_session has it logged at DEBUG instead."""
    import logging
    import socket
    from types import SimpleNamespace

    from pyspark.accumulators import _start_update_server

    from tickwire.server.adapters.spark.launch import quiet_accumulator_server

    token = "t" * 16
    server = _start_update_server(token, False)

    def connect_and_close() -> None:  # authenticated, then gone before an update
        with socket.create_connection(server.server_address[:2]) as s:
            s.sendall(token.encode())

    err: list[str] = []

    def printed():  # socketserver's report: a traceback between two lines of dashes
        err.append(capsys.readouterr().err)
        return "".join(err) if "".join(err).count("-" * 40) >= 2 else None

    try:
        connect_and_close()
        text = wait_until(printed, 30, "socketserver's traceback")
        assert "EOFError" in text and "Traceback" in text  # what a user saw
        quiet_accumulator_server(SimpleNamespace(sparkContext=SimpleNamespace(_accumulatorServer=server)))
        with caplog.at_level(logging.DEBUG, logger="tickwire.server.adapters.spark.launch"):
            connect_and_close()
            record = wait_until(lambda: next((r for r in caplog.records if "accumulator server" in r.message), None),
                                30, "the DEBUG record")
        assert record.levelno == logging.DEBUG and record.exc_info and record.exc_info[0] is EOFError
        assert capsys.readouterr().err == ""
    finally:
        server.shutdown()
