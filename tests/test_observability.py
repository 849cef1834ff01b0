"""Health and metrics (tickwire.server.observability): the standard gRPC health service checked
with grpcio-health-checking's own client stub, `/healthz`, and `/metrics` scraped and parsed with
prometheus-client's parser while traffic moves its counters."""
from __future__ import annotations

import os
import threading
import urllib.error
import urllib.request

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.flight as fl
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from tests import waiting
from tickwire.clients.client import BarrageClient, ClientError
from tickwire.server.app import TickwireServer
from tickwire.server.config import ServerConfig
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.process_memory import malloc_figures

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.int64()), ("y", pa.int64())])
ANON = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")], timeout=30)


def rows(start: int, n: int, y: int = 2) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 3, "y": np.full(n, y, dtype=np.int64)}, schema=SCHEMA)


def check(target: str, service: str = "") -> int:
    """A Check with grpcio-health-checking's stub, without credentials."""
    with grpc.insecure_channel(target) as ch:
        return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def http(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def scrape(url: str) -> dict[str, float]:
    """{sample name with sorted labels: value} of a /metrics page, parsed by prometheus-client."""
    status, text = http(url)
    assert status == 200
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def wait_until(predicate, timeout: float = 10.0) -> bool:
    return waiting.wait_until(predicate, timeout)


# ----------------------------------------------------------------------------------------------
# health
# ----------------------------------------------------------------------------------------------

def test_health_is_not_serving_until_the_first_cycle_and_needs_no_credentials():
    engine = Engine(interval_ms=3_600_000)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    srv = TickwireServer(engine, port=0, psk="secret", start_engine=False).start()  # every other call needs the key
    try:
        assert check(srv.target) == NOT_SERVING
        assert check(srv.target, "arrow.flight.protocol.FlightService") == NOT_SERVING
        assert http(f"{srv.web_url}/healthz") == (503, "NOT_SERVING\n")
        with pytest.raises(grpc.RpcError) as err:
            check(srv.target, "tickwire.table/src")  # table names appear with the first cycle
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        engine.write(src, rows(0, 3), wait=False)
        engine.run_cycle()
        assert check(srv.target) == SERVING
        assert check(srv.target, "arrow.flight.protocol.FlightService") == SERVING
        assert check(srv.target, "tickwire.table/src") == SERVING
        assert http(f"{srv.web_url}/healthz") == (200, "SERVING\n")
        assert http(f"{srv.web_url}/healthz?service=tickwire.table/src") == (200, "SERVING\n")
        assert http(f"{srv.web_url}/healthz?service=nope")[0] == 404
        with pytest.raises(grpc.RpcError) as err:
            check(srv.target, "no.such.Service")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        srv.stop()
        engine.stop()


def test_a_server_on_an_engine_that_already_ran_serves_at_once():
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("src", "append", SCHEMA))
    engine.run_cycle()
    with TickwireServer(engine, port=0, start_engine=False, web=False) as srv:
        assert check(srv.target) == SERVING


def test_health_turns_not_serving_first_when_the_server_stops():
    engine = Engine(interval_ms=20)
    srv = TickwireServer(engine, port=0).start()
    assert wait_until(lambda: check(srv.target) == SERVING)
    seen: list[int] = []
    first = threading.Event()
    turned = threading.Event()
    ch = grpc.insecure_channel(srv.target)
    call = health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service=""), timeout=30)

    def watch():
        try:
            for resp in call:
                seen.append(resp.status)
                first.set()
                if resp.status == NOT_SERVING:
                    turned.set()
                    return
        except grpc.RpcError:
            pass

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert first.wait(10)
    stopper = threading.Thread(target=srv.stop)
    stopper.start()
    assert turned.wait(10), seen  # the Watch stream heard NOT_SERVING before the server went away
    call.cancel()
    stopper.join(30)
    ch.close()
    assert seen == [SERVING, NOT_SERVING]
    assert srv.observability.health.status("") == NOT_SERVING
    engine.stop()


