"""History plus live (tickwire.server.engine.storage.history, .parquet): a Hive-partitioned Parquet
dataset served as one table with the rows written after it, read per row group on demand; local
and on an S3-compatible store (moto's server, started here on loopback)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.harness import Services
from tests.serving import serve_process
from tickwire.server.engine import Engine
from tickwire.server.engine.storage.history import INTRADAY_BASE, HistoryTable
from tickwire.server.engine.storage.parquet import REGION_BITS, HistoryError, LocationIndex, ParquetRows, open_uri

DATES = ["2026-11-18", "2026-11-19", "2026-11-20"]
ROWS_PER_DATE = 1000
ROW_GROUP = 100
DATA_SCHEMA = pa.schema([("Sym", pa.string()), ("Px", pa.float64()), ("Qty", pa.int64())])


def day(i: int) -> pa.Table:
    """The rows of date i: Qty numbers every row of the dataset."""
    q = np.arange(i * ROWS_PER_DATE, (i + 1) * ROWS_PER_DATE, dtype=np.int64)
    return pa.table({"Sym": pa.array(np.array(["A", "B", "C", "D"])[q % 4]), "Px": q * 0.5, "Qty": q},
                    schema=DATA_SCHEMA)


def write_dataset(root: str, fs: pafs.FileSystem = None, dates=DATES) -> None:
    """Date=.../part-0.parquet per date (as Spark's partitionBy("Date") lays it out), 100-row row groups,
    written in reverse date order (the table orders locations by partition value)."""
    fs = fs or pafs.LocalFileSystem()
    for i in reversed(range(len(dates))):
        folder = f"{root}/Date={dates[i]}"
        fs.create_dir(folder, recursive=True)
        with fs.open_output_stream(f"{folder}/part-0.parquet") as out:
            pq.write_table(day(i), out, row_group_size=ROW_GROUP)
    with fs.open_output_stream(f"{root}/_SUCCESS") as out:  # what Spark leaves: not a location
        out.write(b"")


def expected_history() -> pa.Table:
    parts = [day(i).add_column(0, "Date", pa.array([d] * ROWS_PER_DATE)) for i, d in enumerate(DATES)]
    return pa.concat_tables(parts)


@pytest.fixture()
def dataset(tmp_path) -> str:
    root = str(tmp_path / "trades")
    write_dataset(root)
    return root


def test_history_is_one_table_in_partition_order_with_a_key_region_per_location(dataset):
    engine = Engine()
    t = engine.history("trades", dataset)
    assert isinstance(t, HistoryTable)
    # as Deephaven's parquet.read of the same files: the partition column first, a string, marked
    assert t.schema.names == ["Date", "Sym", "Px", "Qty"] and t.schema.field("Date").type == pa.string()
    assert t.schema.field("Date").metadata == {b"deephaven:isPartitioning": b"true"}
    assert t.size == 3 * ROWS_PER_DATE
    ranges = t.rowset.ranges().tolist()
    assert ranges == [[i << REGION_BITS, (i << REGION_BITS) + ROWS_PER_DATE - 1] for i in range(3)]
    # opening reads metadata only
    assert t.history.stats.chunks_read == 0
    assert t.gather().equals(expected_history())


def test_a_middle_viewport_reads_only_the_row_groups_and_columns_it_shows(dataset):
    engine = Engine()
    t = engine.history("trades", dataset)
    keys = t.rowset.select(np.arange(1450, 1460))  # date 1, rows 450..459: one row group
    got = t.gather(["Qty", "Date"], keys)
    assert got.column("Qty").to_pylist() == list(range(1450, 1460))
    assert got.column("Date").to_pylist() == [DATES[1]] * 10
    assert t.history.stats.reads == [(1, 4)] and t.history.stats.chunks_read == 1  # Qty of one row group
    keys = t.rowset.select(np.arange(995, 1005))  # across two locations
    got = t.gather(["Qty"], keys)
    assert got.column("Qty").to_pylist() == list(range(995, 1005))
    assert t.history.stats.reads == [(0, 9), (1, 0)]
    again = t.history.stats.chunks_read
    t.gather(["Qty"], keys)
    assert t.history.stats.chunks_read == again  # the cache answered
    # keys in any order come back in that order
    shuffled = keys[::-1].copy()
    assert t.gather(["Qty"], shuffled).column("Qty").to_pylist() == list(range(1004, 994, -1))


def test_text_is_decoded_only_for_the_rows_gathered_until_most_of_a_row_group_is(dataset):
    """Text columns are read dictionary-encoded: a viewport's few rows are decoded alone; a gather
    of most of a row group (a DoGet) decodes it once and the cache keeps it decoded."""
    engine = Engine()
    t = engine.history("trades", dataset)
    few = t.gather(["Sym"], t.rowset.select(np.arange(1450, 1455)))
    assert few.schema.field("Sym").type == pa.string()
    assert few.column("Sym").to_pylist() == ["C", "D", "A", "B", "C"]
    cached = t.history._cache[(1, 4, "Sym")]  # noqa: SLF001 - what the cache holds is the point
    assert pa.types.is_dictionary(cached.type)
    most = t.gather(["Sym"], t.rowset.select(np.arange(1400, 1500)))
    assert most.column("Sym").to_pylist() == ["A", "B", "C", "D"] * 25
    assert t.history._cache[(1, 4, "Sym")].type == pa.string()  # noqa: SLF001
    assert t.history.stats.chunks_read == 1  # read once
    assert t.gather().equals(expected_history().cast(t.schema))


def test_the_cache_stays_within_its_bound(dataset):
    engine = Engine()
    t = engine.history("trades", dataset, cache_bytes=4000)  # about five 100-row int64 chunks
    for start in range(0, 3000, 100):
        t.gather(["Qty"], t.rowset.select(np.arange(start, start + 10)))
        assert t.history.cached_bytes() <= 4000
    assert t.history.stats.chunks_read == 30
    assert t.gather(["Qty"]).column("Qty").to_pylist() == list(range(3000))  # still all readable


def test_rows_written_afterwards_are_the_live_tail(dataset):
    engine = Engine()
    t = engine.history("trades", dataset)
    seen = []
    t.listeners.append(lambda table, up, step: seen.append(up))
    live = day(3).slice(0, 5).append_column("Date", pa.array(["2026-11-21"] * 5))
    engine.write(t, live)
    engine.run_cycle()
    assert t.size == 3 * ROWS_PER_DATE + 5
    assert seen and seen[-1].added.ranges().tolist() == [[INTRADAY_BASE, INTRADAY_BASE + 4]]
    assert seen[-1].removed.is_empty() and seen[-1].shifted.is_empty()
    assert t.gather().equals(pa.concat_tables([expected_history(), live.select(t.schema.names)]))
    tail = t.gather(["Qty", "Date"], t.rowset.select(np.arange(2998, 3002)))
    assert tail.column("Qty").to_pylist() == [2998, 2999, 3000, 3001]
    assert tail.column("Date").to_pylist() == [DATES[2]] * 2 + ["2026-11-21"] * 2


def test_a_where_on_the_partition_column_reads_no_parquet_data_and_follows_the_live_rows(dataset):
    engine = Engine()
    t = engine.history("trades", dataset)
    w = t.where(pc.field("Date") >= "2026-11-19")
    assert t.history.stats.chunks_read == 0  # pruned by the locations' partition values
    assert w.size == 2 * ROWS_PER_DATE
    assert w.rowset.ranges().tolist()[0] == [1 << REGION_BITS, (1 << REGION_BITS) + ROWS_PER_DATE - 1]
    live = day(3).slice(0, 4).append_column("Date", pa.array(["2026-11-17", "2026-11-21", "2026-11-21", "2026-11-10"]))
    engine.write(t, live)
    engine.run_cycle()
    assert w.size == 2 * ROWS_PER_DATE + 2
    got = w.gather(["Qty", "Date"])
    assert got.column("Qty").to_pylist() == list(range(1000, 3000)) + [3001, 3002]
    # a filter on another column reads that column (every row group of it), and only it
    before = t.history.stats.chunks_read
    v = t.where(pc.field("Qty") < 3)
    assert v.gather(["Qty"]).column("Qty").to_pylist() == [0, 1, 2]
    assert t.history.stats.chunks_read - before == 10  # date 0's Qty chunks; the rest were cached
    # an empty selection of locations
    assert t.where(pc.field("Date") == "1999-01-01").size == 0


def test_the_location_index_spares_footers_and_follows_the_files(dataset, tmp_path):
    index = LocationIndex(str(tmp_path / "index.json"))
    fs, root = open_uri(dataset)
    schema, locations, read = index.open(fs, root)
    assert read == 3 and [dict(loc.partition)["Date"] for loc in locations] == DATES
    assert [loc.row_groups for loc in locations] == [(ROW_GROUP,) * 10] * 3
    _, again, read = index.open(fs, root)
    assert read == 0 and again == locations
    # a new date: only its footer is read; the index is rebuilt from the files when lost
    folder = Path(dataset) / "Date=2026-11-21"
    folder.mkdir()
    pq.write_table(day(3).slice(0, 250), folder / "part-0.parquet", row_group_size=ROW_GROUP)
    _, locs, read = index.open(fs, root)
    assert read == 1 and [loc.num_rows for loc in locs] == [1000, 1000, 1000, 250]
    os.remove(index.path)
    _, rebuilt, read = index.open(fs, root)
    assert read == 4 and rebuilt == locs
    engine = Engine()
    with pytest.raises(HistoryError, match="cannot list|no Parquet files"):
        engine.history("empty", str(tmp_path / "nothing-here"))


def test_clients_snapshot_and_subscribe_to_a_viewport_of_history_plus_live(dataset):
    with Services() as s:
        t = s.engine.history("trades", dataset)
        c = s.client()
        assert "trades" in c.tables()
        whole = c.snapshot("trades")
        assert whole.num_rows == 3000 and whole.column("Qty").to_pylist() == list(range(3000))
        t.history.stats.reads = []
        part = c.snapshot("trades", columns=["Qty", "Date"], viewport=[(1500, 1509)])
        assert part.column("Qty").to_pylist() == list(range(1500, 1510))
        sub = c.subscribe("trades", viewport=[(0, 4)], reverse=True, columns=["Qty", "Date"])
        it = sub.updates(timeout=30)
        assert next(it).is_snapshot
        assert sub.table.column("Qty").to_pylist() == list(range(2995, 3000))
        s.engine.write(t, day(3).slice(0, 3).append_column("Date", pa.array(["2026-11-21"] * 3)))
        s.cycle()
        next(it)
        assert sub.size == 3003
        assert sub.table.column("Qty").to_pylist() == [2998, 2999, 3000, 3001, 3002]


def _lock_is_free(lock) -> bool:
    """Whether another thread could take `lock` now (an RLock held by the caller's own thread counts as held)."""
    got = []

    def probe():
        ok = lock.acquire(blocking=False)
        got.append(ok)
        if ok:
            lock.release()

    th = threading.Thread(target=probe)
    th.start()
    th.join()
    return got[0]


def test_a_doget_of_a_whole_history_reads_it_a_piece_at_a_time_outside_the_lock(dataset, monkeypatch):
    """Memory follows a piece, not the table; the graph's lock is not held while Parquet is read;
    rows written after the DoGet began are not in it (its rows are those of one step)."""
    with Services(doget_piece_rows=700) as s:
        t = s.engine.history("trades", dataset)
        s.engine.write(t, day(3).slice(0, 5).append_column("Date", pa.array(["2026-11-21"] * 5)))
        s.cycle()
        sizes, free = [], []
        real = ParquetRows.gather

        def spy(self, keys, columns=None):
            sizes.append(len(keys))
            free.append(_lock_is_free(s.engine.graph.lock))
            if len(sizes) == 2:  # mid-DoGet: a write and a cycle go through
                s.engine.write(t, day(3).slice(5, 5).append_column("Date", pa.array(["2026-11-21"] * 5)))
                s.cycle()
            return real(self, keys, columns)

        monkeypatch.setattr(ParquetRows, "gather", spy)
        got = s.doget(b"s/trades")
        assert sizes == [700, 700, 700, 700, 200]
        assert free == [True] * 5
        assert got.num_rows == 3005 and got.column("Qty").to_pylist() == list(range(3005))
        assert got.slice(0, 3000).equals(expected_history())
        assert t.size == 3010
        # a where on the partition column streams its locations the same way, its live rows after them
        t.where(pc.field("Date") >= "2026-11-19", name="recent")
        sizes.clear()
        got = s.doget(b"s/recent")
        assert sizes == [700, 700, 600]
        assert got.column("Qty").to_pylist() == list(range(1000, 3010))
        # a small table is read under the lock in one piece, as before
        t.where(pc.field("Qty") < 500, name="first")
        sizes.clear()
        free.clear()
        got = s.doget(b"s/first")
        assert got.column("Qty").to_pylist() == list(range(500)) and sizes == [500] and free == [False]


def _free_port() -> int:
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        return int(sk.getsockname()[1])


@pytest.fixture()
def s3(monkeypatch):
    """moto's S3-compatible server on loopback, with the AWS_* variables pointing at it."""
    from moto.server import ThreadedMotoServer  # the test extra's moto[server]

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
                 "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():
        monkeypatch.setenv(k, v)
    fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http", access_key="testing",
                           secret_key="testing", region="us-east-1", allow_bucket_creation=True)
    fs.create_dir("history")  # the bucket
    try:
        yield fs
    finally:
        server.stop()


def test_history_on_an_s3_compatible_store(s3):
    write_dataset("history/trades", s3)
    engine = Engine()
    t = engine.history("trades", "s3://history/trades")  # endpoint and credentials from AWS_*
    assert t.size == 3000 and t.history.stats.chunks_read == 0
    got = t.gather(["Qty", "Date"], t.rowset.select(np.arange(2100, 2105)))
    assert got.column("Qty").to_pylist() == list(range(2100, 2105))
    assert got.column("Date").to_pylist() == [DATES[2]] * 5
    assert t.history.stats.reads == [(2, 1)]
    assert t.where(pc.field("Date") == DATES[0]).gather(["Qty"]).column("Qty").to_pylist() == list(range(1000))


ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=30)


