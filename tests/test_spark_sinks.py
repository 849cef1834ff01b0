"""Spark Structured Streaming sinks (tickwire.server.adapters.spark).

The Arrow-level tests (diffs, replays, type mapping) need no JVM. The others drive a real local
SparkSession (one per pytest process, session-scoped fixture below): each test writes parquet
files into a directory a file stream reads one file per micro-batch, waits with
`processAllAvailable()`, then steps the engine (`run_cycle()`) and checks the update and the table
after every batch.
"""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tickwire.clients.spark.types import SparkSinkError
from tickwire.server.adapters.spark import diff_by_key, fan_out, last_per_key, sink
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.engine.graph import equal_mask

TRADES = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.int32()), ("Seq", pa.int64())])
TRADES_DDL = "Sym STRING, Price DOUBLE, Size INT, Seq BIGINT"


def trades(seq0: int, n: int, syms=("A", "B", "C")) -> pa.Table:
    i = np.arange(seq0, seq0 + n, dtype=np.int64)
    return pa.table({"Sym": pa.array(np.array(syms, dtype=object)[i % len(syms)]), "Price": i * 0.5,
                     "Size": (i % 7 + 1).astype(np.int32), "Seq": i}, schema=TRADES)


def manual_engine() -> Engine:
    return Engine(interval_ms=3_600_000)  # stepped by the test with run_cycle()


# ------------------------------------------------------------------------------------------------
# Arrow level (no JVM)
# ------------------------------------------------------------------------------------------------

def test_last_per_key_keeps_the_last_row_of_each_key():
    t = pa.table({"k": ["a", "b", "a", None, "c", None], "v": [1, 2, 3, 4, 5, 6]})
    assert last_per_key(t, ["k"]).to_pydict() == {"k": ["b", "a", "c", None], "v": [2, 3, 5, 6]}
    distinct = pa.table({"k": [3, 1, 2], "v": [1, 2, 3]})
    assert last_per_key(distinct, ["k"]) is distinct


