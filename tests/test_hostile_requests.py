"""Requests an untrusted client may send: each is answered quickly, with a clear status and a short
message, without work beyond what the named table justifies, and without holding up anyone else.

Huge viewports are clipped to the table, never expanded; oversize messages and column sets are
refused before any work proportional to them; credentials are checked before a body is parsed;
a refused upload leaves nothing behind; subscribers that stop reading share one copy of their
initial snapshot."""
from __future__ import annotations

import ctypes
import gc
import os
import queue
import subprocess
import sys
import threading
import time

import grpc

from tickwire.server.engine import Engine, TableSpec
from tickwire.server.services.rpc import UNAUTHENTICATED_METHODS
import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.proto import flight_pb2
from tickwire.protocol.proto.methods import ALL_METHODS, CLIENT_STREAM, METHODS, SERVER_STREAM, UNARY
from tickwire.protocol.update import StreamDecoder
from tickwire.server.app import TickwireServer
from tickwire.server.services.sessions import PSK_SCHEME

FLIGHT = "/arrow.flight.protocol.FlightService/"
ANON = (("authorization", "Anonymous"),)
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def rows(start: int, n: int, version: int = 0) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 1.5 + version, "s": pa.array([f"r{x}" for x in k.tolist()])}, schema=SCHEMA)


class Exchange:
    """A raw DoExchange whose responses are decoded in a thread, with the time each arrived."""

    def __init__(self, channel, metadata=ANON):
        self.q: queue.Queue = queue.Queue()
        self.decoder = StreamDecoder()
        self.updates: list = []
        self.times: list[float] = []
        self.error = None
        self.done = threading.Event()
        self.call = channel.stream_stream(FLIGHT + "DoExchange")(iter(self.q.get, None), metadata=metadata)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        try:
            for raw in self.call:
                u = self.decoder.feed(raw)
                if u is not None:
                    self.updates.append(u)
                    self.times.append(time.monotonic())
        except grpc.RpcError as exc:
            self.error = exc
        finally:
            self.done.set()

    def send(self, app_metadata: bytes):
        self.q.put(encode_flight_data(b"", app_metadata))

    def wait(self, n, timeout=10.0):
        end = time.monotonic() + timeout
        while len(self.updates) < n and not self.done.is_set() and time.monotonic() < end:
            time.sleep(0.002)
        assert len(self.updates) >= n, f"{len(self.updates)} updates, wanted {n}; error {self.error}"

    def close(self):
        self.q.put(None)
        self.call.cancel()


def sub_request(ticket=b"s/keyed", viewport=None, columns=None) -> bytes:
    return barrage.wrap(barrage.SubscriptionRequest(
        ticket=ticket, viewport=None if viewport is None else np.array(viewport, dtype=np.int64).reshape(-1, 2),
        columns=columns, options=barrage.SubscriptionOptions()))


@pytest.fixture()
def ticking():
    """A keyed table of 10,000 rows changed every 20 ms by a writer thread; `srv.changed_steps` are the
    steps that changed it (on a loaded machine the writer may miss a cycle, which then sends nothing)."""
    graph = Engine(interval_ms=20)
    keyed = graph.create(TableSpec("keyed", "keyed", SCHEMA, keys=["k"]))
    keyed.add(rows(0, 10_000))
    graph.run_cycle()
    changed: set[int] = set()
    keyed.add_listener(lambda _table, _update, step: changed.add(step))
    srv = TickwireServer(graph, port=0).start()
    srv.changed_steps = changed
    stop = threading.Event()

    def writer():
        v = 0
        while not stop.is_set():
            v += 1
            keyed.add(rows(v % 10_000, 5, version=v))
            time.sleep(0.01)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    yield srv
    stop.set()
    t.join(5)
    srv.stop()
    graph.stop()


def _assert_no_gap(ex: Exchange, changed_steps: set[int]):
    """Every update after the snapshot starts after the previous one ended, and no step that changed
    the table was skipped between them (a step that changed nothing sends nothing)."""
    seqs = [(u.metadata.first_seq, u.metadata.last_seq) for u in ex.updates]
    for (_f0, l0), (f1, _l1) in zip(seqs, seqs[1:]):
        skipped = sorted(changed_steps.intersection(range(l0 + 1, f1)))
        assert f1 > l0 and not skipped, f"a healthy subscriber's updates skip steps {skipped} or overlap: {seqs}"