def doget_until(client: fl.FlightClient, done=lambda t: True) -> pa.Table:
    """A DoGet of s/trades, again until `done(table)` (30 s only stop a hang); the last one."""
    deadline = time.monotonic() + 30
    while True:
        got = client.do_get(fl.Ticket(b"s/trades"), options=ANON).read_all()
        if done(got) or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def doget_once(port: int) -> pa.Table:
    client = fl.connect(f"grpc://127.0.0.1:{port}")
    try:
        return doget_until(client)
    finally:
        client.close()


def merge_command(data_dir: Path, date: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tickwire", "merge", "--data-dir", str(data_dir), "--table", "trades",
                           "--date", date], capture_output=True, text=True, timeout=120)


def test_serve_history_flag_serves_the_dataset_and_doput_appends_to_it(dataset, tmp_path):
    args = ("--no-web", "--history", f"trades={dataset}", "--data-dir", str(tmp_path / "data"))
    with serve_process(*args) as port:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        got = doget_until(client)
        assert got.num_rows == 3000 and got.column("Qty").to_pylist() == list(range(3000))
        live = day(3).slice(0, 7).append_column("Date", pa.array(["2026-11-21"] * 7))
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "trades"), live.schema, ANON)
        writer.write_table(live)
        writer.close()
        got = doget_until(client, lambda t: t.num_rows == 3007)
        assert got.column("Qty").to_pylist() == list(range(3007))
        assert got.column("Date").to_pylist()[-1] == "2026-11-21"
        client.close()
    with serve_process(*args) as port:  # the same command again: the written rows are back after the history
        assert doget_once(port).equals(got)
    # the merge, with no server running: the written rows become a location of the dataset
    merged = merge_command(tmp_path / "data", "2026-11-21")
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.startswith("merged 7 rows of trades with 2026-11-21 into ")
    assert list(Path(dataset, "Date=2026-11-21").glob("part-merged-*.parquet"))
    with serve_process(*args) as port:
        assert doget_once(port).equals(got)
    again = merge_command(tmp_path / "data", "2026-11-21")
    assert again.returncode == 1 and "no intraday rows with Date=2026-11-21" in again.stderr