def check_diffs_against_a_reference(seed: int, rounds: int, max_rows: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        n_old, n_new = rng.integers(0, max_rows, 2)
        old_keys = rng.choice(80, n_old, replace=False)
        new_keys = rng.choice(80, n_new, replace=True)  # repeated keys: the last row counts
        old = pa.table({"k1": old_keys % 9, "k2": [f"s{x // 9}" for x in old_keys], "v": rng.integers(0, 3, n_old),
                        "w": rng.choice([0.5, np.nan], n_old)})
        new = pa.table({"k1": new_keys % 9, "k2": [f"s{x // 9}" for x in new_keys], "v": rng.integers(0, 3, n_new),
                        "w": rng.choice([0.5, np.nan], n_new)})
        removed, upserts = diff_by_key(old, new, ["k1", "k2"])
        before = {(r["k1"], r["k2"]): (r["v"], str(r["w"])) for r in old.to_pylist()}
        after = {(r["k1"], r["k2"]): (r["v"], str(r["w"])) for r in new.to_pylist()}  # last row wins
        assert sorted((r["k1"], r["k2"]) for r in removed.to_pylist()) == sorted(set(before) - set(after))
        got = {(r["k1"], r["k2"]): (r["v"], str(r["w"])) for r in upserts.to_pylist()}
        assert upserts.num_rows == len(got)
        assert got == {k: v for k, v in after.items() if before.get(k) != v}


def test_diff_by_key_matches_a_reference_on_random_tables():
    check_diffs_against_a_reference(seed=11, rounds=40, max_rows=60)


def test_diff_by_key_is_exact_when_key_hashes_collide(monkeypatch):
    import tickwire.server.engine.ingest as ingest_module

    real = ingest_module.hash_columns
    monkeypatch.setattr(ingest_module, "hash_columns", lambda cols: real(cols) % np.uint64(5))
    check_diffs_against_a_reference(seed=12, rounds=40, max_rows=12)  # few rows: both lookup paths run
    check_diffs_against_a_reference(seed=13, rounds=10, max_rows=60)


def test_replace_reports_only_true_changes_and_nothing_for_an_identical_batch():
    engine = manual_engine()
    s = sink(engine, "totals", mode="replace", keys=["Sym"])
    assert s.write(pa.table({"Sym": ["A", "B", "C"], "Total": [1, 2, 3], "N": [1, 1, 1]}), 0)
    assert engine.run_cycle()["totals"].added.size == 3
    seen = []
    engine.resolve("totals").add_listener(lambda t, u, step: seen.append(u))
    # B changes one column, C goes away, D arrives, A is the same
    assert s.write(pa.table({"Sym": ["A", "B", "D"], "Total": [1, 5, 4], "N": [1, 1, 1]}), 1)
    engine.run_cycle()
    (u,) = seen
    table = engine.resolve("totals")
    assert u.added.size == 1 and u.removed.size == 1 and u.modified.size == 1
    assert set(u.modified_columns) == {"Total"}
    assert table.gather(["Sym"], u.modified).column(0).to_pylist() == ["B"]
    assert s.last["removed"] == 1 and s.last["upserted"] == 2
    # the same contents again (a new batch id): no update at all
    assert s.write(pa.table({"Sym": ["D", "A", "B"], "Total": [4, 1, 5], "N": [1, 1, 1]}), 2)
    assert "totals" not in engine.run_cycle()
    assert len(seen) == 1
    assert table.to_arrow().sort_by("Sym").to_pydict() == {"Sym": ["A", "B", "D"], "Total": [1, 5, 4], "N": [1, 1, 1]}


def test_a_replayed_batch_id_changes_nothing_in_every_mode():
    engine = manual_engine()
    data = trades(0, 6)
    sinks = {"append": sink(engine, "a", "append"), "ring": sink(engine, "r", "append", max_rows=4),
             "blink": sink(engine, "b", "blink"), "upsert": sink(engine, "u", "upsert", keys=["Sym"]),
             "replace": sink(engine, "p", "replace", keys=["Seq"])}
    for s in sinks.values():
        assert s.write(data, 5, scope="query-1")
    first = engine.run_cycle()
    assert set(first) == {"a", "r", "b", "u", "p"}
    states = {name: engine.resolve(name).to_arrow() for name in ("a", "r", "u", "p")}
    for s in sinks.values():
        assert not s.write(trades(100, 3), 5, scope="query-1")  # replay: other rows, same id
        assert s.replays == 1
    updates = engine.run_cycle()
    assert set(updates) == {"b"}  # only the blink table changes: its rows live for one cycle
    assert updates["b"].added.size == 0 and updates["b"].removed.size == 6
    for name, state in states.items():
        assert engine.resolve(name).to_arrow().equals(state)
    # another query's batch 5 is a different batch
    assert sinks["append"].write(trades(100, 3), 5, scope="query-2")
    assert engine.run_cycle()["a"].added.size == 3


def test_upsert_with_delete_column_last_row_of_a_key_wins():
    engine = manual_engine()
    s = sink(engine, "u", "upsert", keys=["k"], delete_column="gone")
    s.write(pa.table({"k": ["a", "b", "c"], "v": [1, 2, 3], "gone": [False, False, False]}), 0)
    engine.run_cycle()
    # a: deleted then upserted -> kept; b: upserted then deleted -> gone; c: null flag -> upsert
    s.write(pa.table({"k": ["a", "b", "a", "b", "c"], "v": [9, 8, 7, 6, 5],
                      "gone": [True, False, False, True, None]}), 1)
    u = engine.run_cycle()["u"]
    assert u.removed.size == 1 and u.modified.size == 2 and u.added.size == 0
    assert engine.resolve("u").schema.names == ["k", "v"]
    assert engine.resolve("u").to_arrow().sort_by("k").to_pydict() == {"k": ["a", "c"], "v": [7, 5]}


def test_sink_argument_errors():
    engine = manual_engine()
    with pytest.raises(ValueError, match="needs keys"):
        sink(engine, "t", "upsert")
    with pytest.raises(ValueError, match="mode must be one of"):
        sink(engine, "t", "merge")
    with pytest.raises(ValueError, match="delete_column applies"):
        sink(engine, "t", "replace", keys=["k"], delete_column="d")
    with pytest.raises(ValueError, match="max_rows applies"):
        sink(engine, "t", "blink", max_rows=3)
    with pytest.raises(TypeError):
        sink(object(), "t")
    engine.create(TableSpec("k", "keyed", TRADES, keys=("Sym",)))
    with pytest.raises(SparkSinkError,
                       match="'k'.*mode 'append' needs an append table, but the table is a keyed table"):
        sink(engine, "k", "append").write(trades(0, 2), 0)
    with pytest.raises(SparkSinkError, match=r"'k'.*the table is keyed on \['Sym'\], not \['Seq'\]"):
        sink(engine, "k", "upsert", keys=["Seq"]).write(trades(0, 2), 0)


def test_spark_type_mapping_and_unsupported_types_name_table_and_column():
    T = pytest.importorskip("pyspark.sql.types")
    from tickwire.protocol.schema import to_deephaven_schema
    from tickwire.server.adapters.spark import arrow_schema_for_spark

    f = T.StructField
    schema = T.StructType([
        f("S", T.StringType()), f("B", T.ByteType()), f("Sh", T.ShortType()), f("I", T.IntegerType()),
        f("L", T.LongType()), f("F", T.FloatType()), f("D", T.DoubleType()), f("Dec", T.DecimalType(10, 2)),
        f("Flag", T.BooleanType()), f("Ts", T.TimestampType()), f("Ntz", T.TimestampNTZType()),
        f("Dt", T.DateType()), f("Bin", T.BinaryType()), f("Arr", T.ArrayType(T.LongType())),
        f("Strs", T.ArrayType(T.StringType())), f("Iv", T.DayTimeIntervalType())])
    got = arrow_schema_for_spark(schema, "typed")
    assert got.names == schema.names
    dh = {f.name: f.metadata[b"deephaven:type"].decode() for f in to_deephaven_schema(got)}
    assert dh == {"S": "java.lang.String", "B": "byte", "Sh": "short", "I": "int", "L": "long", "F": "float",
                  "D": "double", "Dec": "java.math.BigDecimal", "Flag": "java.lang.Boolean",
                  "Ts": "java.time.Instant", "Ntz": "java.time.Instant", "Dt": "java.time.LocalDate",
                  "Bin": "byte[]", "Arr": "long[]", "Strs": "java.lang.String[]", "Iv": "java.time.Duration"}
    assert got.field("Ts").type == pa.timestamp("us", "UTC")
    unsupported = {
        "Pair": T.StructType([f("a", T.IntegerType())]), "M": T.MapType(T.StringType(), T.IntegerType()),
        "Ym": T.YearMonthIntervalType(), "Nested": T.ArrayType(T.StructType([f("a", T.IntegerType())])),
        "Nothing": T.NullType(), "Cal": T.CalendarIntervalType(),
    }
    for col, dt in unsupported.items():
        bad = T.StructType([f("Ok", T.IntegerType()), f(col, dt)])
        with pytest.raises(SparkSinkError, match=f"table 'typed': column '{col}' has Spark type"):
            arrow_schema_for_spark(bad, "typed")


# ------------------------------------------------------------------------------------------------
# with a local SparkSession
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java 17 runtime on PATH")
    from tickwire.server.adapters.spark import spark_session

    session = spark_session("tickwire-tests")
    yield session
    session.stop()


class ParquetFeed:
    """A directory a Spark file stream reads one file per micro-batch from."""

    def __init__(self, root: Path, schema: pa.Schema, ddl: str):
        self.dir = root
        self.dir.mkdir(parents=True, exist_ok=True)
        self.schema, self.ddl, self.count = schema, ddl, 0

    def push(self, table: pa.Table) -> None:
        hidden = self.dir / f".part-{self.count:05d}.tmp"  # Spark skips names starting with '.'
        pq.write_table(table.cast(self.schema), hidden)
        os.replace(hidden, self.dir / f"part-{self.count:05d}.parquet")
        self.count += 1

    def stream(self, spark):
        return spark.readStream.schema(self.ddl).option("maxFilesPerTrigger", 1).parquet(str(self.dir))


def start(df, fn, checkpoint: Path, mode: str = "append"):
    return df.writeStream.outputMode(mode).foreachBatch(fn).option("checkpointLocation", str(checkpoint)).start()


def failure_of(query) -> str:
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as info:
        query.awaitTermination(120)
    return str(info.value)


@pytest.mark.slow
def test_append_and_ring_tables_take_each_batch(spark, tmp_path):
    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    appended = sink(engine, "trades", "append", wait=False)
    ring = sink(engine, "last5", "append", max_rows=5, wait=False)
    qa = start(feed.stream(spark), appended, tmp_path / "ck-a")
    qr = start(feed.stream(spark), ring, tmp_path / "ck-r")
    try:
        pushed = []
        for b, n in enumerate([4, 3, 6]):
            batch = trades(100 * b, n)
            pushed.append(batch)
            feed.push(batch)
            qa.processAllAvailable()
            qr.processAllAvailable()
            updates = engine.run_cycle()
            assert updates["trades"].added.size == n
            assert engine.resolve("trades").to_arrow().equals(pa.concat_tables(pushed).combine_chunks())
            last5 = pa.concat_tables(pushed).slice(max(0, sum(len(p) for p in pushed) - 5))
            assert engine.resolve("last5").to_arrow().equals(last5.combine_chunks())
            assert updates["last5"].added.size == min(n, 5)
        assert appended.batches == 3 and appended.rows == 13 and appended.replays == 0
        assert engine.resolve("trades").schema == TRADES
    finally:
        qa.stop()
        qr.stop()


@pytest.mark.slow
def test_upsert_from_an_update_mode_aggregation_with_deletes(spark, tmp_path):
    from pyspark.sql import functions as F

    engine = manual_engine()
    schema = pa.schema([("Sym", pa.string()), ("Size", pa.int64()), ("Closed", pa.bool_())])
    feed = ParquetFeed(tmp_path / "in", schema, "Sym STRING, Size BIGINT, Closed BOOLEAN")
    agg = feed.stream(spark).groupBy("Sym").agg(F.sum("Size").alias("Total"), F.count("*").alias("N"),
                                                F.bool_or("Closed").alias("Closed"))
    s = sink(engine, "positions", "upsert", keys=["Sym"], delete_column="Closed", wait=False)
    q = start(agg, s, tmp_path / "ck", mode="update")
    table = None
    try:
        steps = [
            ({"Sym": ["A", "B", "A"], "Size": [1, 2, 3], "Closed": [False, False, False]},
             {"added": 2, "removed": 0, "modified": 0}, {"A": (4, 2), "B": (2, 1)}),
            ({"Sym": ["A", "C"], "Size": [10, 5], "Closed": [False, False]},
             {"added": 1, "removed": 0, "modified": 1}, {"A": (14, 3), "B": (2, 1), "C": (5, 1)}),
            ({"Sym": ["B"], "Size": [1], "Closed": [True]},
             {"added": 0, "removed": 1, "modified": 0}, {"A": (14, 3), "C": (5, 1)}),
        ]
        for rows, counts, expected in steps:
            feed.push(pa.table(rows, schema=schema))
            q.processAllAvailable()
            u = engine.run_cycle()["positions"]
            assert (u.added.size, u.removed.size, u.modified.size) == (
                counts["added"], counts["removed"], counts["modified"])
            table = engine.resolve("positions")
            got = table.to_arrow().sort_by("Sym")
            assert {s_: (t, n) for s_, t, n in zip(*[got.column(c).to_pylist() for c in ("Sym", "Total", "N")])} \
                == expected
        assert table.schema.names == ["Sym", "Total", "N"]
        assert u.modified_columns == frozenset()
    finally:
        q.stop()


@pytest.mark.slow
def test_replace_from_a_complete_mode_aggregation_emits_only_true_changes(spark, tmp_path):
    from pyspark.sql import functions as F

    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    # complete mode re-sends every group each batch; groups above the limit leave the result
    agg = feed.stream(spark).groupBy("Sym").agg(F.sum("Size").alias("Total"), F.max("Seq").alias("Last")) \
        .where("Total < 30")
    s = sink(engine, "totals", "replace", keys=["Sym"], wait=False)
    q = start(agg, s, tmp_path / "ck", mode="complete")
    seen = []
    try:
        feed.push(pa.table({"Sym": ["A", "B", "C"], "Price": [1.0] * 3, "Size": [1, 2, 3], "Seq": [1, 2, 3]},
                           schema=TRADES))
        q.processAllAvailable()
        assert engine.run_cycle()["totals"].added.size == 3
        table = engine.resolve("totals")
        table.add_listener(lambda t, u, step: seen.append((u, t.gather(["Sym"], u.modified).column(0).to_pylist())))
        # only B changes (both value columns); A and C are re-sent unchanged
        feed.push(pa.table({"Sym": ["B"], "Price": [1.0], "Size": [5], "Seq": [4]}, schema=TRADES))
        q.processAllAvailable()
        engine.run_cycle()
        (u, modified_syms), = seen
        assert (u.added.size, u.removed.size, modified_syms) == (0, 0, ["B"])
        assert set(u.modified_columns) == {"Total", "Last"}
        # A crosses the limit: removed; D is new; B changes only its Last column
        feed.push(pa.table({"Sym": ["A", "D", "B"], "Price": [1.0] * 3, "Size": [40, 1, 0], "Seq": [5, 6, 7]},
                           schema=TRADES))
        q.processAllAvailable()
        engine.run_cycle()
        u, modified_syms = seen[-1]
        assert (u.added.size, u.removed.size, modified_syms) == (1, 1, ["B"])
        assert set(u.modified_columns) == {"Last"}
        got = table.to_arrow().sort_by("Sym")
        assert got.to_pydict() == {"Sym": ["B", "C", "D"], "Total": [7, 3, 1], "Last": [7, 3, 6]}
        # a batch with no new input changes nothing (Spark may not even run one)
        before = len(seen)
        q.processAllAvailable()
        engine.run_cycle()
        assert len(seen) == before
    finally:
        q.stop()


@pytest.mark.slow
def test_blink_table_holds_each_batch_for_one_cycle(spark, tmp_path):
    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    q = start(feed.stream(spark), sink(engine, "ticks", "blink", wait=False), tmp_path / "ck")
    try:
        previous = 0
        for b, n in enumerate([3, 5]):
            batch = trades(10 * b, n)
            feed.push(batch)
            q.processAllAvailable()
            u = engine.run_cycle()["ticks"]
            assert (u.added.size, u.removed.size) == (n, previous)
            assert engine.resolve("ticks").to_arrow().equals(batch)
            previous = n
        u = engine.run_cycle()["ticks"]  # no batch this cycle: the rows go
        assert (u.added.size, u.removed.size, engine.resolve("ticks").size) == (0, 5, 0)
    finally:
        q.stop()


TYPED = pa.schema([
    ("S", pa.string()), ("B", pa.int8()), ("Sh", pa.int16()), ("I", pa.int32()), ("L", pa.int64()),
    ("F", pa.float32()), ("D", pa.float64()), ("Dec", pa.decimal128(10, 2)), ("Flag", pa.bool_()),
    ("Ts", pa.timestamp("us", "UTC")), ("Ntz", pa.timestamp("us")), ("Dt", pa.date32()), ("Bin", pa.binary()),
    ("Arr", pa.list_(pa.int64())), ("Strs", pa.list_(pa.string())),
])
TYPED_DDL = ("S STRING, B TINYINT, Sh SMALLINT, I INT, L BIGINT, F FLOAT, D DOUBLE, Dec DECIMAL(10,2), "
             "Flag BOOLEAN, Ts TIMESTAMP, Ntz TIMESTAMP_NTZ, Dt DATE, Bin BINARY, Arr ARRAY<BIGINT>, "
             "Strs ARRAY<STRING>")


def typed_rows() -> pa.Table:
    import datetime as dt
    from decimal import Decimal

    ts = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=dt.timezone.utc)
    return pa.table({
        "S": ["x", None, "ü"], "B": [1, None, -128], "Sh": [300, -2, None], "I": [None, 7, 2**31 - 1],
        "L": [2**62, None, -1], "F": [1.5, None, float("nan")], "D": [None, -0.25, 1e300],
        "Dec": [Decimal("12.34"), None, Decimal("-0.01")], "Flag": [True, False, None],
        "Ts": [ts, None, dt.datetime(1600, 1, 1, tzinfo=dt.timezone.utc)],
        "Ntz": [ts.replace(tzinfo=None), dt.datetime(9999, 12, 31), None],
        "Dt": [dt.date(2024, 2, 29), None, dt.date(1, 1, 1)], "Bin": [b"\x00\x01", None, b""],
        "Arr": [[1, None, 3], [], None], "Strs": [["a"], None, [None, "b"]],
    }, schema=TYPED)