@pytest.mark.parametrize("far", [2**40, 2**62])
def test_a_huge_viewport_answers_at_once_with_the_clipped_rows_and_nobody_waits(ticking, far):
    with grpc.insecure_channel(ticking.target) as ch, grpc.insecure_channel(ticking.target) as ch2:
        healthy = Exchange(ch)
        healthy.send(sub_request())
        healthy.wait(3)
        hostile = Exchange(ch2)
        request = sub_request(viewport=[[0, 0], [2, far]])
        sent = time.monotonic()
        hostile.send(request)
        hostile.wait(1, timeout=5)
        took = hostile.times[0] - sent
        first = hostile.updates[0]
        n = first.metadata.table_size
        assert n == 10_000
        # the viewport is rows of the table: positions 0 and 2..n-1, the client's window rows 0..n-2
        assert first.metadata.effective_viewport.tolist() == [[0, 0], [2, far]]
        assert first.metadata.added_rows.tolist() == [[0, n - 2]]
        keys = np.asarray(first.added[0])
        assert keys[0] == 0 and keys[1] == 2 and len(keys) == n - 1
        # 9,999 rows take milliseconds; 2 s is room for a GC pass or a stalled CPU, while expanding the
        # requested 2^40 or 2^62 rows would take minutes or run out of memory
        assert took < 2.0, f"the clipped snapshot of {n - 1} rows took {took * 1000:.0f} ms"
        # the viewport keeps working as the table ticks, and the healthy subscriber never skipped a step
        before = len(healthy.updates)
        hostile.wait(3, timeout=5)
        healthy.wait(before + 5, timeout=5)
        _assert_no_gap(healthy, ticking.changed_steps)
        # updates come every 20 ms; 5 s allows for a loaded machine, while waiting out work on the
        # requested viewport (minutes) would not fit
        gaps = np.diff(np.array(healthy.times))
        assert gaps.max() < 5.0, f"the healthy subscriber waited {gaps.max():.2f} s for an update"
        assert hostile.error is None and healthy.error is None
        hostile.close()
        healthy.close()


def test_a_huge_viewport_snapshot_request_is_clipped(ticking):
    with grpc.insecure_channel(ticking.target) as ch:
        ex = Exchange(ch)
        request = barrage.wrap(barrage.SnapshotRequest(ticket=b"s/keyed", viewport=np.array([[5, 2**62]])))
        sent = time.monotonic()
        ex.send(request)
        ex.wait(1)
        # 9,995 rows take milliseconds; expanding 2^62 rows would never finish
        took = ex.times[0] - sent
        assert took < 5.0, f"the clipped snapshot took {took:.2f} s"
        got = np.asarray(ex.updates[0].added[0])
        assert got.tolist() == list(range(5, 10_000))
        ex.close()


def test_column_sets_are_checked_in_one_pass_with_a_short_message(ticking):
    with grpc.insecure_channel(ticking.target) as ch:
        # a 1 MB bitset with every bit set: 8 million column indices for a 3-column table
        for cols in (np.arange(8 * 1024 * 1024, dtype=np.int64), np.arange(3, 4099, dtype=np.int64)):
            request = sub_request(columns=cols)
            # Refusing 8 million indices in vectorized passes took 60 ms to 1.1 s a try on a 2-core machine
            # at load 6, the best of a few tries 60-180 ms; putting them in a Python set first added 1.1-2.1 s
            # to every try. So the best of up to ten tries, spaced out, must come under 1 s: load or a GC
            # pass slows some tries, not all of them, while per-index work is slow on every try.
            took = []
            for _try in range(10):
                ex = Exchange(ch)
                sent = time.monotonic()
                ex.send(request)
                assert ex.done.wait(10), "the request was not refused"
                took.append(time.monotonic() - sent)
                assert ex.error.code() == grpc.StatusCode.INVALID_ARGUMENT
                details = ex.error.details()
                assert len(details) < 300, details
                assert "out of range for a table of 3 columns" in details and "more" in details
                ex.close()
                if min(took) < 1.0:
                    break
                time.sleep(0.2)
            assert min(took) < 1.0, f"refusing {len(cols)} column indices took {', '.join(f'{t:.2f}' for t in took)} s"