def test_history_flags_are_checked():
    from tickwire.options import ConfigError, parse_history

    assert parse_history("a=/x, b=s3://bkt/p?scheme=http") == [("a", "/x"), ("b", "s3://bkt/p?scheme=http")]
    assert parse_history("Market/trades") == [("Market/trades", "")]  # its own locations
    for bad in ("a=", "=/x"):
        with pytest.raises(ConfigError, match="NAME=URI"):
            parse_history(bad)
    with pytest.raises(ConfigError, match="twice: a"):
        parse_history("a=/x,a=/y")


@pytest.mark.parametrize("checkpoint_cycles", [10_000, 3])
def test_intraday_rows_of_a_history_table_survive_a_restart(dataset, tmp_path, checkpoint_cycles):
    """With a data directory the live tail is journaled (and checkpointed without the history) and
    comes back into the history table when it is made again before the directory opens."""
    from tickwire.server.engine import Durability, EngineConfig

    data_dir = tmp_path / "data"
    config = EngineConfig(interval_ms=3_600_000, data_dir=data_dir,
                          durability=Durability(checkpoint_cycles=checkpoint_cycles))
    engine = Engine(config)
    t = engine.history("trades", dataset)
    engine.open()  # as `tickwire serve --data-dir D --history trades=...` starts
    assert t.journaled
    for c in range(7):
        rows = day(3).slice(10 * c, 10).append_column("Date", pa.array(["2026-11-21"] * 10))
        engine.write(t, rows, batch_id=("b", c), wait=False)
        engine.run_cycle()
    engine.storage.wait_checkpoints()
    checkpoints = sorted((engine.storage.table_dir("trades") / "checkpoints").glob("*.parquet"))
    assert bool(checkpoints) == (checkpoint_cycles == 3)
    for path in checkpoints:
        assert pq.read_metadata(path).num_rows <= 70  # intraday rows only, never the history
    before = t.gather()
    engine.close_storage()
    assert (data_dir / "history" / "trades.json").is_file()  # the location index lives in the data directory

    engine2 = Engine(config)
    t2 = engine2.history("trades", dataset)
    recovered = engine2.open().recovered
    assert [x.name for x in recovered] == ["trades"] and recovered[0] is t2
    assert t2.size == 3070 and t2.gather().equals(before)
    assert t2.has_batch(("b", 6))
    engine2.write(t2, day(3).slice(70, 5).append_column("Date", pa.array(["2026-11-21"] * 5)), wait=False)
    engine2.run_cycle()
    assert t2.gather(["Qty"], t2.rowset.select(np.arange(3068, 3075))).column("Qty").to_pylist() == \
        list(range(3068, 3075))
    engine2.close_storage()


