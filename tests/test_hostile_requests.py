"""Requests an untrusted client may send: each is answered with a clear status and a short
message, without work beyond what the named table justifies, and without holding up anyone else.

Huge viewports are clipped to the table, never expanded; oversize messages and column sets are
refused before any work proportional to them; credentials are checked before a body is parsed;
a refused upload leaves nothing behind; subscribers that stop reading share one copy of their
initial snapshot.

The services answer in process (tests.harness.Services) over an engine the test steps; what needs
the real transport stays on sockets: grpcio's inbound message limit, pyarrow.flight's uploads, and
subscribers held back by HTTP/2 flow control. How long the answers take and what stalled subscribers
cost in memory are measured by bench/bench_hostile.py and bench/bench_memory.py."""
from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tests import stalled_clients
from tests.harness import ANONYMOUS as ANON
from tests.harness import Exchange, Services, until
from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.proto import flight_pb2
from tickwire.protocol.proto.methods import ALL_METHODS, CLIENT_STREAM, FLIGHT_SERVICE, METHODS, SERVER_STREAM, UNARY
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec
from tickwire.server.services.rpc import UNAUTHENTICATED_METHODS
from tickwire.server.services.sessions import PSK_SCHEME

FLIGHT = "/arrow.flight.protocol.FlightService/"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(start: int, n: int, version: int = 0) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 1.5 + version, "s": pa.array([f"r{x}" for x in k.tolist()])}, schema=SCHEMA)


def sub_request(ticket=b"s/keyed", viewport=None, columns=None) -> bytes:
    return barrage.wrap(barrage.SubscriptionRequest(
        ticket=ticket, viewport=None if viewport is None else np.array(viewport, dtype=np.int64).reshape(-1, 2),
        columns=columns, options=barrage.SubscriptionOptions()))


@pytest.fixture()
def ticking():
    """A keyed table of 10,000 rows in an engine the test steps (`tick(s)` changes 5 rows and runs
    a cycle), under the services in process."""
    with Services() as s:
        keyed = s.engine.create(TableSpec("keyed", "keyed", SCHEMA, keys=["k"]))
        s.write(keyed, rows(0, 10_000))
        s.cycle()
        yield s


def tick(s: Services, version: int) -> int:
    """Changes 5 rows of `keyed` and runs a cycle; returns the step."""
    s.write(s.engine.resolve("keyed"), rows(version * 5 % 10_000, 5, version=version))
    return s.cycle()


def _steps(ex) -> list[tuple[int, int]]:
    return [(u.metadata.first_seq, u.metadata.last_seq) for u in ex.updates]


@pytest.mark.parametrize("far", [2**40, 2**62])
def test_a_huge_viewport_answers_with_the_clipped_rows_and_nobody_waits(ticking, far):
    s = ticking
    healthy = s.exchange()
    healthy.send(sub_request())
    healthy.wait(1)
    hostile = s.exchange()
    hostile.send(sub_request(viewport=[[0, 0], [2, far]]))
    steps = [tick(s, 1)]  # the table changes while the hostile request is answered
    hostile.wait(1)
    healthy.wait(2)
    first = hostile.updates[0]
    n = first.metadata.table_size
    assert n == 10_000
    # the viewport is rows of the table: positions 0 and 2..n-1, the client's window rows 0..n-2
    assert first.metadata.effective_viewport.tolist() == [[0, 0], [2, far]]
    assert first.metadata.added_rows.tolist() == [[0, n - 2]]
    # the snapshot sent is the table's rows in the window, no more: the requested 2^40 or 2^62 rows
    # were never expanded
    keys = np.asarray(first.added[0])
    assert keys[0] == 0 and keys[1] == 2 and len(keys) == n - 1
    assert [len(c) for c in first.added] == [n - 1] * 3
    # the viewport keeps working as the table ticks, and the healthy subscriber gets every step, each
    # on its own: nothing it waited for was held up by the hostile request (it reads each step before
    # the next cycle runs; a subscriber slower than the cycles would rightly get them coalesced)
    for v in range(2, 6):
        steps.append(tick(s, v))
        healthy.wait(1 + len(steps))
    hostile.wait(3)
    assert _steps(healthy)[1:] == [(st, st) for st in steps]
    assert hostile.error is None and healthy.error is None
    assert hostile.updates[-1].metadata.table_size == n
    hostile.cancel()
    healthy.cancel()


