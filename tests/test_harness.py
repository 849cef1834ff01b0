"""The in-process harness itself: the services answer without a socket, the engine and the clock
move only when the test moves them, and errors arrive as statuses."""
from __future__ import annotations

import threading

import grpc
import pyarrow as pa

from tests.harness import Services, until
from tickwire.protocol.opening import subscription_request
from tickwire.protocol.proto import config_pb2, session_pb2, table_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE, SESSION_SERVICE, TABLE_SERVICE
from tickwire.protocol.tickets import ExportTicket
from tickwire.server.engine import TableSpec

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.string())])


def rows(keys, tag="x") -> pa.Table:
    return pa.table({"k": list(keys), "v": [f"{tag}{k}" for k in keys]}, schema=SCHEMA)


def test_a_subscription_follows_the_cycles_the_test_runs():
    with Services() as s:
        t = s.engine.create(TableSpec("t", "keyed", SCHEMA, keys=("k",)))
        s.write(t, rows(range(3)))
        s.cycle()
        sub = s.client().subscribe("t")
        # the client's clock is the test's: s.wait_for bounds the wait in real seconds instead
        assert s.wait_for(sub, lambda x: x.size == 3)
        s.write(t, rows([1, 7], "y"))
        s.write(t, delete=pa.table({"k": [0]}))
        seen = sub.update_count
        s.cycle()
        assert s.wait_for(sub, lambda x: x.update_count > seen)
        assert sorted(sub.table.to_pylist(), key=lambda r: r["k"]) == [
            {"k": 1, "v": "y1"}, {"k": 2, "v": "x2"}, {"k": 7, "v": "y7"}]
        assert s.engine.step == 2  # nothing ran a cycle but the test


def test_a_session_expires_when_the_clock_passes_its_lease_and_not_before():
    with Services(session_duration_ms=60_000) as s:
        token = s.new_session()
        s.advance(59)
        s.call(SESSION_SERVICE, "RefreshSessionToken", token=token)  # renews the lease: 60 s from now
        s.advance(59)
        assert s.sessions.reap() == 0
        s.advance(2)
        assert s.sessions.reap() == 1
        code, details = s.status(lambda: s.call(SESSION_SERVICE, "RefreshSessionToken", token=token))
        assert code == grpc.StatusCode.UNAUTHENTICATED and "expired" in details


def test_errors_are_statuses_and_credentials_come_first():
    with Services() as s:
        req = table_pb2.HeadOrTailRequest(num_rows=1)
        req.source_id.ticket.ticket = b"s/nope"
        req.result_id.ticket = ExportTicket(1).to_bytes()
        code, details = s.status(lambda: s.call(TABLE_SERVICE, "Head", req, metadata=()))
        assert code == grpc.StatusCode.UNAUTHENTICATED  # before the request is even looked at
        code, details = s.status(lambda: s.call(TABLE_SERVICE, "Head", req))
        assert code == grpc.StatusCode.NOT_FOUND and "'nope'" in details
        release = session_pb2.ReleaseRequest()
        release.id.ticket = ExportTicket(5).to_bytes()
        token = s.new_session()
        code, details = s.status(lambda: s.call(SESSION_SERVICE, "Release", release, token=token))
        assert code == grpc.StatusCode.UNAVAILABLE and details == "Export not yet defined"  # as Deephaven answers


def test_console_service_methods_say_there_is_no_scripting():
    """Deephaven's ConsoleService is answered by name (UNIMPLEMENTED, why), after the credentials
    check, instead of grpc's bare "Method not found!"."""
    from tickwire.protocol.proto.methods import CONSOLE_METHODS, CONSOLE_SERVICE

    with Services() as s:
        for name, kind in CONSOLE_METHODS.items():
            path = f"/{CONSOLE_SERVICE}/{name}"
            assert path in s.server.methods and s.server.methods[path].kind == kind
        path = f"/{CONSOLE_SERVICE}/GetConsoleTypes"
        call = s.channel().unary_unary(path)
        for metadata, want in (((), grpc.StatusCode.UNAUTHENTICATED), (None, grpc.StatusCode.UNIMPLEMENTED)):
            code, details = s.status(lambda md=metadata: call(b"", metadata=md if md is not None else
                                                               (("authorization", "Anonymous"),)))
            assert code == want, (code, details)
        assert "ConsoleService.GetConsoleTypes" in details and "no server-side scripting" in details


def test_raw_exchanges_puts_and_gets():
    """DoExchange, DoPut and DoGet as raw FlightData, as clients other than tickwire's send them."""
    with Services() as s:
        token = s.new_session()
        s.put(["scope", "t"], rows(range(4)), token=token, keys=["k"])  # a DoPut makes a keyed table
        s.cycle()
        assert s.doget(b"s/t", token=token).to_pylist() == rows(range(4)).to_pylist()
        ex = s.exchange(token=token)
        ex.send(subscription_request(b"s/t"))
        ex.wait(1)  # the snapshot (after the schema)
        assert ex.updates[0].metadata.is_snapshot and ex.updates[0].metadata.table_size == 4
        assert len(ex.payloads) >= 2  # the schema and the snapshot's FlightData, as sent
        s.put(["scope", "t"], rows([2], "y"), token=token)
        s.cycle()
        ex.wait(2)
        assert ex.updates[1].metadata.first_seq == s.engine.step
        ex.half_close()
        assert ex.ended() is None
        # errors are statuses: a refused upload, a refused exchange
        code, details = s.status(lambda: s.put_raw([b"\xff\xff"], token=token))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        bad = s.exchange(token=token)
        bad.send(subscription_request(b"s/nope"))
        assert bad.ended().code() == grpc.StatusCode.NOT_FOUND