# -- the merge --------------------------------------------------------------------------------------------
def _durable(dataset, data_dir):
    from tickwire.server.engine import Durability, EngineConfig

    engine = Engine(EngineConfig(interval_ms=3_600_000, data_dir=data_dir, durability=Durability()))
    table = engine.history("trades", dataset)
    engine.open()
    return engine, table


def _live(first: int, n: int, date: str) -> pa.Table:
    return day(3).slice(first, n).append_column("Date", pa.array([date] * n))


def test_a_merge_turns_a_dates_intraday_rows_into_a_location_with_one_update(dataset, tmp_path):
    from tickwire.server.engine.storage.merge import MergeError

    engine, t = _durable(dataset, tmp_path / "data")
    engine.write(t, _live(0, 40, "2026-11-21"), wait=False)
    engine.write(t, _live(40, 10, "2026-11-22"), wait=False)
    engine.run_cycle()
    engine.write(t, _live(50, 5, "2026-11-21"), wait=False)
    engine.run_cycle()
    before = t.gather()
    seen = []
    t.listeners.append(lambda table, up, step: seen.append(up))
    steps = []
    result = engine.merge("trades", "2026-11-21", on_step=steps.append)
    assert steps == ["selected", "writing", "written", "validated", "renamed", "indexed", "adopted", "done"]
    assert result.rows == 45 and os.path.basename(result.path).startswith("part-merged-")
    assert len(seen) == 1 and len(seen[0].removed) == 45 and len(seen[0].added) == 45
    # the same rows: the merged date now comes before the other intraday rows
    assert t.size == 3055 and sorted(t.gather(["Qty"]).column("Qty").to_pylist()) == \
        sorted(before.column("Qty").to_pylist())
    assert t.gather(["Date"]).column("Date").to_pylist()[3000:3046] == ["2026-11-21"] * 45 + ["2026-11-22"]
    assert len(t.history.locations) == 4 and t.intraday_rows.size == 10
    # the location is a Parquet file of the dataset, as any reader sees it
    assert pq.read_table(result.path).column("Qty").to_pylist() == list(range(3000, 3040)) + list(range(3050, 3055))
    with pytest.raises(MergeError, match="no intraday rows"):
        engine.merge("trades", "2026-11-21")
    with pytest.raises(MergeError, match="comes before the last historical location"):
        engine.merge("trades", "2026-11-20")
    engine.close_storage()
    # after a restart: the location from the files, the rest of the intraday rows from the checkpoint
    engine2, t2 = _durable(dataset, tmp_path / "data")
    assert t2.size == 3055 and len(t2.history.locations) == 4 and t2.intraday_rows.size == 10
    assert sorted(t2.gather(["Qty"]).column("Qty").to_pylist()) == list(range(3055))
    engine2.close_storage()