@pytest.mark.slow
def test_type_mapping_through_spark(spark, tmp_path):
    from pyspark.sql import functions as F

    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TYPED, TYPED_DDL)
    df = feed.stream(spark).withColumn("Iv", F.expr("make_dt_interval(0, 0, 0, CAST(I % 100 AS DECIMAL(18, 6)))"))
    s = sink(engine, "typed", "append", wait=False)
    q = start(df, s, tmp_path / "ck")
    try:
        data = typed_rows()
        feed.push(data)
        q.processAllAvailable()
        engine.run_cycle()
        got = engine.resolve("typed").to_arrow()
    finally:
        q.stop()
    expected_types = {f.name: f.type for f in TYPED}
    expected_types["Ntz"] = pa.timestamp("us", "UTC")
    expected_types["Arr"] = pa.list_(pa.field("element", pa.int64()))
    expected_types["Strs"] = pa.list_(pa.field("element", pa.string()))
    expected_types["Iv"] = pa.duration("us")
    assert {f.name: f.type for f in got.schema} == expected_types
    for name in TYPED.names:
        want = data.column(name).cast(expected_types[name])
        assert equal_mask(got.column(name), want).all(), name  # NaN equals NaN, nulls equal nulls
    assert got.column("Iv").to_pylist()[1].total_seconds() == 7


