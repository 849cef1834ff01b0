"""Durable tables: what a cycle applied comes back after a restart, with its row keys and batch ids."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tickwire.server.engine import CatalogError, Engine, EngineConfig, IngestError, TableSpec
from tickwire.server.engine.storage.store import Durability, StorageError

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(keys, v=0.0) -> pa.Table:
    keys = np.asarray(keys, dtype=np.int64)
    return pa.table({"k": keys, "v": np.full(keys.size, v), "s": [f"s{k}" for k in keys]}, schema=SCHEMA)


def open_engine(path, **durability):
    """(an engine whose tables are durable in `path`, the tables it brought back by name); its
    cycles are run by the test."""
    engine = Engine(interval_ms=3_600_000)
    recovered = engine.open_storage(path, Durability(**durability) if durability else None)
    return engine, {t.name: t for t in recovered}


def state(engine, table) -> tuple[list, pa.Table]:
    with engine.reading():
        return table.rowset.keys().tolist(), table.gather(None)


def feed(engine, tables, cycles: int, seed: int = 0):
    """Appends, upserts with deletes and ring rows, one batch id a cycle."""
    rng = np.random.default_rng(seed)
    app, keyed, ring = tables
    for c in range(cycles):
        n = int(rng.integers(1, 50))
        base = c * 100
        engine.write(app, rows(np.arange(base, base + n), c), batch_id=("app", c), wait=False)
        up = rng.integers(0, 200, n)
        dele = rng.integers(0, 200, 5)
        engine.write(keyed, rows(up, c), delete=pa.table({"k": dele}), batch_id=("keyed", c), wait=False)
        engine.write(ring, rows(np.arange(base, base + n), c), batch_id=("ring", c), wait=False)
        engine.run_cycle()


def make_tables(engine):
    app, _ = engine.get_or_create(TableSpec("app", "append", SCHEMA))
    keyed, _ = engine.get_or_create(TableSpec("keyed", "keyed", SCHEMA, keys=("k",)))
    ring, _ = engine.get_or_create(TableSpec("ring", "ring", SCHEMA, capacity=64))
    return app, keyed, ring


@pytest.mark.parametrize("checkpoint_cycles", [10_000, 7])
def test_a_restart_brings_back_rows_row_keys_and_batch_ids(tmp_path, checkpoint_cycles):
    engine, found = open_engine(tmp_path, checkpoint_cycles=checkpoint_cycles)
    assert found == {}
    tables = make_tables(engine)
    feed(engine, tables, 30)
    engine.storage.wait_checkpoints()
    before = {t.name: state(engine, t) for t in tables}
    step = engine.step
    engine.close_storage()

    engine2, found2 = open_engine(tmp_path, checkpoint_cycles=checkpoint_cycles)
    assert set(found2) == {"app", "keyed", "ring"}
    for name, (keys, data) in before.items():
        keys2, data2 = state(engine2, found2[name])
        assert keys2 == keys, name
        assert data2.equals(data), name
    assert engine2.step == step
    # every batch id is remembered: a replayed batch is ignored
    assert engine2.write(found2["app"], rows([1]), batch_id=("app", 29), wait=False) is False
    assert engine2.write(found2["keyed"], rows([1]), batch_id=("keyed", 3), wait=False) is False
    # and the tables go on: new rows get the next row keys
    assert engine2.write(found2["app"], rows([5000]), batch_id=("app", 30), wait=False)
    engine2.run_cycle()
    assert state(engine2, found2["app"])[0][-1] == len(before["app"][0])
    if checkpoint_cycles == 7:
        ckpts = list((tmp_path / "default" / "keyed" / "checkpoints").glob("*.parquet"))
        journals = list((tmp_path / "default" / "keyed" / "intraday").glob("*/*/*.twj"))
        assert len(ckpts) == 1 and 1 <= len(journals) <= 3  # covered journals were deleted
    engine2.close_storage()


def test_the_same_input_gives_the_same_tables_with_or_without_restarts(tmp_path):
    """Restarting after every few cycles ends with what one uninterrupted run has."""
    engine, _ = open_engine(tmp_path / "a")
    tables = make_tables(engine)
    feed(engine, tables, 24, seed=5)
    want = {t.name: state(engine, t) for t in tables}
    engine.close_storage()

    rng = np.random.default_rng(5)
    path = tmp_path / "b"
    done = 0
    while done < 24:
        engine, found = open_engine(path, checkpoint_cycles=4)
        tables = (found.get("app"), found.get("keyed"), found.get("ring")) if found else make_tables(engine)
        step = min(5, 24 - done)
        # the same random stream as the uninterrupted run, cycle by cycle
        for c in range(done, done + step):
            n = int(rng.integers(1, 50))
            base = c * 100
            up = rng.integers(0, 200, n)
            dele = rng.integers(0, 200, 5)
            engine.write(tables[0], rows(np.arange(base, base + n), c), batch_id=("app", c), wait=False)
            engine.write(tables[1], rows(up, c), delete=pa.table({"k": dele}), batch_id=("keyed", c), wait=False)
            engine.write(tables[2], rows(np.arange(base, base + n), c), batch_id=("ring", c), wait=False)
            engine.run_cycle()
        done += step
        engine.storage.wait_checkpoints()
        engine.close_storage()
    engine, found = open_engine(path)
    for name, (keys, data) in want.items():
        keys2, data2 = state(engine, found[name])
        assert data2.equals(data), name
        if name != "keyed":
            assert keys2 == keys, name
        else:
            assert keys2 == keys, "keyed row keys come back exactly"
    engine.close_storage()


def test_a_torn_last_record_is_dropped_and_the_rest_kept(tmp_path):
    engine, _ = open_engine(tmp_path)
    app, _k, _r = make_tables(engine)
    for c in range(3):
        engine.write(app, rows([c]), batch_id=("b", c), wait=False)
        engine.run_cycle()
    engine.close_storage()
    journal = next((tmp_path / "default" / "app" / "intraday").glob("*/*/journal-*.twj"))
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 10])  # the last record cut short, as by a crash
    engine2, found = open_engine(tmp_path)
    keys, t = state(engine2, found["app"])
    assert t.column("k").to_pylist() == [0, 1]
    # the torn record's batch id was never applied: it may come again
    assert engine2.write(found["app"], rows([2]), batch_id=("b", 2), wait=False) is True
    engine2.close_storage()


def test_a_corrupt_checkpoint_names_the_file_and_other_tables_serve(tmp_path):
    engine, _ = open_engine(tmp_path, checkpoint_cycles=2)
    tables = make_tables(engine)
    feed(engine, tables, 6)
    engine.storage.wait_checkpoints()
    engine.close_storage()
    ckpt = next((tmp_path / "default" / "keyed" / "checkpoints").glob("*.parquet"))
    ckpt.write_bytes(b"PAR1 not really parquet")
    engine2, found = open_engine(tmp_path)
    assert set(found) == {"app", "ring"}
    assert str(ckpt) in engine2.storage.errors["keyed"]
    with pytest.raises(CatalogError, match="checkpoint-"):
        engine2.get_or_create(TableSpec("keyed", "keyed", SCHEMA, keys=("k",)))
    engine2.write(found["app"], rows([99_999]), wait=False)
    engine2.run_cycle()
    assert 99_999 in state(engine2, found["app"])[1].column("k").to_pylist()
    engine2.close_storage()


def test_an_unwritable_directory_is_a_clear_error(tmp_path):
    if os.geteuid() == 0:
        target = tmp_path / "file"
        target.write_text("x")  # a file where the directory should be: even root cannot write there
        where = target / "sub"
    else:
        where = tmp_path / "ro"
        where.mkdir()
        where.chmod(0o500)
    engine = Engine(interval_ms=3_600_000)
    with pytest.raises(StorageError, match=str(where) if os.geteuid() != 0 else "sub"):
        engine.open_storage(where)


@pytest.fixture()
def tiny_disk(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode().strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_refuses_writes_keeps_what_was_acknowledged_and_other_tables_go_on(tmp_path, tiny_disk):
    engine = Engine(interval_ms=5)
    engine.open_storage(tiny_disk / "data")
    engine.start()
    full, _ = engine.get_or_create(TableSpec("full", "append", SCHEMA))
    other, _ = engine.get_or_create(TableSpec("other", "append", SCHEMA, durable=False))
    acknowledged = 0
    with pytest.raises(IngestError, match="could not be written") as exc:
        for c in range(1000):
            engine.write(full, rows(np.arange(c * 1000, c * 1000 + 1000)), batch_id=("f", c))  # waits for the disk
            acknowledged += 1000
    assert "journal-" in str(exc.value) and exc.value.code == "UNAVAILABLE"
    assert acknowledged > 0
    with pytest.raises(IngestError, match="takes no writes"):
        engine.write(full, rows([0]))
    engine.write(other, rows([1, 2, 3]))
    assert len(other.rowset) == 3
    engine.stop()  # and closes the data directory
    # everything acknowledged is on the (full) disk and comes back, and nothing else
    engine2, found = open_engine(tiny_disk / "data")
    assert len(found["full"].rowset) == acknowledged
    engine2.close_storage()


def test_durable_false_blink_and_hidden_tables_are_not_journaled(tmp_path):
    engine, _ = open_engine(tmp_path)
    engine.get_or_create(TableSpec("blinky", "blink", SCHEMA))
    engine.get_or_create(TableSpec("mem", "append", SCHEMA, durable=False))
    engine.get_or_create(TableSpec("secret", "append", SCHEMA, hidden=True))
    engine.get_or_create(TableSpec("kept", "append", SCHEMA))
    engine.close_storage()
    assert sorted(p.name for p in (tmp_path / "default").iterdir()) == ["kept"]
    meta = (tmp_path / "default" / "kept" / "table.json").read_text()
    assert '"kind": "append"' in meta


def test_a_dropped_table_leaves_the_directory(tmp_path):
    engine, _ = open_engine(tmp_path)
    engine.get_or_create(TableSpec("gone", "append", SCHEMA))
    assert (tmp_path / "default" / "gone").is_dir()
    engine.drop("gone")
    assert not Path(tmp_path / "default" / "gone").exists()
    engine.close_storage()


def test_a_server_with_a_data_directory_keeps_doput_tables_across_a_restart(tmp_path):
    import pyarrow.flight as fl

    from tickwire.server.app import TickwireServer

    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    data = rows(np.arange(1000), 1.5)

    def put_and_get(srv, upload: bool) -> pa.Table:
        client = fl.FlightClient(f"grpc://{srv.target}")
        if upload:
            writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "uploads"), data.schema, opts)
            writer.write_table(data)
            writer.close()
        got = client.do_get(fl.Ticket(b"s/uploads"), opts).read_all()
        client.close()
        return got

    def durable_engine() -> Engine:
        return Engine(EngineConfig(interval_ms=20, data_dir=tmp_path))  # the server opens it at start

    engine = durable_engine()
    srv = TickwireServer(engine, port=0, web=False).start()
    try:
        first = put_and_get(srv, True)
    finally:
        srv.stop()
        engine.stop()
    engine2 = durable_engine()
    srv2 = TickwireServer(engine2, port=0, web=False).start()
    try:
        assert [t.name for t in srv2.recovered] == ["uploads"]
        again = put_and_get(srv2, False)
    finally:
        srv2.stop()
        engine2.stop()
    assert first.num_rows == 1000 and again.equals(first)


@pytest.mark.parametrize("fsync", ["cycle", "interval", "off"])
def test_each_fsync_policy_keeps_what_a_clean_stop_wrote(tmp_path, fsync):
    import time

    engine, _ = open_engine(tmp_path, fsync=fsync, fsync_interval_ms=50)
    app, _ = engine.get_or_create(TableSpec("app", "append", SCHEMA))
    for c in range(5):
        engine.write(app, rows([c]), wait=False)
        engine.run_cycle()
    assert engine.storage.wait_durable()
    stats = engine.storage.stats
    assert stats["records"] == 5
    if fsync == "cycle":
        assert 1 <= stats["fsyncs"] <= 5 and stats["fsync_seconds"] > 0  # cycles queued together share one
    elif fsync == "interval":
        deadline = time.monotonic() + 5
        while stats["fsyncs"] == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert stats["fsyncs"] >= 1
    else:
        assert stats["fsyncs"] == 0
    engine.close_storage()
    engine2, found = open_engine(tmp_path)
    assert state(engine2, found["app"])[1].column("k").to_pylist() == [0, 1, 2, 3, 4]
    engine2.close_storage()


def test_the_fsync_option_is_checked():
    from tickwire.cli import main

    assert main(["serve", "--port", "0", "--fsync", "sometimes", "--duration", "0"]) == 2
    assert main(["serve", "--port", "0", "--fsync", "interval", "0", "--duration", "0"]) == 2


def test_after_the_storage_closes_durable_tables_refuse_writes(tmp_path):
    engine, _ = open_engine(tmp_path)
    app, _ = engine.get_or_create(TableSpec("app", "append", SCHEMA))
    engine.write(app, rows([1]), wait=False)
    engine.run_cycle()
    engine.close_storage()
    with pytest.raises(IngestError, match="was closed"):
        engine.write(app, rows([2]), wait=False)
    engine2, found = open_engine(tmp_path)
    assert state(engine2, found["app"])[1].column("k").to_pylist() == [1]
    engine2.close_storage()


def test_a_slow_disk_holds_cycles_back_instead_of_queueing_without_bound(tmp_path, monkeypatch):
    import time

    from tickwire.server.engine.storage import store

    engine, _ = open_engine(tmp_path)
    app, _ = engine.get_or_create(TableSpec("app", "append", SCHEMA))
    data_dir = str(tmp_path.resolve()) + os.sep
    real_write = os.write
    behind = []  # at each journal write: the cycles run whose records are not written yet

    def slow_write(fd, data):  # a disk that takes 10 ms a record
        if os.path.realpath(f"/proc/self/fd/{fd}").startswith(data_dir):
            time.sleep(0.01)
            behind.append(engine.step - engine.storage.stats["records"])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", slow_write)
    monkeypatch.setattr(store, "MAX_QUEUED", 4)
    for c in range(60):
        engine.write(app, rows([c]), wait=False)
        engine.run_cycle()  # back to back, far faster than the disk
    assert engine.storage.wait_durable()
    # one record a cycle: at most MAX_QUEUED cycles wait for the writer, plus those it is on (at
    # most MAX_QUEUED, taken together); without the bound the cycles would run ~60 ahead
    assert max(behind) <= 2 * 4 and engine.storage.stats["writer_waits"] > 0
    engine.close_storage()
    engine2, found = open_engine(tmp_path)
    assert state(engine2, found["app"])[1].column("k").to_pylist() == list(range(60))
    engine2.close_storage()


def test_an_append_tables_checkpoint_reads_its_rows_a_slice_at_a_time_while_cycles_go_on(tmp_path, monkeypatch):
    # an append table is not copied at the boundary: the checkpoint reads its rows a slice (a row
    # group) at a time, and rows appended meanwhile are the journal's, not the checkpoint's
    import threading

    import pyarrow.parquet as pq

    from tickwire.server.engine.storage import store

    monkeypatch.setattr(store, "CHECKPOINT_SLICE", 100)
    written: list[int] = []
    first, go_on = threading.Event(), threading.Event()

    class Writer(pq.ParquetWriter):
        def write_table(self, table, *args, **kw):
            super().write_table(table, *args, **kw)
            written.append(table.num_rows)
            if len(written) == 1:   # the checkpoint waits here, holding no lock, while cycles run
                first.set()
                go_on.wait(60)

    monkeypatch.setattr(pq, "ParquetWriter", Writer)
    engine, _ = open_engine(tmp_path)
    app, keyed, ring = make_tables(engine)
    engine.write(app, rows(np.arange(1050)), wait=False)
    engine.write(keyed, rows(np.arange(300)), wait=False)
    engine.run_cycle()
    assert engine.storage.checkpoint(app)
    assert first.wait(60)
    for c in range(3):
        engine.write(app, rows(np.arange(2000 + 500 * c, 2500 + 500 * c), 1.0), wait=False)
        engine.run_cycle()
    go_on.set()
    engine.storage.wait_checkpoints()
    assert written == [100] * 10 + [50]
    [ckpt] = (tmp_path / "default").glob("*/checkpoints/checkpoint-*.parquet")
    f = pq.ParquetFile(ckpt)
    assert f.metadata.num_row_groups == 11
    got = f.read()
    assert got.column(store.ROWKEY_COLUMN).to_pylist() == list(range(1050))
    assert got.drop_columns([store.ROWKEY_COLUMN]).equals(rows(np.arange(1050)))
    before = state(engine, app)
    engine.close_storage()
    engine2, found = open_engine(tmp_path)
    after = state(engine2, found["app"])
    assert after[0] == before[0] == list(range(2550)) and after[1].equals(before[1])
    engine2.close_storage()