def test_a_merge_that_fails_leaves_the_intraday_rows_served_and_says_why(dataset, tmp_path, monkeypatch):
    from tickwire.server.engine.storage import merge as M

    engine, t = _durable(dataset, tmp_path / "data")
    engine.write(t, _live(0, 20, "2026-11-21"), wait=False)
    engine.run_cycle()
    real = M.checksum
    calls = []

    def corrupt(table):  # the read-back differs from what was written
        calls.append(1)
        return real(table) if len(calls) == 1 else "0" * 64

    monkeypatch.setattr(M, "checksum", corrupt)
    with pytest.raises(M.MergeError, match="reads back"):
        engine.merge("trades", "2026-11-21")
    assert t.size == 3020 and len(t.history.locations) == 3
    assert not os.path.exists(M.record_path(t))
    assert not list(Path(dataset, "Date=2026-11-21").glob("*"))  # the temporary file is gone
    monkeypatch.setattr(M, "checksum", real)
    assert engine.merge("trades", "2026-11-21").rows == 20
    engine.close_storage()


class _Crash(BaseException):
    pass


@pytest.mark.parametrize("at", ["selected", "writing", "written", "validated", "renamed", "indexed", "adopted"])
def test_a_merge_cut_short_at_any_step_serves_every_row_exactly_once_after_a_restart(dataset, tmp_path, at):
    """The process's state is what is on disk when a crash stops the merge at `at` (the in-process
    engine is dropped without closing its journals, as SIGKILL leaves them; test_history_crash.py
    kills a real server)."""
    engine, t = _durable(dataset, tmp_path / "data")
    engine.write(t, _live(0, 30, "2026-11-21"), wait=False)
    engine.write(t, _live(30, 5, "2026-11-22"), wait=False)
    engine.run_cycle()
    assert engine.storage.wait_durable()  # acknowledged: on disk

    def crash(step):
        if step == at:
            raise _Crash(step)

    with pytest.raises(_Crash):
        engine.merge("trades", "2026-11-21", on_step=crash)
    engine2, t2 = _durable(dataset, tmp_path / "data")
    qty = t2.gather(["Qty"]).column("Qty").to_pylist()
    assert sorted(qty) == list(range(3035)), at  # every row once
    merged = at in ("renamed", "indexed", "adopted")
    assert len(t2.history.locations) == (4 if merged else 3)
    assert t2.intraday_rows.size == (5 if merged else 35)
    assert not list(Path(dataset).rglob(".merging-*"))
    engine2.close_storage()


