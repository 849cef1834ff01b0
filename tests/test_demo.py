import subprocess
import sys

import numpy as np
import pytest

from tickwire.server.adapters.demo import DemoTicker, static_mixed
from tickwire.server.engine import Engine


def test_static_mixed_is_deterministic_with_nulls():
    a, b = static_mixed(), static_mixed()
    assert a.equals(b) and a.num_rows == 1000
    assert all(a.column(i).null_count > 0 for i in range(a.num_columns))


def test_ticker_feeds_every_table():
    engine = Engine()
    ticker = DemoTicker(engine, rows_per_tick=5)
    for _ in range(300):
        ticker.tick()
        engine.run_cycle()
    assert engine.resolve("ticking_append").size == 1500
    assert engine.resolve("ticking_keyed").size == 20
    assert engine.resolve("blink").size == 5
    assert engine.resolve("ticking_ring").size == 1000
    assert np.array_equal(engine.resolve("ticking_ring").to_arrow()["Seq"].to_numpy(), np.arange(500, 1500))


def test_append_rows_keeps_the_last_rows_of_the_append_table_and_what_follows_it():
    engine = Engine()
    ticker = DemoTicker(engine, rows_per_tick=5, append_rows=200)
    for _ in range(100):
        ticker.tick()
        engine.run_cycle()
    app = engine.resolve("ticking_append")
    assert np.array_equal(app.to_arrow()["Seq"].to_numpy(), np.arange(300, 500))
    latest = engine.resolve("ticking_sorted").to_arrow()
    tail = app.to_arrow().group_by("Sym").aggregate([("Seq", "max")])
    assert dict(zip(latest["Sym"].to_pylist(), latest["Seq"].to_pylist())) == \
        dict(zip(tail["Sym"].to_pylist(), tail["Seq_max"].to_pylist()))


def test_demo_command_runs_and_stops_cleanly():
    r = subprocess.run([sys.executable, "-m", "tickwire", "demo", "--no-spark", "--no-server", "--duration", "1.5",
                        "--interval-ms", "50", "--status-interval", "0.5"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "ticking_keyed=20" in r.stdout and "stopped" in r.stdout  # the status lines, asked for


def test_demo_serves_every_table_and_stops_on_ctrl_c_with_exit_code_0():
    import re
    import signal
    import time

    import pyarrow.flight as fl

    p = subprocess.Popen([sys.executable, "-m", "tickwire", "demo", "--no-spark", "--port", "0", "--interval-ms", "50"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            lines.append(line)
            if "Ctrl-C stops" in line or not line:
                break
        m = re.search(r"serving on ([\d.]+):(\d+)", "".join(lines))
        assert m, "".join(lines)
        client = fl.FlightClient(f"grpc://{m.group(1)}:{m.group(2)}")
        opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        names = {i.descriptor.path[1].decode() for i in client.list_flights(options=opts)}
        assert {"static_mixed", "big_static", "ticking_append", "ticking_keyed", "blink", "ticking_ring"} <= names
        assert client.do_get(fl.Ticket(b"s/static_mixed"), opts).read_all().equals(static_mixed(), check_metadata=False)
        big = client.do_get(fl.Ticket(b"s/big_static"), opts).read_all()
        assert big.num_rows == 1_000_000 and big.num_columns == 5
        client.close()
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    assert "stopped" in out


def test_serve_command_starts_and_stops():
    r = subprocess.run([sys.executable, "-m", "tickwire", "serve", "--port", "0", "--duration", "1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "serving on 127.0.0.1:" in r.stdout and "stopped" in r.stdout
    assert "static_mixed" not in r.stdout and "no tables yet" in r.stdout  # serve advertises no demo tables


@pytest.mark.slow
def test_demo_with_spark_serves_the_spark_tables_and_stops_on_ctrl_c():
    """`tickwire demo` (what `make demo` runs) with its Spark pipeline: the Spark-fed tables are
    served and ticking, the tables of the Python ticker keep their names, and Ctrl-C stops the Spark
    queries and the server with exit code 0, printing no Java or Python stack and no error (Spark's
    queries end between batches: one stopped mid-batch had Spark log what it killed, such as
    "Memory was leaked by query")."""
    import os
    import re
    import signal
    import time

    from tickwire.clients.client import BarrageClient
    from tickwire.server.adapters.spark.pipeline_demo import spark_available

    if spark_available():
        pytest.skip(spark_available())
    p = subprocess.Popen([sys.executable, "-m", "tickwire", "demo", "--port", "0", "--interval-ms", "50"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            lines.append(line)
            if "Ctrl-C stops" in line or not line:
                break
        text = "".join(lines)
        m = re.search(r"serving on ([\d.]+):(\d+)", text)
        assert m and "Spark tables" in text, text
        spark_tables = {"spark_trades", "spark_recent", "spark_ticks", "spark_latest", "spark_totals"}
        with BarrageClient(f"{m.group(1)}:{m.group(2)}") as client:
            # a Spark table appears with its first micro-batch
            end = time.monotonic() + 60
            while not spark_tables <= set(client.tables()) and time.monotonic() < end:
                time.sleep(0.2)
            assert spark_tables | {"static_mixed", "ticking_keyed", "blink", "ticking_ring"} <= set(client.tables())
            sub = client.subscribe("spark_latest")
            assert sub.wait_for(lambda s: s.update_count >= 3 and s.size > 0, timeout=60), sub.error
            latest = sub.table
            assert {"Sym", "Last", "Volume", "VWAP"} <= set(latest.column_names)
            assert latest.column("Sym").unique().to_pylist() == latest.column("Sym").to_pylist()  # one row a symbol
            sub.close()
            assert client.snapshot("spark_trades").num_rows > 0
        os.killpg(p.pid, signal.SIGINT)  # as Ctrl-C in a terminal: to the demo, Spark's JVM and its workers
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    out = text + out
    assert p.returncode == 0, out[-3000:]
    assert "tickwire demo: stopped" in out
    assert "StackOverflowError" not in out
    failure = ("Traceback", "Exception", "ERROR", "leaked")
    stacks = [ln for ln in out.splitlines() if re.match(r"\s+at [\w$.]+\(", ln) or any(w in ln for w in failure)]
    assert not stacks, "\n".join(stacks[:20]) + "\n--- the demo printed:\n" + out[-3000:]
