"""User namespaces (tickwire.server.engine.storage.users): tables users save directly into the data
directory's Users tree, as the seed lays it out, served as `namespace/table` and back after a
restart; a partitioned one grows a location per partition."""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.harness import Services
from tickwire.server.engine import Engine, EngineConfig
from tickwire.server.engine.errors import CatalogError, TableInUseError
from tickwire.server.engine.storage.history import HistoryTable


def _engine(data_dir: Path) -> Engine:
    return Engine(EngineConfig(interval_ms=3_600_000, data_dir=data_dir)).open()


def _rows(first: int, n: int) -> pa.Table:
    return pa.table({"Sym": pa.array([f"S{i % 3}" for i in range(first, first + n)]),
                     "Qty": pa.array(range(first, first + n), pa.int64())})


def test_a_user_table_is_saved_in_the_users_tree_served_and_back_after_a_restart(tmp_path):
    data_dir = tmp_path / "data"
    engine = _engine(data_dir)
    t = engine.add_user_table("research/signals", _rows(0, 5))
    root = data_dir / "Users" / "research"
    assert (root / "Definitions" / "signals.tbl").is_file()
    assert pq.read_table(root / "Tables" / "signals" / "table.parquet").equals(_rows(0, 5))
    assert not (root / "WritablePartitions").exists()  # the seed's Users tree has none
    assert engine.resolve("research/signals") is t and t.gather().equals(_rows(0, 5))
    assert "research/signals" in engine.public_names()
    with pytest.raises(CatalogError, match="already exists") as e:
        engine.add_user_table("research/signals", _rows(0, 1))
    assert e.value.code == "ALREADY_EXISTS"
    t2 = engine.add_user_table("research/signals", _rows(10, 2), replace=True)
    assert t2.gather().column("Qty").to_pylist() == [10, 11]
    engine.stop()

    engine = _engine(data_dir)
    got = engine.resolve("research/signals")
    assert got is not None and got.gather().equals(_rows(10, 2)) and got.schema.equals(_rows(0, 1).schema)
    engine.remove_user_table("research/signals")
    assert engine.resolve("research/signals") is None
    assert not (root / "Definitions" / "signals.tbl").exists() and not (root / "Tables" / "signals").exists()
    engine.stop()
    assert _engine(data_dir).resolve("research/signals") is None


def test_a_partitioned_user_table_grows_a_location_per_partition_in_one_cycle(tmp_path):
    data_dir = tmp_path / "data"
    engine = _engine(data_dir)
    t = engine.add_user_table_partition("research/fills", "2026-11-20", _rows(0, 3))
    assert isinstance(t, HistoryTable)
    assert t.schema.names == ["Date", "Sym", "Qty"]
    assert t.schema.field("Date").metadata == {b"deephaven:isPartitioning": b"true"}
    location = data_dir / "Users" / "research" / "Partitions" / "0" / "2026-11-20" / "fills" / "table.parquet"
    assert location.is_file() and pq.read_table(location).equals(_rows(0, 3))  # the directory holds the Date
    step = engine.step
    # a partition may carry its Date column, when every row has the partition's value
    with_date = _rows(3, 2).add_column(0, "Date", pa.array(["2026-11-21"] * 2))
    engine.add_user_table_partition("research/fills", "2026-11-21", with_date)
    assert engine.step == step + 1  # one cycle took the new location
    got = engine.snapshot(t)[1]
    assert got.column("Qty").to_pylist() == [0, 1, 2, 3, 4]
    assert got.column("Date").to_pylist() == ["2026-11-20"] * 3 + ["2026-11-21"] * 2
    # refused, nothing written: an earlier partition, one that exists, rows of another date, other columns
    for value, data, code in [("2026-11-19", _rows(0, 1), "FAILED_PRECONDITION"),
                              ("2026-11-21", _rows(0, 1), "FAILED_PRECONDITION"),
                              ("2026-11-22", with_date, "INVALID_ARGUMENT"),
                              ("2026-11-22", _rows(0, 1).drop_columns(["Sym"]), "INVALID_ARGUMENT"),
                              ("../x", _rows(0, 1), "INVALID_ARGUMENT")]:
        with pytest.raises(CatalogError) as e:
            engine.add_user_table_partition("research/fills", value, data)
        assert e.value.code == code, (value, e.value)
    assert sorted(p.name for p in location.parent.parent.parent.iterdir()) == ["2026-11-20", "2026-11-21"]
    with pytest.raises(CatalogError, match="is partitioned"):
        engine.add_user_table("research/fills", _rows(0, 1), replace=True)
    # rows written to it are its intraday part, journaled like any history table's
    engine.write(t, _rows(5, 2).add_column(0, "Date", pa.array(["2026-11-22"] * 2)))
    engine.run_cycle()
    got = engine.snapshot(t)[1]
    assert got.column("Qty").to_pylist() == list(range(7))
    engine.stop()

    engine = _engine(data_dir)
    t = engine.resolve("research/fills")
    assert isinstance(t, HistoryTable) and engine.snapshot(t)[1].equals(got)
    assert len(t.intraday_rows) == 2
    engine.stop()


def test_user_table_names_are_checked_and_other_tables_are_not_replaced(tmp_path):
    engine = _engine(tmp_path / "data")
    for bad in ["signals", "../x/y", "a/b/c", "a/.hidden", "/t"]:
        with pytest.raises(CatalogError) as e:
            engine.add_user_table(bad, _rows(0, 1))
        assert e.value.code == "INVALID_ARGUMENT", bad
    engine.history("research/trades", schema=_rows(0, 1).add_column(0, "Date", pa.array(["d"])).schema)
    with pytest.raises(CatalogError, match="already exists"):
        engine.add_user_table("research/trades", _rows(0, 1), replace=True)
    with pytest.raises(CatalogError, match="no user table"):
        engine.remove_user_table("research/trades")
    with pytest.raises(CatalogError, match="data directory"):
        Engine().add_user_table("research/x", _rows(0, 1))
    engine.stop()


def test_a_held_user_table_is_not_replaced_or_removed(tmp_path):
    engine = _engine(tmp_path / "data")
    t = engine.add_user_table("research/signals", _rows(0, 3))
    t.where(lambda v: pa.array([True] * v.num_rows), name="derived")
    for fn in (lambda: engine.add_user_table("research/signals", _rows(0, 1), replace=True),
               lambda: engine.remove_user_table("research/signals")):
        with pytest.raises(TableInUseError):
            fn()
    assert engine.resolve("research/signals").gather().equals(_rows(0, 3))  # nothing half-done
    assert (tmp_path / "data" / "Users" / "research" / "Tables" / "signals" / "table.parquet").is_file()
    engine.stop()


def test_clients_read_a_user_table_by_its_namespaced_name(tmp_path):
    engine = _engine(tmp_path / "data")
    engine.add_user_table("research/signals", _rows(0, 4))
    with Services(engine=engine) as s:
        got = s.doget(b"s/research/signals")
        assert got.equals(_rows(0, 4))
        assert "research/signals" in s.client().tables()