@pytest.mark.parametrize("at", ["selected", "writing", "renamed", "indexed"])
def test_sigkill_during_a_merge_then_a_restarted_server_serves_every_row_once(dataset, tmp_path, at):
    """Before the write, mid-write, after the write before the index, after the index before the
    intraday rows are dropped: a real process killed there, then `tickwire serve` on its data
    directory, read by DoGet as a reconnecting client would."""
    data_dir = tmp_path / "data"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "tests.history_merge_child", dataset, str(data_dir), at],
                          capture_output=True, text=True, timeout=120, cwd=root)
    assert proc.returncode == -9 and f"AT {at}" in proc.stdout, proc.stdout + proc.stderr
    with serve_process("--no-web", "--history", f"trades={dataset}", "--data-dir", str(data_dir)) as port:
        got = doget_once(port)
    assert sorted(got.column("Qty").to_pylist()) == list(range(3035))
    merged = at in ("renamed", "indexed")
    dates = got.column("Date").to_pylist()
    assert dates[3000:3030] == ["2026-11-21"] * 30 and dates[3030:] == ["2026-11-22"] * 5
    assert bool(list(Path(dataset, "Date=2026-11-21").glob("part-merged-*"))) == merged
    assert not list(Path(dataset).rglob(".merging-*"))


def test_refresh_adds_the_dates_a_batch_job_wrote_since_as_locations_after_the_others(dataset):
    engine = Engine()
    t = engine.history("trades", dataset)
    seen = []
    t.listeners.append(lambda table, up, step: seen.append(up))
    assert engine.refresh_history("trades") == []
    for date, i in (("2026-11-21", 3), ("2026-11-10", 4)):  # a new date, and a late one for an old date
        folder = Path(dataset) / f"Date={date}"
        folder.mkdir()
        pq.write_table(day(i).slice(0, 100), folder / "part-0.parquet", row_group_size=ROW_GROUP)
    added = engine.refresh_history("trades")
    assert [Path(p).parent.name for p in added] == ["Date=2026-11-21"]
    assert len(seen) == 1 and len(seen[-1].added) == 100 and seen[-1].removed.is_empty()
    assert t.size == 3100 and t.gather(["Qty"]).column("Qty").to_pylist()[-100:] == list(range(3000, 3100))
    assert engine.refresh_history("trades") == []  # nothing new (the late one waits for a restart)
    again = Engine().history("trades", dataset)
    assert again.size == 3200 and again.gather(["Date"]).column("Date").to_pylist()[0] == "2026-11-10"


def test_serve_history_refresh_serves_a_new_date_while_it_runs(dataset):
    with serve_process("--no-web", "--history", f"trades={dataset}", "--history-refresh", "0.2") as port:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        assert doget_until(client).num_rows == 3000
        folder = Path(dataset) / "Date=2026-11-21"
        folder.mkdir()
        pq.write_table(day(3).slice(0, 50), folder / ".part-0.tmp", row_group_size=ROW_GROUP)
        os.replace(folder / ".part-0.tmp", folder / "part-0.parquet")  # whole, as a batch job commits it
        got = doget_until(client, lambda t: t.num_rows == 3050)
        assert got.column("Qty").to_pylist() == list(range(3050))
        client.close()