def test_an_oversize_message_is_refused_before_it_is_read_whole():
    graph = Engine(interval_ms=3_600_000)
    graph.create(TableSpec("t", "static", data=rows(0, 10)))
    srv = TickwireServer(graph, port=0, start_engine=False, max_inbound_message_size=1 << 20).start()
    try:
        with grpc.insecure_channel(srv.target, options=[("grpc.max_send_message_length", -1)]) as ch:
            ex = Exchange(ch)
            sent = time.monotonic()
            ex.q.put(encode_flight_data(b"", b"\0" * (4 << 20)))  # 4 MiB of app_metadata
            assert ex.done.wait(10)
            assert ex.error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert time.monotonic() - sent < 5
            # the server keeps serving
            get = ch.unary_stream(FLIGHT + "DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
            assert len(list(get(flight_pb2.Ticket(ticket=b"s/t"), metadata=ANON))) == 2
    finally:
        srv.stop()
    with pytest.raises(ValueError):
        TickwireServer(graph, port=0, max_inbound_message_size=0)


# -- credentials first, then the body -----------------------------------------------------------------------------

def _call(channel, path: str, body: bytes, metadata, timeout=5.0):
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
    graph = Engine(interval_ms=3_600_000)
    graph.create(TableSpec("t", "static", data=rows(0, 10)))
    srv = TickwireServer(graph, port=0, start_engine=False).start()
    try:
        with grpc.insecure_channel(srv.target) as ch:
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
    finally:
        srv.stop()


def test_credentials_are_checked_before_the_body_on_every_method():
    graph = Engine(interval_ms=3_600_000)
    graph.create(TableSpec("t", "static", data=rows(0, 10)))
    srv = TickwireServer(graph, port=0, start_engine=False, psk="s3cret").start()
    paths = set(ALL_METHODS) | {"/io.deephaven.proto.backplane.grpc.TableService/" + n
                            for n in ("ComboAggregate", "SelectDistinct", "AsOfJoinTables", "RunChartDownsample")}
    paths -= UNAUTHENTICATED_METHODS  # asked before any login (tested in test_browser_services)
    try:
        with grpc.insecure_channel(srv.target) as ch:
            for path in sorted(paths):
                for md in ((), ANON, (("authorization", f"{PSK_SCHEME} wrong"),)):
                    for body in (GARBAGE, b""):
                        code, details = _call(ch, path, body, md)
                        assert code == grpc.StatusCode.UNAUTHENTICATED, (path, md, body, code, details)
            # with the key, the same garbage is a malformed request
            code, details = _call(ch, FLIGHT + "GetFlightInfo", GARBAGE, (("authorization", f"{PSK_SCHEME} s3cret"),))
            assert code == grpc.StatusCode.INVALID_ARGUMENT and "FlightDescriptor" in details
    finally:
        srv.stop()


# -- uploads that are refused leave nothing behind ---------------------------------------------------------------

@pytest.fixture()
def served():
    graph = Engine(interval_ms=20)
    graph.create(TableSpec("existing", "append", SCHEMA)).add(rows(0, 5))
    srv = TickwireServer(graph, port=0).start()
    client = fl.FlightClient(f"grpc://{srv.target}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    yield srv, client, opts
    client.close()
    srv.stop()
    graph.stop()


def _listing(client, opts):
    return sorted((tuple(i.descriptor.path), i.schema.names) for i in client.list_flights(options=opts))


def test_a_dictionary_upload_is_refused_and_listing_keeps_working(served):
    srv, client, opts = served
    before = _listing(client, opts)
    data = pa.table({"d": pa.array(["a", "b", "a"]).dictionary_encode(), "x": [1, 2, 3]})
    with pytest.raises(pa.ArrowInvalid) as e:  # pyarrow's form of INVALID_ARGUMENT
        writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "dict_table"), data.schema, options=opts)
        writer.write_table(data)
        writer.close()
    assert "column 'd'" in str(e.value) and "dictionary" in str(e.value)
    assert _listing(client, opts) == before


def _raw_put(target: str, messages: list[bytes]):
    with grpc.insecure_channel(target) as ch:
        try:
            list(ch.stream_stream(FLIGHT + "DoPut")(iter(messages), metadata=ANON, timeout=10))
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


