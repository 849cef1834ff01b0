"""Forwarding (tickwire.server.services.forward): a call made through a Forwarder answers what the
target answers.

A tickwire server (gRPC on its own port) serves a keyed table; a grpc.aio server in front of it
forwards every call. Deephaven's own pydeephaven and tickwire's BarrageClient work through it
unmodified: sessions and their exports are the target's (tokens pass as metadata), table
operations, DoPut and DoGet give the target's results, a Barrage subscription follows the
target's updates and ends on the target when its client closes it. Errors keep their code and
details; a target that cannot be reached answers UNAVAILABLE naming it.
"""
from __future__ import annotations

import asyncio
import socket
import threading
from typing import Iterator

import grpc
import pyarrow as pa
import pytest

from tests.harness import QUOTES, quotes_server, until
from tickwire.clients.client import BarrageClient
from tickwire.protocol.opening import exchange_opening, subscription_request
from tickwire.protocol.proto.methods import FLIGHT_SERVICE, TABLE_SERVICE
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine
from tickwire.server.services.forward import Forwarder, passed_metadata

pydeephaven = pytest.importorskip("pydeephaven")

SCHEMA = QUOTES


class Front:
    """A grpc.aio server that forwards every call to `target`, on a loop of its own."""

    def __init__(self, target: str, **options):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.forwarder = Forwarder(target, **options)
        self.port = self._run(self._start())
        self.target = f"127.0.0.1:{self.port}"

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    async def _start(self) -> int:
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers([self.forwarder])
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return port

    def close(self) -> None:
        async def stop():
            await self.server.stop(None)
            await self.forwarder.close()
        self._run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture(scope="module")
def target() -> Iterator[tuple[Engine, TickwireServer]]:
    with quotes_server() as (engine, srv):
        yield engine, srv


@pytest.fixture(scope="module")
def front(target) -> Iterator[Front]:
    f = Front(target[1].target)
    yield f
    f.close()


def _session(target: str):
    host, port = target.rsplit(":", 1)
    return pydeephaven.Session(host=host, port=int(port))


def test_pydeephaven_works_through_the_forwarder(target, front):
    engine, srv = target
    s = _session(front.target)
    try:
        quotes = s.open_table("quotes").to_arrow()
        assert quotes.sort_by("Sym").column("Px").to_pylist() == [1.0, 2.0, 3.0]
        # a table operation on an export of the target's session, then its DoGet
        made = s.empty_table(5).update(["X = i * 2"]).to_arrow()
        assert made.column("X").to_pylist() == [0, 2, 4, 6, 8]
        # DoPut: the uploaded table is an export of that session on the target
        up = s.import_table(pa.table({"N": pa.array([7, 8, 9], pa.int64())}))
        assert up.update(["M = N + 1"]).to_arrow().column("M").to_pylist() == [8, 9, 10]
        # the session is the target's: it holds it while the client does
        assert srv.sessions.count >= 1
    finally:
        s.close()


def test_a_subscription_through_the_forwarder_follows_the_target_and_ends_there(target, front):
    engine, srv = target
    t = engine.resolve("quotes")
    before = len(srv.registry.subscriptions)
    with BarrageClient(front.target) as client:
        sub = client.subscribe("quotes")
        assert sub.wait_for(lambda s: s.size == 3, 20)
        assert len(srv.registry.subscriptions) == before + 1
        engine.write(t, pa.table({"Sym": ["B", "D"], "Px": [20.0, 4.0]}, schema=SCHEMA))
        assert sub.wait_for(lambda s: s.size == 4 and 20.0 in s.table.column("Px").to_pylist(), 20)
        sub.close()
        # the client's cancel reaches the target: its subscriber goes
        assert until(lambda: len(srv.registry.subscriptions) == before, 20)


def _fetch_unknown(target: str) -> grpc.RpcError:
    with grpc.insecure_channel(target) as ch:
        call = ch.unary_unary(f"/{TABLE_SERVICE}/FetchTable")
        with pytest.raises(grpc.RpcError) as err:
            call(b"", timeout=20)
    return err.value


def test_errors_keep_their_code_and_details(target, front):
    direct = _fetch_unknown(target[1].target)
    forwarded = _fetch_unknown(front.target)
    assert direct.code() == grpc.StatusCode.UNAUTHENTICATED  # no session: refused before anything else
    assert (forwarded.code(), forwarded.details()) == (direct.code(), direct.details())


def test_an_unreachable_target_answers_unavailable_naming_it():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    f = Front(dead)
    try:
        err = _fetch_unknown(f.target)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert f"forwarding to {dead}" in err.details()
    finally:
        f.close()


def test_passed_metadata_drops_what_belongs_to_one_hop():
    md = [(":authority", "x"), ("authorization", "Bearer abc"), ("grpc-timeout", "1S"), ("user-agent", "u"),
          ("content-type", "application/grpc"), ("x-custom-bin", b"\x00\x01"), ("Deephaven_Session", "s")]
    assert passed_metadata(md) == [("authorization", "Bearer abc"), ("x-custom-bin", b"\x00\x01"),
                                   ("deephaven_session", "s")]
    assert passed_metadata(None) == []


def test_a_client_that_cancels_cancels_the_forwarded_call(target, front):
    _engine, srv = target
    before = len(srv.registry.subscriptions)
    hold = threading.Event()

    def requests():
        yield from exchange_opening(subscription_request(b"s/quotes"))
        hold.wait(30)  # never half-closes: only the cancel can end the call

    with grpc.insecure_channel(front.target) as ch:
        call = ch.stream_stream(f"/{FLIGHT_SERVICE}/DoExchange")(requests(), metadata=(("authorization", "Anonymous"),))
        next(call)  # the schema: the target has subscribed
        assert len(srv.registry.subscriptions) == before + 1
        call.cancel()
        assert until(lambda: len(srv.registry.subscriptions) == before, 20)
    hold.set()


def test_a_refused_stream_keeps_the_target_status_when_its_requests_are_held(target):
    """A DoExchange without credentials: tickwire refuses it before reading. Passed on at once, its
    requests could meet the refusal and grpcio would report INTERNAL instead; held until the
    target's headers, none is sent under a call already refused."""
    f = Front(target[1].target, hold=[f"/{FLIGHT_SERVICE}/DoExchange"])
    try:
        for _ in range(20):
            hold = threading.Event()

            def requests(hold: threading.Event = hold):
                yield from exchange_opening(subscription_request(b"s/quotes"))
                hold.wait(20)

            with grpc.insecure_channel(f.target) as ch:
                call = ch.stream_stream(f"/{FLIGHT_SERVICE}/DoExchange")(requests(), timeout=20)
                with pytest.raises(grpc.RpcError) as err:
                    for _ in call:
                        pass
            hold.set()
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value.details()
    finally:
        f.close()