def test_a_failed_derived_table_has_a_not_serving_table_name():
    engine = Engine(interval_ms=3_600_000)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, rows(0, 5), wait=False)
    engine.run_cycle()
    bad = src.where(pc.greater(pc.divide_checked(pc.field("x"), pc.field("y")), 1), name="bad")
    child = bad.head(3, name="child")
    srv = TickwireServer(engine, port=0, start_engine=False).start()
    try:
        engine.run_cycle()
        assert [check(srv.target, f"tickwire.table/{n}") for n in ("src", "bad", "child")] == [SERVING] * 3
        engine.write(src, rows(100, 1, y=0), wait=False)  # a zero divisor: the formula raises, `bad` fails with `child`
        engine.run_cycle()
        assert bad.failure is not None and child.failure is not None
        assert check(srv.target, "tickwire.table/bad") == NOT_SERVING
        assert check(srv.target, "tickwire.table/child") == NOT_SERVING
        assert check(srv.target, "tickwire.table/src") == SERVING
        assert check(srv.target) == SERVING  # the server itself still serves
        assert http(f"{srv.web_url}/healthz?service=tickwire.table/bad") == (503, "NOT_SERVING\n")
        m = scrape(f"{srv.web_url}/metrics")
        assert m["tickwire_table_failed{table=bad}"] == 1 and m["tickwire_table_failed{table=src}"] == 0
    finally:
        srv.stop()
        engine.stop()


def test_a_durable_table_whose_storage_refuses_writes_has_a_not_serving_table_name(tmp_path, monkeypatch):
    import errno

    from tickwire.server.engine import IngestError

    engine = Engine(interval_ms=20)
    engine.open_storage(tmp_path)
    kept, _ = engine.get_or_create(TableSpec("kept", "append", SCHEMA))
    mem, _ = engine.get_or_create(TableSpec("mem", "append", SCHEMA, durable=False))
    srv = TickwireServer(engine, port=0).start()
    try:
        engine.write(kept, rows(0, 5))
        assert wait_until(lambda: check(srv.target, "tickwire.table/kept") == SERVING)
        assert check(srv.target, "tickwire.table/mem") == SERVING

        data_dir = str(tmp_path.resolve())
        real_write = os.write

        def full_disk(fd, data):  # the data directory's disk is full from now on
            if os.path.realpath(f"/proc/self/fd/{fd}").startswith(data_dir + os.sep):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real_write(fd, data)

        monkeypatch.setattr(os, "write", full_disk)
        with pytest.raises(IngestError, match="could not be written"):
            engine.write(kept, rows(5, 5))
        assert kept.refusal is not None
        assert wait_until(lambda: check(srv.target, "tickwire.table/kept") == NOT_SERVING)
        assert http(f"{srv.web_url}/healthz?service=tickwire.table/kept") == (503, "NOT_SERVING\n")
        engine.write(mem, rows(0, 3))  # the others go on
        assert check(srv.target, "tickwire.table/mem") == SERVING
        assert check(srv.target) == SERVING
    finally:
        srv.stop()
        engine.stop()


# ----------------------------------------------------------------------------------------------
# metrics
# ----------------------------------------------------------------------------------------------

