"""The "tickwire" Spark data source's writer without a Spark job: its executor side (`write`) and
driver side (`commit`, `abort`) called directly, with the task's context faked, against a real
server (plain, PSK, TLS). The streaming queries themselves are in tests/test_spark_remote.py."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as fl
import pytest

pytest.importorskip("pyspark.sql.datasource")

from pyspark.sql.types import BooleanType, DecimalType, LongType, StringType, StructField, StructType, TimestampType  # noqa: E402

from tests.certs import self_signed  # noqa: E402
from tickwire.clients.spark import datasource  # noqa: E402
from tickwire.clients.spark.datasource import PartCommit, TickwireDataSource, TickwireStreamWriter  # noqa: E402
from tickwire.clients.spark.types import SparkSinkError  # noqa: E402
from tickwire.server.app import TickwireServer  # noqa: E402
from tickwire.server.engine import Engine  # noqa: E402

SCHEMA = StructType([StructField("Sym", StringType()), StructField("Px", DecimalType(10, 2)),
                     StructField("Seq", LongType()), StructField("Ts", TimestampType())])


class FakeTask:
    def __init__(self, query: str, batch: int, partition: int, attempt: int):
        self.props = {datasource.QUERY_ID_PROPERTY: query, datasource.BATCH_ID_PROPERTY: str(batch)}
        self.partition, self.attempt = partition, attempt

    def getLocalProperty(self, key):
        return self.props.get(key)

    def partitionId(self):
        return self.partition

    def taskAttemptId(self):
        return self.attempt


@pytest.fixture
def task(monkeypatch):
    import pyspark

    current = {}
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: current.get("task")))

    def set_task(*args):
        current["task"] = FakeTask(*args)

    return set_task


def spark_batch(rows: list[tuple]) -> pa.RecordBatch:
    """Rows as Spark's Arrow gives them to a Python data source (timestamps in us with the session zone)."""
    import datetime as dt
    from decimal import Decimal
    cols = list(zip(*rows)) if rows else [[], [], [], []]
    return pa.record_batch([pa.array(cols[0], pa.string()),
                            pa.array([Decimal(x) for x in cols[1]], pa.decimal128(10, 2)),
                            pa.array(cols[2], pa.int64()),
                            pa.array([dt.datetime(2026, 1, 1) + dt.timedelta(seconds=s) for s in cols[3]],
                                     pa.timestamp("us", "Etc/UTC"))],
                           names=["Sym", "Px", "Seq", "Ts"])


ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])


def doget(srv, name) -> pa.Table:
    c = fl.connect(f"grpc://127.0.0.1:{srv.port}")
    return c.do_get(fl.Ticket(b"s/" + name.encode()), options=ANON).read_all()


def staging_status(client: fl.FlightClient, options: fl.FlightCallOptions = ANON) -> dict:
    """The server's `tickwire.staging` action (what is staged)."""
    (res,) = list(client.do_action(fl.Action("tickwire.staging", b""), options=options))
    return json.loads(res.body.to_pybytes())


@pytest.fixture
def server():
    engine = Engine(interval_ms=20)
    srv = TickwireServer(engine, port=0, web=False).start()
    yield srv
    srv.stop()
    engine.stop()


def writer(srv, **options) -> TickwireStreamWriter:
    ds = TickwireDataSource({"uri": f"grpc://127.0.0.1:{srv.port}", "table": "px", **options})
    return ds.streamWriter(SCHEMA, False)


def test_tasks_stage_their_partitions_and_the_commit_publishes_the_batch_once(server, task):
    w = writer(server, mode="upsert", keys="Sym")
    msgs = []
    for part in range(3):
        task("query-1", 0, part, 100 + part)
        rows = [(f"S{part}{i}", f"{i}.25", part * 10 + i, i) for i in range(4)]
        msgs.append(w.write(iter([spark_batch(rows[:2]), spark_batch([]), spark_batch(rows[2:])])))
    assert msgs[1] == PartCommit("query-1", 0, "1", "101", 4)
    assert server.engine.resolve("px") is None  # staged, not published
    w.commit(msgs, 0)
    t = doget(server, "px")
    assert t.num_rows == 12
    assert t.schema.field("Ts").type.tz == "UTC" and t.schema.field("Seq").type == pa.int64()
    w.commit(msgs, 0)  # the driver commits again (its restart): acknowledged, nothing applied
    assert doget(server, "px").num_rows == 12
    # an empty partition stages nothing and is left out of the commit
    task("query-1", 1, 0, 200)
    empty = w.write(iter([spark_batch([])]))
    assert empty == PartCommit("query-1", 1, None, None, 0)
    w.commit([empty], 1)
    assert doget(server, "px").num_rows == 12


def test_one_session_per_process_however_many_tasks(server, task):
    w = writer(server)
    before = server.sessions.count
    for b in range(5):
        task("q-sessions", b, 0, b)
        w.commit([w.write(iter([spark_batch([("A", "1.00", b, 0)])]))], b)
    assert doget(server, "px").num_rows == 5
    assert server.sessions.count - before <= 2  # the writer's one (doget above opened one more)