def test_a_corrupt_first_batch_leaves_no_table_behind(served):
    srv, client, opts = served
    before = _listing(client, opts)
    desc = FlightDescriptor.for_path("scope", "never_made")
    schema_hdr, batch_hdr, body = _schema_and_batch(rows(0, 100))
    for bad_body in (body[: len(body) // 3], b""):
        code, details = _raw_put(srv.target, [encode_flight_data(schema_hdr, None, descriptor=desc),
                                              encode_flight_data(batch_hdr, None, body=bad_body)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert _listing(client, opts) == before
    # keys metadata that is not UTF-8, or that names no column: refused, nothing made
    for keys in (b"\xff\xfe", b"nope"):
        t = rows(0, 3).replace_schema_metadata({b"tickwire:keys": keys})
        schema_hdr, batch_hdr, body = _schema_and_batch(t)
        code, details = _raw_put(srv.target, [encode_flight_data(schema_hdr, None, descriptor=desc),
                                              encode_flight_data(batch_hdr, None, body=body)])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "tickwire:keys" in details, (code, details)
    assert _listing(client, opts) == before
    # a good upload to the same name still works
    writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "never_made"), SCHEMA, options=opts)
    writer.write_table(rows(0, 7))
    writer.close()
    assert (b"scope", b"never_made") in [p for p, _ in _listing(client, opts)]


# -- stalled subscribers share one snapshot ------------------------------------------------------------------------

_STALLED_CLIENTS = r'''
import queue, sys, time, grpc
from tickwire.protocol import barrage
from tickwire.protocol.flight import encode_flight_data
target, n = sys.argv[1], int(sys.argv[2])
req = barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/big", options=barrage.SubscriptionOptions()))
calls = []
for _ in range(n):
    # no BDP probing: the window stays at HTTP/2's 64 KiB, so the server keeps what is not read
    ch = grpc.insecure_channel(target, options=[("grpc.http2.bdp_probe", 0)])
    q = queue.Queue()
    call = ch.stream_stream("/arrow.flight.protocol.FlightService/DoExchange")(iter(q.get, None))
    q.put(encode_flight_data(b"", req))
    calls.append((ch, call, q))
print("subscribed", flush=True)
sys.stdin.read()
'''


def _rss_mb() -> float:
    """The process's resident size once garbage is collected and freed memory handed back to the system
    (both of pyarrow's pool and of malloc), so what is measured is what is still held."""
    gc.collect()
    pa.default_memory_pool().release_unused()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


@pytest.mark.slow
def test_fifty_stalled_subscribers_cost_about_one_message():
    """50 subscribers that ask for the same 130,000-row table and never read cost about one snapshot:
    they replay one shared snapshot (restated at each joiner's step while the table has not changed),
    each holds at most one small FlightData of it in its transport, and once the table ticks again what
    changes is coalesced, not queued. Each subscriber after the first may add its stream, its thread
    and one small message, under a fifth of the snapshot; one copy of the snapshot each would be five
    times that."""
    graph = Engine(interval_ms=100)
    big = graph.create(TableSpec("big", "keyed", SCHEMA, keys=["k"]))
    first = rows(0, 130_000)
    snapshot = first.nbytes / 1e6
    big.add(first)
    del first
    graph.run_cycle()
    srv = TickwireServer(graph, port=0, session_duration_ms=60_000).start()
    srv.sessions.psk = None
    stop = threading.Event()

    def writer():
        v = 0
        while not stop.is_set():
            v += 1
            big.add(rows(v * 7 % 130_000, 10, version=v))
            time.sleep(0.05)

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = []

    def stalled(n: int) -> None:
        p = subprocess.Popen([sys.executable, "-c", _STALLED_CLIENTS.replace(
            "(iter(q.get, None))", "(iter(q.get, None), metadata=(('authorization', 'Anonymous'),))"),
            srv.target, str(n)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        procs.append(p)
        assert p.stdout.readline().strip() == b"subscribed"

    def settle(n: int) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            subs = srv.registry.subscriptions
            if len(subs) >= n and all(s.messages > 0 and s.pending() > 0 for s in subs):
                break
            time.sleep(0.1)
        time.sleep(2.0)

    try:
        time.sleep(1.0)
        base = _rss_mb()
        stalled(1)
        settle(1)
        one = _rss_mb() - base
        stalled(49)
        settle(50)
        threading.Thread(target=writer, daemon=True).start()
        time.sleep(2.0)
        fifty = _rss_mb() - base
        subs = srv.registry.subscriptions
        assert len(subs) == 50 and all(s.pending() > 0 for s in subs), "the subscribers did not stall"
        held = [id(m) for s in subs for m in list(s.outbox)]
        assert len(held) >= 50 and len(set(held)) <= 20, "stalled subscribers hold copies, not shared messages"
        assert one > 1.0, f"one stalled subscriber measured at {one:.1f} MB: the measurement saw nothing"
        assert all(s.coalesced > 0 for s in subs), "the table's changes did not reach the stalled subscribers"
        per_extra = (fifty - one) / 49
        assert per_extra <= snapshot / 5, (
            f"each stalled subscriber after the first costs {per_extra:.2f} MB (one costs {one:.1f} MB, "
            f"fifty {fifty:.1f} MB) for a {snapshot:.1f} MB snapshot")
        print(f"stalled subscribers: one {one:.1f} MB, fifty {fifty:.1f} MB, "
              f"{per_extra * 1e3:.0f} KB per subscriber after the first, snapshot {snapshot:.1f} MB")
    finally:
        stop.set()
        for p in procs:
            p.kill()
            p.wait()
        srv.stop()
        graph.stop()


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


def test_uploads_the_server_could_not_serve_are_refused(served):
    srv, client, opts = served
    before = _listing(client, opts)
    code, details = _raw_put(srv.target, [_NON_UTF8_NAME_PUT])  # a field name that is not UTF-8
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "UTF-8" in details, (code, details)
    code, details = _raw_put(srv.target, _FAR_INSTANT_PUT)  # timestamp[ms] beyond the nanosecond range
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "column 't'" in details, (code, details)
    assert _listing(client, opts) == before