def test_metrics_move_with_traffic():
    engine = Engine(interval_ms=20)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, rows(0, 1000), wait=False)
    srv = TickwireServer(engine, port=0).start()
    url = f"{srv.web_url}/metrics"
    client = BarrageClient(srv.target)
    flight = fl.FlightClient(f"grpc://{srv.target}")
    try:
        assert wait_until(lambda: scrape(url).get("tickwire_table_rows_in_total{table=src}") == 1000)
        before = scrape(url)
        assert before["tickwire_cycles_total"] >= 1 and before["tickwire_cycle_duration_seconds_count"] >= 0
        assert before["tickwire_table_rows{table=src}"] == 1000
        assert before["tickwire_resident_bytes"] > 0 and before["tickwire_python_allocated_blocks"] > 0
        assert before["tickwire_arrow_allocated_bytes"] >= 0
        if malloc_figures() is not None:  # glibc: the C heap, held and freed-but-kept
            assert before["tickwire_malloc_in_use_bytes"] > 0 and before["tickwire_malloc_free_bytes"] >= 0
        assert before["tickwire_threads{name=tickwire-update-graph}"] == 1  # threads by name

        # DoGet: count, rows and bytes
        assert client.snapshot("src").num_rows == 1000
        m = scrape(url)
        assert m["tickwire_doget_requests_total"] == before["tickwire_doget_requests_total"] + 1
        assert m["tickwire_doget_rows_total"] == before["tickwire_doget_rows_total"] + 1000
        assert m["tickwire_doget_bytes_total"] >= before["tickwire_doget_bytes_total"] + 1000 * 3 * 8

        # subscriptions by kind, messages and bytes sent to them
        full = client.subscribe("src")
        vp = client.subscribe("src", viewport=[(0, 9)])
        assert full.wait_for(lambda s: s.size == 1000, 30) and vp.wait_for(lambda s: s.table.num_rows == 10, 30)
        m = scrape(url)
        assert m["tickwire_subscriptions{kind=full}"] == 1 and m["tickwire_subscriptions{kind=viewport}"] == 1
        sent = m["tickwire_exchange_messages_sent_total"]
        sent_bytes = m["tickwire_exchange_bytes_sent_total"]
        updates = m["tickwire_subscription_updates_total"]
        assert sent >= 4 and sent_bytes > 1000 * 3 * 8 and updates >= 2

        # rows in (by the engine's cycles) and to the subscribers
        engine.write(src, rows(1000, 500), wait=False)
        assert full.wait_for(lambda s: s.size == 1500, 30)
        assert wait_until(lambda: scrape(url)["tickwire_exchange_messages_sent_total"] > sent)
        m = scrape(url)
        assert m["tickwire_table_rows_in_total{table=src}"] == 1500
        assert m["tickwire_table_rows{table=src}"] == 1500
        assert m["tickwire_exchange_bytes_sent_total"] > sent_bytes
        assert m["tickwire_subscription_updates_total"] > updates

        # DoPut: count, rows, bytes; the new table's rows in
        writer, _reader = flight.do_put(fl.FlightDescriptor.for_path("scope", "uploaded"), SCHEMA, options=ANON)
        writer.write_table(rows(0, 200))
        writer.close()
        m = scrape(url)
        assert m["tickwire_doput_requests_total"] == before["tickwire_doput_requests_total"] + 1
        assert m["tickwire_doput_rows_total"] == 200 and m["tickwire_doput_bytes_total"] > 200 * 3 * 8
        assert wait_until(lambda: scrape(url).get("tickwire_table_rows_in_total{table=uploaded}") == 200)

        # errors by status code
        with pytest.raises(ClientError):
            client.snapshot("no_such_table")
        m = scrape(url)
        assert m["tickwire_grpc_errors_total{code=NOT_FOUND}"] >= 1

        # sessions; subscriptions that end stay in the totals
        assert m["tickwire_sessions"] >= 2
        full.close()
        vp.close()
        assert wait_until(lambda: scrape(url)["tickwire_subscriptions{kind=full}"] == 0)
        m = scrape(url)
        assert m["tickwire_subscriptions{kind=viewport}"] == 0
        assert m["tickwire_subscription_updates_total"] >= updates
        assert m["tickwire_cycle_duration_seconds_count"] >= 1 and m["tickwire_cycle_lag_seconds"] >= 0
    finally:
        flight.close()
        client.close()
        srv.stop()
        engine.stop()