def test_a_namespaced_table_is_an_application_field_of_its_namespace(dataset, tmp_path):
    """"Market/trades": a field `trades` of application `Market` (ticket a/Market/f/trades), as
    Deephaven's clients reach an application's tables; the scope ticket s/Market/trades works too."""
    from tickwire.server.services.application_service import ApplicationService

    with Services() as s:
        s.engine.history("Market/trades", dataset)
        c = s.client()
        via_app = c.snapshot(b"a/Market/f/trades", viewport=[(0, 2)])
        via_scope = c.snapshot(b"s/Market/trades", viewport=[(0, 2)])
        assert via_app.column("Qty").to_pylist() == via_scope.column("Qty").to_pylist() == [0, 1, 2]
        with pytest.raises(Exception, match="no application 'Market'"):
            c.snapshot(b"a/Market/f/nothing")
    f = ApplicationService._field("Market/trades")
    assert (f.application_id, f.application_name, f.field_name) == ("Market", "Market", "trades")
    assert f.typed_ticket.ticket.ticket == b"a/Market/f/trades" and f.typed_ticket.type == "Table"
    plain = ApplicationService._field("trades")
    assert (plain.application_id, plain.typed_ticket.ticket.ticket) == ("scope", b"s/trades")
    # its location index in a data directory: one file, the name quoted
    from tickwire.server.engine.core import history_index_path
    assert history_index_path(tmp_path, "Market/trades").name == "Market%2Ftrades.json"


# -- tickwire's own locations: the Systems tree of the data directory --------------------------------------
def _rows(date: str, first: int, n: int) -> pa.Table:
    return pa.table({"Qty": pa.array(range(first, first + n), pa.int64()), "Date": [date] * n})


def _own(data_dir: Path):
    from tickwire.server.engine import Engine, EngineConfig

    engine = Engine(EngineConfig(interval_ms=3_600_000, data_dir=data_dir))
    table = engine.history("Market/trades")  # before the data directory opens, as the server does
    engine.open()
    return engine, table


def test_own_locations_live_in_the_seeds_systems_tree_and_come_back(tmp_path):
    """A history table named without a URI keeps its locations under the data directory's
    Systems/<namespace>: Partitions/<internal partition>/<Date>/<table>/table.parquet, the writable
    partition linked from WritablePartitions, the location index in MetadataIndex/<table>.tlmi.
    Its first write makes it (the Date column first, a partitioning column); a merge moves a date's
    rows into a location; a restart, and a lost index, bring back the same rows; every internal
    partition is read."""
    from tickwire.server.engine.ingest import Destination
    from tickwire.server.engine.storage.merge import MergeError

    data_dir = tmp_path / "data"
    engine, table = _own(data_dir)
    assert table is None  # nothing yet: made by the first write
    table = engine.destination_table(Destination("Market/trades", "append"), _rows("x", 0, 1).schema)
    assert table.schema.names == ["Date", "Qty"]
    assert table.schema.field("Date").metadata == {b"deephaven:isPartitioning": b"true"}
    engine.write(table, _rows("2026-11-20", 0, 5))
    engine.write(table, _rows("2026-11-21", 5, 3))
    engine.run_cycle()
    result = engine.merge("Market/trades", "2026-11-20")
    root = data_dir / "Systems" / "Market"
    location = root / "Partitions" / "0" / "2026-11-20" / "trades" / "table.parquet"
    assert result.rows == 5 and Path(result.path) == location and location.is_file()
    assert (root / "WritablePartitions" / "0").resolve() == (root / "Partitions" / "0").resolve()
    assert (root / "MetadataIndex" / "trades.tlmi").is_file()
    assert pq.read_table(location).column("Qty").to_pylist() == [0, 1, 2, 3, 4]
    want = engine.snapshot(table)[1]
    assert want.column("Qty").to_pylist() == list(range(8))
    assert len(table.intraday_rows) == 3  # the merged rows left the intraday part
    engine.write(table, _rows("2026-11-20", 8, 1))
    engine.run_cycle()
    with pytest.raises(MergeError, match="exists already"):
        engine.merge("Market/trades", "2026-11-20")
    engine.stop()

    engine, table = _own(data_dir)
    assert engine.snapshot(table)[1].column("Qty").to_pylist() == list(range(9))
    engine.stop()
    (root / "MetadataIndex" / "trades.tlmi").unlink()  # rebuilt from the files
    # another internal partition (a second disk, say) holding an older date
    other = root / "Partitions" / "1" / "2026-11-19" / "trades"
    other.mkdir(parents=True)
    pq.write_table(pa.table({"Qty": pa.array([-2, -1], pa.int64())}), other / "table.parquet")
    engine, table = _own(data_dir)
    got = engine.snapshot(table)[1]
    assert got.column("Qty").to_pylist() == [-2, -1] + list(range(9))
    assert got.column("Date").to_pylist()[:3] == ["2026-11-19", "2026-11-19", "2026-11-20"]
    assert (root / "MetadataIndex" / "trades.tlmi").is_file()
    engine.stop()