def test_session_of_a_token():
    with Services() as s:
        _r, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants",
                                          config_pb2.ConfigurationConstantsRequest())
        bearer = dict(headers)["authorization"]
        session = s.session_of(bearer)
        assert session is not None and session.auth == "anonymous" and s.session_of(bearer.split()[-1]) is session
        s.call(SESSION_SERVICE, "CloseSession", session_pb2.HandshakeRequest(), token=bearer.split()[-1])
        assert s.session_of(bearer) is None and session.closed


def test_running_tasks_count_the_handlers_still_running():
    with Services() as s:
        t = s.engine.create(TableSpec("t", "append", SCHEMA))
        s.write(t, rows(range(3)))
        s.cycle()
        assert s.running_tasks() == 0
        ex = s.exchange()
        ex.send(subscription_request(b"s/t"))
        ex.wait(1)
        assert s.running_tasks() > 0  # the subscription's handler waits for the next cycle
        ex.cancel()  # over at once for the caller, a moment later for the handler
        # the handler ends and its subscription is let go (the two in either order: under load the
        # handler's count can reach 0 a moment before the registry has dropped the subscriber)
        assert until(lambda: s.running_tasks() == 0 and s.ctx.registry.subscriptions == [])


def test_down_cuts_the_streams_and_up_is_a_new_server_over_the_same_engine():
    with Services() as s:
        t = s.engine.create(TableSpec("t", "append", SCHEMA))
        s.write(t, rows(range(3)))
        s.cycle()
        token = s.new_session()
        ex = s.exchange(token=token)
        ex.send(subscription_request(b"s/t"))
        ex.wait(1)
        s.down()
        assert not s.is_up
        error = ex.ended()
        assert error.code() == grpc.StatusCode.UNAVAILABLE  # as a lost connection
        code, _ = s.status(lambda: s.new_session())
        assert code == grpc.StatusCode.UNAVAILABLE
        code, _ = s.status(lambda: s.doget(b"s/t"))  # streams too
        assert code == grpc.StatusCode.UNAVAILABLE
        s.write(t, rows([3]))
        s.cycle()
        s.up()
        # a new server: it knows no session of the old one, and serves the same engine
        code, _ = s.status(lambda: s.call(CONFIG_SERVICE, "GetConfigurationConstants", token=token))
        assert code == grpc.StatusCode.UNAUTHENTICATED
        assert s.doget(b"s/t").num_rows == 4
        assert s.ctx.registry.subscriptions == []


def test_a_client_follows_a_restart_on_the_tests_clock():
    """tickwire's client reconnects after its backoff, which runs on the test's clock: it tries
    again only when the test moves the clock (advance_until moves it until the client has)."""
    with Services() as s:
        t = s.engine.create(TableSpec("t", "keyed", SCHEMA, keys=("k",)))
        s.write(t, rows(range(3)))
        s.cycle()
        states: list[str] = []
        sub = s.client().subscribe("t", reconnect=True, on_connection=states.append, backoff=(10.0, 10.0))
        assert s.wait_for(sub, lambda x: x.size == 3)
        s.restart()
        assert until(lambda: states and states[-1].startswith("disconnected")), states
        assert "reconnecting" not in states  # nothing happens before the clock moves the backoff's 10 s
        assert s.advance_until(lambda: sub.reconnects == 1, 1.0)
        assert states[-1] == "connected"
        s.write(t, rows([9]))
        step = s.cycle()
        assert s.wait_for(sub, lambda x: x.last_seq == step and x.size == 4)


def test_advance_until_moves_the_clock_for_a_thread_that_waits_on_it():
    with Services() as s:
        woke = threading.Event()
        never = threading.Event()

        def sleeper() -> None:
            s.clock.wait(never, 5.0)
            woke.set()

        threading.Thread(target=sleeper, daemon=True).start()
        start = s.clock.monotonic()
        assert s.advance_until(woke.is_set, 0.5)
        assert s.clock.monotonic() - start >= 5.0


def test_background_runs_a_call_that_waits_on_the_clock():
    """An export id named before any call makes it is waited for on the engine's clock
    (export_wait_s): the call runs in the background while the test moves the clock."""
    with Services(export_wait_s=30.0) as s:
        token = s.new_session()
        timers = s.clock.pending
        call = s.background(lambda: s.status(lambda: s.doget(ExportTicket(7).to_bytes(), token=token)))
        assert until(lambda: s.session_of(token).waiting(7) == 1 and s.clock.pending > timers)
        assert not call.done()
        assert s.advance_until(call.done, 30.0)
        code, details = call.result()
        assert code == grpc.StatusCode.NOT_FOUND and "export 7" in details