def test_abort_discards_the_staged_parts(server, task):
    w = writer(server)
    task("q-abort", 3, 0, 7)
    msg = w.write(iter([spark_batch([("A", "1.00", 1, 0)])]))
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    assert staging_status(client)["bytes"] > 0
    w.abort([msg, None], 3)
    assert staging_status(client)["bytes"] == 0
    with pytest.raises(pa.ArrowException, match="is not staged"):
        w.commit([msg], 3)
    assert server.engine.resolve("px") is None


def test_bad_options_and_columns_fail_at_the_start_of_the_query(server):
    with pytest.raises(SparkSinkError, match="needs option 'table'"):
        TickwireDataSource({"uri": "grpc://x:1"}).streamWriter(SCHEMA, False)
    with pytest.raises(SparkSinkError, match="mode must be one of"):
        writer(server, mode="merge")
    with pytest.raises(SparkSinkError, match="uri must be grpc://host:port"):
        TickwireDataSource({"uri": "http://x:1", "table": "t"}).streamWriter(SCHEMA, False)
    with pytest.raises(SparkSinkError, match="delete column 'Seq' must be boolean"):
        writer(server, mode="upsert", keys="Sym", delete_column="Seq")
    from pyspark.sql.types import MapType
    with pytest.raises(SparkSinkError, match="'m'"):
        TickwireDataSource({"uri": f"grpc://127.0.0.1:{server.port}", "table": "t"}).streamWriter(
            StructType([StructField("m", MapType(StringType(), LongType()))]), False)


def test_a_server_refusal_fails_the_task_with_the_servers_message(server, task):
    task("q-bad", 0, 0, 1)
    w = writer(server, mode="upsert", keys="Sym")
    w.commit([w.write(iter([spark_batch([("A", "1.00", 1, 0)])]))], 0)
    other = writer(server)  # append into a keyed table
    task("q-bad2", 0, 0, 2)
    with pytest.raises(pa.ArrowException, match="mode 'append' needs an append table, but the table is a keyed table"):
        other.write(iter([spark_batch([("B", "2.00", 2, 0)])]))


def test_delete_column_and_ring_options(server, task):
    schema = StructType(list(SCHEMA.fields) + [StructField("gone", BooleanType())])
    ds = TickwireDataSource({"uri": f"grpc://127.0.0.1:{server.port}", "table": "kv", "mode": "upsert",
                             "keys": "Sym", "delete_column": "gone"})
    w = ds.streamWriter(schema, False)

    def rb(rows, gone):
        b = spark_batch(rows)
        return pa.RecordBatch.from_arrays(b.columns + [pa.array(gone)], names=b.schema.names + ["gone"])

    task("q-del", 0, 0, 1)
    w.commit([w.write(iter([rb([("A", "1.00", 1, 0), ("B", "2.00", 2, 0)], [False, False])]))], 0)
    task("q-del", 1, 0, 2)
    w.commit([w.write(iter([rb([("A", "1.00", 1, 0), ("C", "3.00", 3, 0)], [True, False])]))], 1)
    assert sorted(doget(server, "kv").column("Sym").to_pylist()) == ["B", "C"]
    ring = TickwireDataSource({"uri": f"grpc://127.0.0.1:{server.port}", "table": "ring", "max_rows": "3"}) \
        .streamWriter(SCHEMA, False)
    task("q-ring", 0, 0, 1)
    ring.commit([ring.write(iter([spark_batch([(f"R{i}", "1.00", i, 0) for i in range(5)])]))], 0)
    assert doget(server, "ring").column("Seq").to_pylist() == [2, 3, 4]


def test_psk_and_tls(tmp_path, task):
    cert, key = self_signed(tmp_path)
    engine = Engine(interval_ms=20)
    srv = TickwireServer(engine, port=0, web=False, psk="s3cret", tls_cert=cert, tls_key=key).start()
    try:
        base = {"uri": f"grpc+tls://localhost:{srv.port}", "table": "sec", "tls_root_certs": str(cert)}
        task("q-tls", 0, 0, 1)
        bad = TickwireDataSource({**base, "psk": "wrong"}).streamWriter(SCHEMA, False)
        with pytest.raises(fl.FlightUnauthenticatedError, match="wrong pre-shared key"):
            bad.write(iter([spark_batch([("A", "1.00", 1, 0)])]))
        w = TickwireDataSource({**base, "psk": "s3cret"}).streamWriter(SCHEMA, False)
        w.commit([w.write(iter([spark_batch([("A", "1.00", 1, 0)])]))], 0)
        c = fl.connect(f"grpc+tls://localhost:{srv.port}", tls_root_certs=cert.read_bytes())
        psk = fl.FlightCallOptions(headers=[(b"authorization", f"{datasource.PSK_AUTH} s3cret".encode())])
        t = c.do_get(fl.Ticket(b"s/sec"), options=psk).read_all()
        assert t.column("Sym").to_pylist() == ["A"]
        status = staging_status(c, psk)
        assert json.dumps(status) and status["bytes"] == 0
    finally:
        srv.stop()
        engine.stop()