@pytest.mark.slow
def test_unsupported_type_fails_the_query_naming_table_and_column(spark, tmp_path):
    from pyspark.sql import functions as F

    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    df = feed.stream(spark).withColumn("Pair", F.struct("Size", "Seq"))
    q = start(df, sink(engine, "paired", "append", wait=False), tmp_path / "ck")
    feed.push(trades(0, 2))
    message = failure_of(q)
    assert "table 'paired': column 'Pair' has Spark type struct<Size:int,Seq:bigint>" in message
    assert engine.resolve("paired", hidden=True) is None


@pytest.mark.slow
def test_schema_change_between_batches_fails_the_query(spark, tmp_path):
    engine = manual_engine()
    s = sink(engine, "evolving", "append", wait=False)
    first = ParquetFeed(tmp_path / "one", TRADES, TRADES_DDL)
    q = start(first.stream(spark), s, tmp_path / "ck1")
    try:
        first.push(trades(0, 3))
        q.processAllAvailable()
    finally:
        q.stop()
    engine.run_cycle()
    # the same sink (and table) fed by a query whose Size became a string
    changed = pa.schema([("Sym", pa.string()), ("Price", pa.float64()), ("Size", pa.string()), ("Seq", pa.int64())])
    second = ParquetFeed(tmp_path / "two", changed, "Sym STRING, Price DOUBLE, Size STRING, Seq BIGINT")
    q2 = start(second.stream(spark), s, tmp_path / "ck2")
    second.push(pa.table({"Sym": ["Z"], "Price": [1.0], "Size": ["big"], "Seq": [9]}, schema=changed))
    message = failure_of(q2)
    assert "table 'evolving': column 'Size' is string in the batch but int32 in the table" in message
    assert engine.run_cycle() == {}
    assert engine.resolve("evolving").to_arrow().equals(trades(0, 3))


