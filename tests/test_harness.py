"""The in-process harness itself: the services answer without a socket, the engine and the clock
move only when the test moves them, and errors arrive as statuses."""
from __future__ import annotations

import grpc
import pyarrow as pa

from tests.harness import Services
from tickwire.protocol.proto import session_pb2, table_pb2
from tickwire.protocol.proto.methods import SESSION_SERVICE, TABLE_SERVICE
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
        assert sub.wait_for(lambda x: x.size == 3, 30)
        s.write(t, rows([1, 7], "y"))
        s.write(t, delete=pa.table({"k": [0]}))
        seen = sub.update_count
        s.cycle()
        assert sub.wait_for(lambda x: x.update_count > seen, 30)
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
        assert code == grpc.StatusCode.NOT_FOUND and "export 5" in details


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