def test_a_huge_viewport_snapshot_request_is_clipped(ticking):
    ex = ticking.exchange()
    ex.send(barrage.wrap(barrage.SnapshotRequest(ticket=b"s/keyed", viewport=np.array([[5, 2**62]]))))
    ex.wait(1)
    # the rows of the table in the window, no more: 2^62 rows were never expanded
    got = np.asarray(ex.updates[0].added[0])
    assert got.tolist() == list(range(5, 10_000))
    assert ex.updates[0].metadata.added_rows_included.tolist() == [[5, 9_999]]
    ex.cancel()


def test_column_sets_are_checked_in_one_pass_with_a_short_message(ticking):
    # a 1 MB bitset with every bit set: 8 million column indices for a 3-column table, then 4096
    for cols in (np.arange(8 * 1024 * 1024, dtype=np.int64), np.arange(3, 4099, dtype=np.int64)):
        ex = ticking.exchange()
        ex.send(sub_request(columns=cols))
        error = ex.ended()
        assert error is not None, "the request was not refused"
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = error.details()
        assert len(details) < 300, details
        assert "out of range for a table of 3 columns" in details and "more" in details
        assert f"and {len(cols[cols >= 3]) - 5} more" in details  # every offender counted, five named
    assert ticking.ctx.registry.subscriptions == []  # refused before anything was subscribed


def test_an_oversize_message_is_refused_before_it_is_read_whole():
    """On a socket: grpcio's inbound message limit (max_inbound_message_size)."""
    engine = Engine(interval_ms=3_600_000)
    engine.create(TableSpec("t", "static", data=rows(0, 10)))
    srv = TickwireServer(engine, port=0, start_engine=False, max_inbound_message_size=1 << 20).start()
    try:
        with grpc.insecure_channel(srv.target, options=[("grpc.max_send_message_length", -1)]) as ch:
            ex = Exchange(ch)
            ex.send_raw(encode_flight_data(b"", b"\0" * (4 << 20)))  # 4 MiB of app_metadata
            error = ex.ended()
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # grpcio's limit, before the handler
            # the server keeps serving
            get = ch.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
            assert len(list(get(flight_pb2.Ticket(ticket=b"s/t"), metadata=ANON))) == 2
    finally:
        srv.stop()
    with pytest.raises(ValueError):
        TickwireServer(engine, port=0, max_inbound_message_size=0)


# -- credentials first, then the body ---------------------------------------------------------------------------

def _call(channel, path: str, body: bytes, metadata, timeout=30.0):
    """Calls a method with a raw body; returns (code, details)."""
    kind = ALL_METHODS[path].kind if path in ALL_METHODS else UNARY
    try:
        if kind == UNARY:
            channel.unary_unary(path)(body, metadata=metadata, timeout=timeout)
        elif kind == SERVER_STREAM:
            list(channel.unary_stream(path)(body, metadata=metadata, timeout=timeout))
        elif kind == CLIENT_STREAM:
            channel.stream_unary(path)(iter([body]), metadata=metadata, timeout=timeout)
        else:
            list(channel.stream_stream(path)(iter([body]), metadata=metadata, timeout=timeout))
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


GARBAGE = b"\xff\xff\xff\xff\x0f"  # a truncated varint: not a valid protobuf message of any type


def test_malformed_bodies_answer_invalid_argument_naming_the_message_type():
    with Services() as s:
        s.engine.create(TableSpec("t", "static", data=rows(0, 10)))
        ch = s.channel()
        checked = 0
        for path, m in METHODS.items():
            if m.request is None or path.endswith(("/DoExchange", "/DoPut")):
                continue  # raw FlightData, whose decoding other tests cover
            code, details = _call(ch, path, GARBAGE, ANON)
            if code == grpc.StatusCode.UNIMPLEMENTED:
                continue
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (path, code, details)
            assert m.request.DESCRIPTOR.full_name in details, (path, details)
            assert len(details) < 400
            checked += 1
        assert checked >= 15


