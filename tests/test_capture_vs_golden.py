"""tickwire's answers to the requests in the golden captures, recorded through the capture proxy
and compared with what Deephaven answered. Only the differences the spec allows are normalized
(tests/interop/compare.py: tokens, transport headers, server constants, status details, batch
splits, snapshot pieces, ticking values)."""
from __future__ import annotations

import time

import pyarrow.flight as fl
import pytest

from tickwire.server.adapters.demo import static_mixed
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

from .golden import GOLDEN
from .interop.capture import CaptureProxy
from .interop.compare import compare_captures, format_differences
from .waiting import wait_until

pytestmark = pytest.mark.interop


@pytest.fixture()
def proxied(tmp_path):
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("static_mixed", "static", data=static_mixed()))
    server = TickwireServer(engine, port=0, start_engine=False).start()
    out = tmp_path / "capture"
    with CaptureProxy(server.target, out) as proxy:
        yield proxy, out
    server.stop()


def _settle(proxy) -> None:
    """Waits for every recorded call's status: a call the client cancelled (a DoExchange) gets
    its status from the proxy's on_terminate callback, which runs after the client has moved on;
    flushed before it, index.json would record it UNFINISHED."""
    wait_until(lambda: not any(c["status"] == "UNFINISHED" for c in proxy.calls), 10)


def _compare(golden: str, out, calls):
    diffs = compare_captures(GOLDEN / golden, out, calls=calls)
    assert not diffs, format_differences(diffs)


def test_pyarrow_doget_of_static_mixed_matches_deephaven(proxied):
    proxy, out = proxied
    c = fl.FlightClient(f"grpc://{proxy.target}")
    got = c.do_get(fl.Ticket(b"s/static_mixed"), fl.FlightCallOptions(
        headers=[(b"authorization", b"Anonymous")])).read_all()
    c.close()
    assert got.num_rows == 1000
    proxy.flush()
    _compare("flight_doget", out, calls=[1])


def test_pydeephaven_open_table_to_arrow_matches_deephaven(proxied):
    from pydeephaven import Session

    proxy, out = proxied
    host, port = proxy.target.rsplit(":", 1)
    s = Session(host=host, port=int(port))
    try:
        assert s.open_table("static_mixed").to_arrow().num_rows == 1000
    finally:
        s.close()
    _settle(proxy)
    proxy.flush()
    # GetConfigurationConstants, FetchTable and DoGet of static_mixed (calls 1, 3, 4 of the golden run)
    _compare("pydeephaven", out, calls=[1, 3, 4])


def test_pydeephaven_ticking_subscription_to_static_mixed_matches_deephaven(proxied):
    from pydeephaven import Session
    from pydeephaven_ticking.table_listener import listen

    proxy, out = proxied
    host, port = proxy.target.rsplit(":", 1)
    s = Session(host=host, port=int(port))
    got = []
    try:
        h = listen(s.open_table("static_mixed"), got.append)
        h.start()
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.02)
        h.stop()
    finally:
        s.close()
    assert got
    _settle(proxy)
    proxy.flush()
    _compare("ticking_static_mixed", out, calls=["FlightService/DoExchange"])