@pytest.mark.slow
def test_restart_after_a_crash_and_after_a_clean_stop_loses_nothing_and_repeats_nothing(spark, tmp_path):
    batches = [trades(10 * b, 3 + b) for b in range(6)]
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    for b in batches[:3]:
        feed.push(b)

    engine = manual_engine()
    ids_seen = []
    first = sink(engine, "fills", "append", wait=False)

    def crashing(df, batch_id):
        ids_seen.append(batch_id)
        first(df, batch_id)
        if batch_id == 2:
            raise RuntimeError("simulated crash after the batch was written, before Spark committed it")

    ck = tmp_path / "ck"
    q = start(feed.stream(spark), crashing, ck)
    assert "simulated crash" in failure_of(q)
    assert ids_seen == [0, 1, 2]

    # restart from the checkpoint with a new sink on the same table: Spark replays batch 2
    second = sink(engine, "fills", "append", wait=False)

    def recording(df, batch_id):
        ids_seen.append(batch_id)
        second(df, batch_id)

    q = start(feed.stream(spark), recording, ck)
    q.processAllAvailable()
    assert ids_seen == [0, 1, 2, 2] and second.replays == 1 and second.batches == 0
    feed.push(batches[3])
    q.processAllAvailable()
    engine.run_cycle()
    q.stop()  # a clean stop: nothing is replayed on restart
    q = start(feed.stream(spark), recording, ck)
    try:
        for b in batches[4:]:
            feed.push(b)
            q.processAllAvailable()
            engine.run_cycle()
    finally:
        q.stop()
    assert ids_seen == [0, 1, 2, 2, 3, 4, 5] and second.replays == 1 and second.batches == 3

    # the same input through one uninterrupted query
    reference = manual_engine()
    qr = start(feed.stream(spark), sink(reference, "fills", "append", wait=False), tmp_path / "ck-ref")
    try:
        qr.processAllAvailable()
    finally:
        qr.stop()
    reference.run_cycle()
    got = engine.resolve("fills").to_arrow()
    assert got.equals(reference.resolve("fills").to_arrow())
    # every row once (files pushed together may be taken in any order)
    assert got.sort_by("Seq").equals(pa.concat_tables(batches).combine_chunks())


@pytest.mark.slow
def test_replayed_batch_id_called_directly_and_queries_do_not_collide(spark, tmp_path):
    engine = manual_engine()
    s = sink(engine, "direct", "append", wait=False)
    df = spark.createDataFrame(trades(0, 4))
    s(df, 7)
    s(df, 7)  # the same batch again: changes nothing
    assert engine.run_cycle()["direct"].added.size == 4
    assert s.batches == 1 and s.replays == 1 and engine.resolve("direct").size == 4
    # an empty batch (Spark sends them, e.g. with watermarks) creates the table and adds nothing
    empty = sink(engine, "empty", "upsert", keys=["Sym"], wait=False)
    empty(spark.createDataFrame([], TRADES_DDL), 0)
    assert "empty" not in engine.run_cycle()
    assert engine.resolve("empty").schema == TRADES and engine.resolve("empty").size == 0 and empty.batches == 1
    # two queries writing the same table both start at batch 0: their scopes (query ids) differ
    feeds = [ParquetFeed(tmp_path / f"in{i}", TRADES, TRADES_DDL) for i in range(2)]
    shared = sink(engine, "shared", "append", wait=False)
    queries = [start(f.stream(spark), shared, tmp_path / f"ck{i}") for i, f in enumerate(feeds)]
    try:
        for i, (f, q) in enumerate(zip(feeds, queries)):
            f.push(trades(100 * i, 2))
            q.processAllAvailable()
    finally:
        for q in queries:
            q.stop()
    engine.run_cycle()
    assert shared.batches == 2 and shared.replays == 0
    assert sorted(engine.resolve("shared").to_arrow().column("Seq").to_pylist()) == [0, 1, 100, 101]