def test_credentials_are_checked_before_the_body_on_every_method():
    paths = set(ALL_METHODS) | {"/io.deephaven.proto.backplane.grpc.TableService/" + n
                                for n in ("ComboAggregate", "SelectDistinct", "AsOfJoinTables", "RunChartDownsample")}
    paths -= UNAUTHENTICATED_METHODS  # asked before any login (tested in test_browser_services)
    with Services(psk="s3cret") as s:
        s.engine.create(TableSpec("t", "static", data=rows(0, 10)))
        ch = s.channel()
        for path in sorted(paths):
            for md in ((), ANON, (("authorization", f"{PSK_SCHEME} wrong"),)):
                for body in (GARBAGE, b""):
                    code, details = _call(ch, path, body, md)
                    assert code == grpc.StatusCode.UNAUTHENTICATED, (path, md, body, code, details)
        # with the key, the same garbage is a malformed request
        code, details = _call(ch, FLIGHT + "GetFlightInfo", GARBAGE, (("authorization", f"{PSK_SCHEME} s3cret"),))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "FlightDescriptor" in details


# -- uploads that are refused leave nothing behind ---------------------------------------------------------------

@pytest.fixture()
def served():
    """A server on a socket, for pyarrow.flight's uploads."""
    engine = Engine(interval_ms=20)
    engine.write(engine.create(TableSpec("existing", "append", SCHEMA)), rows(0, 5), wait=False)
    srv = TickwireServer(engine, port=0).start()
    client = fl.FlightClient(f"grpc://{srv.target}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    yield srv, client, opts
    client.close()
    srv.stop()
    engine.stop()


@pytest.fixture()
def uploads():
    """The services in process, with one table."""
    with Services() as s:
        s.write(s.engine.create(TableSpec("existing", "append", SCHEMA)), rows(0, 5))
        s.cycle()
        yield s


def _flight_listing(client, opts):
    return sorted((tuple(i.descriptor.path), i.schema.names) for i in client.list_flights(options=opts))


def _listing(s: Services):
    """(path, column names) of every table ListFlights shows."""
    return sorted((tuple(p.encode() for p in fi.flight_descriptor.path),
                   pa.ipc.read_schema(pa.py_buffer(fi.schema)).names)
                  for fi in s.stream(FLIGHT_SERVICE, "ListFlights", flight_pb2.Criteria()))


def test_a_dictionary_upload_is_refused_and_listing_keeps_working(served):
    """pyarrow.flight's upload of a dictionary column (its dictionary batches as it sends them)."""
    srv, client, opts = served
    before = _flight_listing(client, opts)
    data = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode(), "x": [1, 2, 3]})
    with pytest.raises(pa.ArrowInvalid) as e:  # pyarrow's form of INVALID_ARGUMENT
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "dict_table"), data.schema, options=opts)
        writer.write_table(data)
        writer.close()
    assert "column 'd'" in str(e.value) and "dictionary" in str(e.value)
    assert _flight_listing(client, opts) == before


def _raw_put(s: Services, messages: list[bytes]):
    try:
        s.put_raw(messages)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return grpc.StatusCode.OK, ""