def test_snapshot_pieces_and_rows_out_move_with_traffic():
    engine = Engine(interval_ms=20)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, rows(0, 1000), wait=False)
    # 300 cells a piece: a full subscriber's initial snapshot of 1000 rows of 3 columns comes in 10 pieces
    srv = TickwireServer(engine, port=0, config=ServerConfig(min_piece_cells=300, max_piece_cells=300)).start()
    url = f"{srv.web_url}/metrics"
    client = BarrageClient(srv.target)
    try:
        assert wait_until(lambda: scrape(url).get("tickwire_table_rows_in_total{table=src}") == 1000)
        m = scrape(url)
        assert m["tickwire_snapshot_pieces_total"] == 0 and "tickwire_table_rows_out_total{table=src}" not in m

        assert client.snapshot("src").num_rows == 1000  # DoGet
        assert scrape(url)["tickwire_table_rows_out_total{table=src}"] == 1000

        full = client.subscribe("src")
        vp = client.subscribe("src", viewport=[(0, 9)])
        assert full.wait_for(lambda s: s.size == 1000, 30) and vp.wait_for(lambda s: s.table.num_rows == 10, 30)
        m = scrape(url)
        assert m["tickwire_table_rows_out_total{table=src}"] == 1000 + 1000 + 10
        assert m["tickwire_snapshot_pieces_total"] == 10 + 1
        assert full.update_count == 10  # the pieces reached the client one message each

        assert client.snapshot("src", viewport=[(0, 4)]).num_rows == 5  # a snapshot request
        m = scrape(url)
        assert m["tickwire_snapshot_pieces_total"] == 12
        assert m["tickwire_table_rows_out_total{table=src}"] == 2015

        engine.write(src, rows(1000, 500), wait=False)  # to the full subscriber only: the viewport's rows stay
        assert full.wait_for(lambda s: s.size == 1500, 30)
        assert wait_until(lambda: scrape(url)["tickwire_table_rows_out_total{table=src}"] == 2515)
        full.close()
        vp.close()
        assert wait_until(lambda: scrape(url)["tickwire_subscriptions{kind=full}"] == 0)
        m = scrape(url)  # subscriptions that ended stay in the totals
        assert m["tickwire_table_rows_out_total{table=src}"] == 2515 and m["tickwire_snapshot_pieces_total"] == 12
    finally:
        client.close()
        srv.stop()
        engine.stop()


def test_unauthenticated_calls_are_counted_by_status():
    with Engine(interval_ms=50) as engine, TickwireServer(engine, port=0, psk="secret") as srv:
        with pytest.raises(ClientError):
            BarrageClient(srv.target, psk="wrong").snapshot("x")
        m = scrape(f"{srv.web_url}/metrics")
        assert m["tickwire_grpc_errors_total{code=UNAUTHENTICATED}"] >= 1


def test_metrics_and_healthz_on_the_metrics_port_without_a_web_side():
    engine = Engine(interval_ms=20)
    src = engine.create(TableSpec("src", "append", SCHEMA))
    engine.write(src, rows(0, 10), wait=False)
    srv = TickwireServer(engine, port=0, web=False, metrics_port=0).start()
    try:
        assert srv.web_url is None and srv.metrics_port not in (None, 0, srv.port)
        base = f"http://127.0.0.1:{srv.metrics_port}"
        assert wait_until(lambda: http(f"{base}/healthz") == (200, "SERVING\n"))
        assert wait_until(lambda: scrape(f"{base}/metrics").get("tickwire_table_rows_in_total{table=src}") == 10)
        with BarrageClient(srv.target) as client:
            client.snapshot("src")
        assert scrape(f"{base}/metrics")["tickwire_doget_requests_total"] == 1
    finally:
        srv.stop()
        engine.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=2)


def test_each_server_has_its_own_registry():
    a = TickwireServer(Engine(interval_ms=20), port=0, web=False)
    b = TickwireServer(Engine(interval_ms=20), port=0, web=False)
    assert a.observability.metrics.registry is not b.observability.metrics.registry
    a.observability.counters.doget_requests += 5
    text = b.observability.metrics.exposition().decode()
    assert "tickwire_doget_requests_total 0.0" in text