@pytest.mark.slow
def test_a_subscriber_sees_each_committed_batch_as_one_update(spark, tmp_path):
    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer

    engine = Engine(interval_ms=20)
    engine.create(TableSpec("live", "append", TRADES))  # exists before the query: the sink checks and reuses it
    server = TickwireServer(engine, port=0).start()  # starts the engine's cycle thread
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    s = sink(server, "live", "append")  # wait=True: returns once the batch's cycle has run
    q = start(feed.stream(spark), s, tmp_path / "ck")
    updates = []
    try:
        with BarrageClient(server.target) as client:
            sub = client.subscribe("live", on_update=updates.append)
            assert sub.wait_for(lambda x: x.update_count >= 1, 30)
            batches = [trades(100 * b, 2 + b) for b in range(5)]
            for i, batch in enumerate(batches):
                feed.push(batch)
                q.processAllAvailable()
                total = sum(len(b) for b in batches[:i + 1])
                assert sub.wait_for(lambda x, total=total: x.size == total, 30)
            live = [u for u in updates if not u.is_snapshot]
            assert len(live) == len(batches)
            for u, batch in zip(live, batches):
                assert pa.table({n: u.added.column(n) for n in TRADES.names}).equals(batch)
            assert len({u.last_seq for u in live}) == len(batches)
            sub.close()
    finally:
        q.stop()
        server.stop()
        engine.stop()
    assert s.batches == 5 and all(k in s.last for k in ("queued_at", "applied_at"))


@pytest.mark.slow
def test_fan_out_collects_once_and_lands_in_every_table_in_one_cycle(spark, tmp_path):
    engine = Engine(interval_ms=20).start()
    steps: dict[str, list[int]] = {}
    outs = [sink(engine, "all", "append"), sink(engine, "recent", "append", max_rows=4), sink(engine, "now", "blink")]
    write = fan_out(*outs)
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    q = start(feed.stream(spark), write, tmp_path / "ck")
    try:
        feed.push(trades(0, 3))
        q.processAllAvailable()
        for name in ("all", "recent", "now"):
            engine.resolve(name).add_listener(lambda t, u, step: steps.setdefault(t.name, []).append(step)
                                         if len(u.added) else None)
        feed.push(trades(10, 3))
        q.processAllAvailable()
    finally:
        q.stop()
        engine.stop()
    assert steps["all"] == steps["recent"] == steps["now"] and len(steps["all"]) == 1
    assert engine.resolve("all").size == 6 and engine.resolve("recent").size == 4
    assert all(o.batches == 2 and o.last["convert_s"] == outs[0].last["convert_s"] for o in outs)
    # a sink that already has a batch skips it while the others of the fan-out take it
    direct = manual_engine()
    a, b = sink(direct, "a", "append", wait=False), sink(direct, "b", "append", wait=False)
    df = spark.createDataFrame(trades(0, 2))
    fan_out(a)(df, 0)
    fan_out(a, b)(df, 0)
    assert (a.batches, a.replays, b.batches, b.replays) == (1, 1, 1, 0)
    assert {name: len(u.added) for name, u in direct.run_cycle().items()} == {"a": 2, "b": 2}