def _schema_and_batch(table: pa.Table) -> tuple[bytes, bytes, bytes]:
    """The IPC schema message and the first record batch's header and body of `table`."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    schema_msg = reader.read_next_message()
    batch_msg = reader.read_next_message()
    return schema_msg.metadata.to_pybytes(), batch_msg.metadata.to_pybytes(), batch_msg.body.to_pybytes()


def test_a_corrupt_first_batch_leaves_no_table_behind(uploads):
    s = uploads
    before = _listing(s)
    assert before == [((b"scope", b"existing"), ["k", "v", "s"])]
    desc = FlightDescriptor.for_path("scope", "never_made")
    schema_hdr, batch_hdr, body = _schema_and_batch(rows(0, 100))
    for bad_body in (body[: len(body) // 3], b""):
        code, details = _raw_put(s, [encode_flight_data(schema_hdr, None, descriptor=desc),
                                     encode_flight_data(batch_hdr, None, body=bad_body)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    s.cycle()
    assert _listing(s) == before
    # keys metadata that is not UTF-8, or that names no column: refused, nothing made
    for keys in (b"\xff\xfe", b"nope"):
        t = rows(0, 3).replace_schema_metadata({b"tickwire:keys": keys})
        schema_hdr, batch_hdr, body = _schema_and_batch(t)
        code, details = _raw_put(s, [encode_flight_data(schema_hdr, None, descriptor=desc),
                                     encode_flight_data(batch_hdr, None, body=body)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "tickwire:keys" in details, (code, details)
    s.cycle()
    assert _listing(s) == before
    # a good upload to the same name still works
    s.put(["scope", "never_made"], rows(0, 7))
    s.cycle()
    assert (b"scope", b"never_made") in [p for p, _ in _listing(s)]
    assert s.engine.resolve("never_made").size == 7


# -- stalled subscribers share one snapshot ------------------------------------------------------------------------



@pytest.mark.slow
def test_fifty_stalled_subscribers_share_their_messages():
    """50 subscribers that ask for the same 130,000-row table and never read replay one shared
    snapshot (restated at each joiner's step while the table has not changed): what they hold is a
    handful of message objects, not one copy each; once the table ticks again what changes is
    coalesced, not queued. On sockets, in other processes: what stalls them is HTTP/2 flow control.
    What they cost in memory (each one after the first, against the snapshot) is measured by
    bench/bench_memory.py."""
    engine = Engine(interval_ms=100)  # its cycles hand the subscribers their snapshot
    big = engine.create(TableSpec("big", "keyed", SCHEMA, keys=["k"]))
    engine.write(big, rows(0, 130_000), wait=False)
    engine.run_cycle()
    srv = TickwireServer(engine, port=0, session_duration_ms=60_000).start()
    procs = []

    def stalled(n: int) -> None:
        procs.append(stalled_clients.start(srv.target, n))

    def joined(n: int) -> bool:
        """`n` subscribers, each handed its snapshot (which the transport then holds back)."""
        subs = srv.registry.subscriptions
        return len(subs) >= n and all(s.messages > 0 for s in subs)

    try:
        stalled(1)
        assert until(lambda: joined(1), 60)
        stalled(49)
        assert until(lambda: joined(50), 60), [s.messages for s in srv.registry.subscriptions]
        for v in range(1, 4):  # the table ticks: 10 rows a cycle (each write returns once a cycle applied it)
            engine.write(big, rows(v * 7 % 130_000, 10, version=v))
        subs = srv.registry.subscriptions
        assert len(subs) == 50
        assert until(lambda: all(s.pending() > 0 for s in subs)), "the subscribers did not stall"
        held = [id(m) for s in subs for m in list(s.outbox)]
        assert len(held) >= 50 and len(set(held)) <= 20, "stalled subscribers hold copies, not shared messages"
        assert until(lambda: all(s.coalesced > 0 for s in subs)), \
            "the table's changes did not reach the stalled subscribers"
    finally:
        for p in procs:
            p.kill()
            p.wait()
        srv.stop()
        engine.stop()


_NON_UTF8_NAME_PUT = bytes.fromhex(
    "0a1708011a0573636f70651a0c7374617469635f6d697865641298021000000000000a000e000600050008000a00000000010400100000"
    "0000000a000c000000040008000a0000004400000004000000010000000c00000008000c00040008000800000014000000040000000700"
    "000053796d2c53796d000d0000007469636b776972653a6b65797300000003000000700000003400000004000000acffffff0000010310"
    "0000001800000004000000000000000100000063000600080006000600000000000200d8ffffff00000105100000001800000004000000"
    "0000000001000000620000000400040004000000100014000800060007000c00000010001000000000000102100000001c000000040000"
    "000000000001000000ff00000008000c0008000700080000000000000140000000c23e00")
_FAR_INSTANT_PUT = [bytes.fromhex(
    "0a0d08011a0573636f70651a02743212701000000000000a000c000600050008000a000000000104000c00000008000800000004000800"
    "0000040000000100000014000000100014000800060007000c0000001000100000000000010a1000000018000000040000000000000001"
    "00000074000600080006000600000000000100c23e00"), bytes.fromhex(
    "12880114000000000000000c0016000600050008000c000c0000000003040018000000080000000000000000000a0018000c0004000800"
    "0a0000003c00000010000000010000000000000000000000020000000000000000000000000000000000000000000000000000000800"
    "000000000000000000000100000001000000000000000000000000000000c23e085067f4653e400000")]



def test_uploads_the_server_could_not_serve_are_refused(uploads):
    s = uploads
    before = _listing(s)
    code, details = _raw_put(s, [_NON_UTF8_NAME_PUT])  # a field name that is not UTF-8
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in details, (code, details)
    code, details = _raw_put(s, _FAR_INSTANT_PUT)  # timestamp[ms] beyond the nanosecond range
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "column 't'" in details, (code, details)
    s.cycle()
    assert _listing(s) == before