def test_serve_history_name_alone_then_merge_by_namespace(tmp_path):
    data_dir = tmp_path / "data"
    args = ("--no-web", "--history", "Market/trades", "--data-dir", str(data_dir))
    live = _rows("2026-11-21", 0, 4)
    with serve_process(*args) as port:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "Market/trades"), live.schema, ANON)
        writer.write_table(live)
        writer.close()
        deadline = time.monotonic() + 30
        while True:
            got = client.do_get(fl.Ticket(b"s/Market/trades"), options=ANON).read_all()
            if got.num_rows == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        client.close()
    assert got.column("Qty").to_pylist() == [0, 1, 2, 3] and got.schema.names == ["Date", "Qty"]
    merged = subprocess.run([sys.executable, "-m", "tickwire", "merge", "--data-dir", str(data_dir), "--namespace",
                             "Market", "--table", "trades", "--date", "2026-11-21"],
                            capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    assert merged.stdout.startswith("merged 4 rows of Market/trades with 2026-11-21 into ")
    assert (data_dir / "Systems/Market/Partitions/0/2026-11-21/trades/table.parquet").is_file()
    with serve_process(*args) as port:
        client = fl.connect(f"grpc://127.0.0.1:{port}")
        again = client.do_get(fl.Ticket(b"s/Market/trades"), options=ANON).read_all()
        client.close()
    assert again.column("Qty").to_pylist() == [0, 1, 2, 3]


def test_the_daily_merge_moves_the_dates_before_today_at_its_time(tmp_path):
    """--merge-at HH:MM (UTC, on the engine's clock): each day then, every history table's intraday
    dates before the day's become locations; today's rows stay intraday."""
    from tickwire.clock import ManualClock
    from tickwire.server.app import TickwireServer
    from tickwire.server.config import ServerConfig, merge_time, seconds_until
    from tickwire.server.engine import EngineConfig

    assert merge_time("18:05") == (18, 5)
    for bad in ("25:00", "7", "07:5", "ab:cd"):
        with pytest.raises(ValueError, match="HH:MM"):
            merge_time(bad)
    midnight = 1_704_067_200.0  # 2024-01-01T00:00:00Z
    assert seconds_until(midnight, 0, 30) == 1800 and seconds_until(midnight + 1800, 0, 30) == 86_400
    assert seconds_until(midnight + 3600, 0, 30) == 86_400 - 1800

    clock = ManualClock(wall=midnight)  # the server starts at midnight UTC, 2024-01-01
    engine = Engine(EngineConfig(interval_ms=10, data_dir=tmp_path / "data"), clock=clock)
    assert engine.history("Market/trades") is None
    server = TickwireServer(engine, ServerConfig(merge_at="00:30", web=False), port=0).start()
    try:
        from tickwire.server.engine import TableSpec

        table, _ = engine.get_or_create(TableSpec("Market/trades", "append", _rows("x", 0, 1).schema))
        engine.write(table, _rows("2023-12-30", 0, 2), wait=False)
        engine.write(table, _rows("2023-12-31", 2, 3), wait=False)
        engine.write(table, _rows("2024-01-01", 5, 1), wait=False)

        def advance_until(done, step: float) -> bool:
            deadline = time.monotonic() + 60
            while not done() and time.monotonic() < deadline:
                clock.advance(step)
                time.sleep(0.002)
            return bool(done())

        assert advance_until(lambda: table.size == 6, 0.01)
        assert server.daily_merges == 0 and len(table.intraday_rows) == 6
        assert advance_until(lambda: server.daily_merges == 1, 60.0)  # 00:30 passes: the merge runs
        root = tmp_path / "data" / "Systems" / "Market" / "Partitions" / "0"
        assert sorted(p.name for p in root.iterdir()) == ["2023-12-30", "2023-12-31"]
        assert len(table.intraday_rows) == 1  # today's row stays
        assert engine.snapshot(table)[1].column("Qty").to_pylist() == list(range(6))
    finally:
        server.stop()
        engine.stop()