def test_session_falls_back_to_raw_local_filesystem_without_javac(monkeypatch, tmp_path):
    pytest.importorskip("pyspark")
    from tickwire.server.adapters.spark import launch

    monkeypatch.setenv("TICKWIRE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(launch.shutil, "which", lambda name: None)
    conf, chosen = launch.spark_conf("x", {"spark.driver.extraJavaOptions": "-Dmine=1"})
    assert chosen == "raw"
    assert conf["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.RawLocalFileSystem"
    assert "-Djdk.lang.Process.launchMechanism=VFORK" in conf["spark.driver.extraJavaOptions"]
    assert "-Dmine=1" in conf["spark.driver.extraJavaOptions"]
    assert "spark.driver.extraClassPath" not in conf
    with pytest.raises(RuntimeError, match="not available"):
        launch.spark_conf("x", filesystem="nofork")
    stock, chosen = launch.spark_conf("x", filesystem="stock")
    assert chosen == "stock" and "spark.hadoop.fs.file.impl" not in stock


@pytest.mark.slow
def test_filesystem_class_compiles_once_into_the_cache(tmp_path):
    pytest.importorskip("pyspark")
    if shutil.which("javac") is None:
        pytest.skip("needs javac")
    from tickwire.server.adapters.spark import compile_filesystem

    classes = compile_filesystem(tmp_path)
    built = classes / "tickwire" / "hadoop" / "NoForkLocalFileSystem.class"
    assert built.is_file() and (classes / "tickwire" / "hadoop" / "NoForkLocalFileSystem$Fs.class").is_file()
    stamp = built.stat().st_mtime_ns
    assert compile_filesystem(tmp_path) == classes and built.stat().st_mtime_ns == stamp
    assert compile_filesystem(tmp_path / "other", javac=str(tmp_path / "no-such-javac")) is None


@pytest.mark.slow
def test_non_forking_filesystem_answers_like_the_local_one(spark, tmp_path):
    if spark.conf.get("spark.tickwire.filesystem") != "nofork":
        pytest.skip("the session runs without javac")
    # pyspark has no public handle on its JVM or on its Hadoop configuration
    jvm = spark.sparkContext._jvm  # noqa: SLF001
    conf = spark.sparkContext._jsc.hadoopConfiguration()  # noqa: SLF001
    uri = jvm.java.net.URI("file:///")
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(uri, conf)
    assert fs.getClass().getName() == "tickwire.hadoop.NoForkLocalFileSystem"
    assert jvm.java.lang.Class.forName("org.apache.hadoop.fs.LocalFileSystem").isInstance(fs)  # RocksDB casts to it
    afs = jvm.org.apache.hadoop.fs.FileContext.getFileContext(uri, conf).getDefaultFileSystem()
    assert afs.getClass().getName() == "tickwire.hadoop.NoForkLocalFileSystem$Fs"
    Path_ = jvm.org.apache.hadoop.fs.Path
    perm = jvm.org.apache.hadoop.fs.permission.FsPermission
    target = tmp_path / "f.bin"
    out = fs.create(Path_(str(target)))
    out.write(b"tickwire")
    out.close()
    fs.setPermission(Path_(str(target)), perm(0o640))
    assert os.stat(target).st_mode & 0o777 == 0o640
    status = fs.getFileStatus(Path_(str(target)))
    assert status.getPermission().toShort() == 0o640 and status.getLen() == 8 and not status.isDirectory()
    assert status.getOwner() == target.owner() and status.getGroup() == target.group()
    assert (tmp_path / ".f.bin.crc").is_file()  # still checksummed
    assert fs.mkdirs(Path_(str(tmp_path / "d" / "e")), perm(0o750))
    assert os.stat(tmp_path / "d" / "e").st_mode & 0o777 == 0o750 & ~_umask()
    os.symlink(target, tmp_path / "link")
    link = fs.getFileLinkStatus(Path_(str(tmp_path / "link")))
    assert link.isSymlink() and link.getSymlink().toUri().getPath() == str(target)
    assert fs.getFileStatus(Path_(str(tmp_path / "link"))).getLen() == 8
    names = sorted(st.getPath().getName() for st in fs.listStatus(Path_(str(tmp_path))))
    assert names == ["d", "f.bin", "link"]  # checksum files hidden, as by LocalFileSystem
    raw = sorted(st.getPath().getName() for st in fs.getRaw().listStatus(Path_(str(tmp_path))))
    assert raw == [".f.bin.crc", "d", "f.bin", "link"]
    from py4j.protocol import Py4JJavaError

    with pytest.raises(Py4JJavaError, match="FileNotFoundException"):
        fs.getFileStatus(Path_(str(tmp_path / "missing")))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.slow
def test_rocksdb_state_store_runs_on_the_non_forking_filesystem(spark, tmp_path):
    from pyspark.sql import functions as F

    if spark.conf.get("spark.tickwire.filesystem") != "nofork":
        pytest.skip("the session runs without javac")
    session = spark.newSession()
    session.conf.set("spark.sql.streaming.stateStore.providerClass",
                     "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
    engine = manual_engine()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    agg = feed.stream(session).groupBy("Sym").agg(F.sum("Size").alias("Total"))
    q = start(agg, sink(engine, "rocks", "upsert", keys=["Sym"], wait=False), tmp_path / "ck", mode="update")
    try:
        for b in range(2):
            feed.push(trades(10 * b, 4))
            q.processAllAvailable()
            engine.run_cycle()
    finally:
        q.stop()
    got = engine.resolve("rocks").to_arrow().sort_by("Sym").to_pydict()
    expected = pa.concat_tables([trades(0, 4), trades(10, 4)]).group_by("Sym").aggregate([("Size", "sum")])
    assert got == {"Sym": ["A", "B", "C"],
                   "Total": [dict(zip(*expected.to_pydict().values()))[k] for k in ("A", "B", "C")]}
    assert list((tmp_path / "ck" / "state").rglob("*.zip")) or list((tmp_path / "ck" / "state").rglob("*.changelog"))


@pytest.mark.slow
def test_spark_demo_tables_fill_and_stop(spark, tmp_path):
    import threading

    from tickwire.server.adapters.spark.pipeline_demo import SparkDemo

    engine = Engine(interval_ms=50).start()
    names = ["spark_trades", "spark_recent", "spark_ticks", "spark_latest", "spark_totals"]
    updated = {n: threading.Event() for n in names}
    demo = SparkDemo(engine, spark=spark, trigger_ms=100, agg_trigger_ms=300, checkpoint_dir=tmp_path / "ck")

    def on_cycle(step):
        for n in names:
            t = engine.resolve(n)
            if t is not None and t.last_step == step and t.size:
                updated[n].set()

    engine.add_cycle_listener(on_cycle)
    try:
        demo.start()
        for n in names:
            assert updated[n].wait(90), f"{n} never filled; {demo.status()}"
        for t in (n for n in names if n != "spark_ticks"):
            assert engine.resolve(t).size > 0
    finally:
        demo.stop()
        engine.stop()
    assert "FAILED" not in demo.status() and not demo.queries
    seq = engine.resolve("spark_trades").to_arrow().column("Seq").to_numpy()
    assert np.array_equal(seq, np.arange(seq.size))  # every trade once, in order
    assert engine.resolve("spark_recent").size == min(1000, seq.size)
    latest = engine.resolve("spark_latest").to_arrow()
    assert latest.schema.names == ["Sym", "Last", "Volume", "VWAP", "Trades", "Updated"]
    assert set(latest.column("Sym").to_pylist()) <= {f"SYM{i:03d}" for i in range(300)}
    assert latest.column("Sym").unique().to_pylist() == latest.column("Sym").to_pylist()  # one row a symbol
    assert engine.resolve("spark_totals").schema.names == ["Sym", "VWAP", "Volume"]


def test_history_written_by_a_spark_batch_job_and_live_rows_from_a_stream_are_one_table(spark, tmp_path):
    """Last days' trades as a Spark batch job writes them (partitionBy("Date")), served with
    --history's Engine.history; today's arrive through a streaming query's sink into the same
    table, after the history, and a subscriber sees one table."""
    from pyspark.sql import functions as F

    from tickwire.clients.client import BarrageClient
    from tickwire.server.app import TickwireServer

    history_dir = tmp_path / "history"
    old = spark.createDataFrame(pa.concat_tables([trades(0, 30), trades(30, 20)]).to_pandas())
    old = old.withColumn("Date", F.when(F.col("Seq") < 30, F.lit("2026-11-25")).otherwise(F.lit("2026-11-26")))
    old.repartition(2).write.partitionBy("Date").parquet(str(history_dir))  # Spark's files, _SUCCESS and .crc files
    engine = Engine(interval_ms=20)
    table = engine.history("trades", str(history_dir))
    assert table.size == 50 and table.schema.names[0] == "Date"
    server = TickwireServer(engine, port=0).start()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    today = feed.stream(spark).withColumn("Date", F.lit("2026-11-27"))
    q = start(today, sink(server, "trades", "append"), tmp_path / "ck")
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    from tests.test_interop_clients import _current

    dh = Session(host="127.0.0.1", port=server.port)  # Deephaven's Python clients, the same table
    seen, errors = [], []
    handle = listen(dh.open_table("trades"), lambda u: seen.append(_current(u)), errors.append)
    handle.start()
    try:
        with BarrageClient(server.target) as client:
            sub = client.subscribe("trades")
            assert sub.wait_for(lambda x: x.size == 50, 30)
            for b in range(3):
                feed.push(trades(50 + 10 * b, 10))
                q.processAllAvailable()
            assert sub.wait_for(lambda x: x.size == 80, 30)
            deadline = time.monotonic() + 30  # the bound only stops a hang
            while not (seen and seen[-1].num_rows == 80) and not errors and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not errors, errors
            assert seen[-1].column("Seq").to_pylist() == sub.table.column("Seq").to_pylist()
            assert dh.open_table("trades").to_arrow().column("Seq").to_pylist() == sub.table.column("Seq").to_pylist()
            got = sub.table
            assert sorted(got.column("Seq").to_pylist()[:50]) == list(range(50))  # history first
            assert got.column("Seq").to_pylist()[50:] == list(range(50, 80))  # then the stream, in order
            assert got.column("Date").to_pylist()[:30] == ["2026-11-25"] * 30
            assert got.column("Date").to_pylist()[-1] == "2026-11-27"
            sub.close()
    finally:
        handle.stop()
        dh.close()
        q.stop()
        server.stop()
        engine.stop()


def test_the_grid_shows_spark_written_history_and_a_spark_streams_rows(spark, tmp_path, browser, page):
    """Deephaven's JS API and grid page in a browser on the same kind of table: history a Spark batch
    job wrote (partitionBy("Date")), live rows from a running streaming query; a viewport at the
    end follows the stream as a DoGet has it, and the grid draws both dates."""
    from pyspark.sql import functions as F

    from tests.browser.jsapi import JsApiPage, normalize_arrow, normalize_js
    from tests.test_browser import GRID_HOOK, Served, _skip_unless, wait_grid_cells
    from tickwire.server.app import TickwireServer

    _skip_unless("tickwire")
    history_dir = tmp_path / "history"
    syms = ("AAPL", "MSFT", "IBM", "GOOG", "AMZN")  # string values enough for the grid check to see five
    old = spark.createDataFrame(trades(0, 40, syms).to_pandas()).withColumn("Date", F.lit("2026-11-26"))
    old.repartition(2).write.partitionBy("Date").parquet(str(history_dir))
    engine = Engine(interval_ms=20)
    table = engine.history("trades", str(history_dir))
    server = TickwireServer(engine, port=0).start()
    feed = ParquetFeed(tmp_path / "in", TRADES, TRADES_DDL)
    q = start(feed.stream(spark).withColumn("Date", F.lit("2026-11-27")), sink(server, "trades", "append"),
              tmp_path / "ck")
    srv = Served("tickwire", server.port, None, server, None, getattr(server, "web_port", None))
    try:
        js = JsApiPage(page, srv.origin)
        js.login()
        assert int(js.open("trades")["size"]) == 40
        js.viewport(35, 60)  # the end of the history, where the stream's rows come in
        for b in range(2):
            feed.push(trades(40 + 5 * b, 5, syms))
            q.processAllAvailable()
        snap = js.wait_rows(lambda s: s["size"] == 50 and len(s["rows"]) == 15, what="the streamed rows at the end")
        want = normalize_arrow(srv.doget("trades").slice(35, 15))
        assert normalize_js(snap["rows"]) == want
        assert table.size == 50
        assert not page.exceptions(), page.diagnostics()
        grid = browser.new_page()  # the grid page in a page of its own
        try:
            grid.set_viewport(720, 440)
            grid.add_init_script(GRID_HOOK)
            grid.navigate(f"{srv.origin}/iframe/widget/?name=trades")
            drawn = wait_grid_cells(grid, srv, "trades")
            assert {"Date", "Seq"} <= drawn and "2026-11-26" in drawn
            assert not grid.exceptions(), grid.diagnostics()
        finally:
            grid.close()
    finally:
        q.stop()
        server.stop()
        engine.stop()
