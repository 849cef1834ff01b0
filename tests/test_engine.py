"""The engine's public calls: the catalog (tables from specs, one typed error for a mismatch,
nothing registered for an unservable schema, drop refused while held), ingest that returns once
applied (read-your-writes through DoPut and pydeephaven), and the rule that nothing outside the
engine reaches into the update graph (its lock, its registry, its intake or the sources' queues)."""
from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.server.app import TickwireServer
from tickwire.server.engine import CatalogError, Engine, IngestError, TableInUseError, TableMismatchError, TableSpec

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.float64())])


def batch(start: int, n: int) -> pa.Table:
    k = np.arange(start, start + n, dtype=np.int64)
    return pa.table({"k": k, "v": k * 0.5}, schema=SCHEMA)


def test_get_or_create_makes_each_kind_once_and_refuses_mismatches():
    e = Engine(interval_ms=3_600_000)
    a, created = e.get_or_create(TableSpec("a", "append", SCHEMA))
    assert created and e.get_or_create(TableSpec("a", "append", SCHEMA)) == (a, False)
    k, _ = e.get_or_create(TableSpec("k", "keyed", SCHEMA, keys=("k",)))
    r, _ = e.get_or_create(TableSpec("r", "ring", SCHEMA, capacity=10))
    b, _ = e.get_or_create(TableSpec("b", "blink", SCHEMA))
    s, _ = e.get_or_create(TableSpec("s", "static", data=batch(0, 3)))
    assert e.public_names() == ["a", "k", "r", "b", "s"]
    assert e.resolve("k") is k and e.resolve("nope") is None
    with pytest.raises(TableMismatchError, match="append table, not keyed") as err:
        e.get_or_create(TableSpec("a", "keyed", SCHEMA, keys=("k",)))
    assert err.value.code == "FAILED_PRECONDITION"
    with pytest.raises(TableMismatchError, match="keeps 10 rows"):
        e.get_or_create(TableSpec("r", "ring", SCHEMA, capacity=11))
    with pytest.raises(TableMismatchError, match="column 'v' is double, not int32") as err:
        e.get_or_create(TableSpec("a", "append", pa.schema([("k", pa.int64()), ("v", pa.int32())])))
    assert err.value.code == "INVALID_ARGUMENT"
    with pytest.raises(CatalogError, match="key column"):
        e.get_or_create(TableSpec("k2", "keyed", SCHEMA, keys=("nope",)))
    for bad in ({"kind": "tree"}, {"kind": "keyed"}, {"kind": "ring"}, {"kind": "static"}):
        with pytest.raises(CatalogError):
            TableSpec("x", schema=SCHEMA, **bad)
    assert e.public_names() == ["a", "k", "r", "b", "s"]


@pytest.mark.parametrize("column", [pa.field("d", pa.dictionary(pa.int32(), pa.string())),
                                    pa.field("S", pa.struct([("a", pa.int64())])),
                                    pa.field("m", pa.map_(pa.string(), pa.int64()))])
def test_an_unservable_schema_registers_nothing(column):
    e = Engine(interval_ms=3_600_000)
    with pytest.raises(CatalogError, match=f"column '{column.name}'") as err:
        e.get_or_create(TableSpec("t", "append", pa.schema([("k", pa.int64()), column])))
    assert err.value.code == "INVALID_ARGUMENT"
    assert e.public_names() == [] and e.resolve("t", hidden=True) is None


def test_hidden_tables_are_neither_listed_nor_resolved_by_name():
    e = Engine(interval_ms=3_600_000)
    h, _ = e.get_or_create(TableSpec("secret", "append", SCHEMA, hidden=True))
    assert e.public_names() == [] and e.resolve("secret") is None
    assert e.resolve("secret", hidden=True) is h and h in e.tables(hidden=True)


def test_drop_is_refused_while_held_and_works_after():
    e = Engine(interval_ms=3_600_000)
    t, _ = e.get_or_create(TableSpec("t", "append", SCHEMA))
    e.write(t, batch(0, 5))
    e.run_cycle()
    with e.reading():
        derived = t.where(lambda tbl: np.asarray(tbl.column("k")) > 1, name="t_big")
    with pytest.raises(TableInUseError, match="derived from it: 't_big'") as err:
        e.drop("t")
    assert err.value.code == "FAILED_PRECONDITION"
    listener = t.add_listener(lambda *a: None)
    assert e.remove_unused(derived)
    with pytest.raises(TableInUseError, match="subscriber"):
        e.drop("t")
    t.remove_listener(listener)
    e.drop("t")
    assert e.public_names() == []
    with pytest.raises(CatalogError) as err:
        e.drop("t")
    assert err.value.code == "NOT_FOUND"


def test_write_returns_once_applied_and_remembers_batch_ids():
    e = Engine(interval_ms=50).start()
    try:
        t, _ = e.get_or_create(TableSpec("t", "keyed", SCHEMA, keys=("k",)))
        for i in range(20):
            assert e.write(t, batch(i * 3, 3), batch_id=("test", i))
            assert e.snapshot(t)[1].num_rows == (i + 1) * 3  # read at once, no waiting
        assert not e.write(t, batch(100, 3), batch_id=("test", 5))  # a replay: nothing queued
        e.write(t, delete=batch(0, 3))
        assert e.snapshot(t)[1].num_rows == 57
        with pytest.raises(IngestError, match="not keyed"):
            a, _ = e.get_or_create(TableSpec("a", "append", SCHEMA))
            e.write(a, delete=batch(0, 1))
        with pytest.raises(IngestError) as err:
            e.write(t, pa.table({"k": ["x"]}))
        assert err.value.code == "INVALID_ARGUMENT"
        s, _ = e.get_or_create(TableSpec("s", "static", data=batch(0, 1)))
        with pytest.raises(IngestError, match="takes no writes"):
            e.write(s, batch(0, 1))
        # several writes in one cycle
        b, _ = e.get_or_create(TableSpec("b", "append", SCHEMA))
        with e.writes() as w:
            w.write(t, batch(1000, 2))
            w.write(b, batch(0, 2))
        step_t, rows_t = e.snapshot(t)
        assert rows_t.num_rows == 59 and e.snapshot(b)[1].num_rows == 2
        assert t.last_step == b.last_step
    finally:
        e.stop()


@pytest.fixture(scope="module")
def served():
    engine = Engine(interval_ms=100)
    srv = TickwireServer(engine, port=0).start()
    yield srv
    srv.stop()
    engine.stop()


def test_a_doput_is_readable_by_the_next_call_every_time(served):
    client = fl.FlightClient(f"grpc://{served.target}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    try:
        for i in range(100):
            name = f"ryw_{i % 10}"
            before = 0 if i < 10 else client.do_get(fl.Ticket(f"s/{name}".encode()), options=opts).read_all().num_rows
            writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", name), SCHEMA, options=opts)
            writer.write_table(batch(i * 3, 3))
            writer.close()
            got = client.do_get(fl.Ticket(f"s/{name}".encode()), options=opts).read_all()
            assert got.num_rows == before + 3, f"upload {i}: read {got.num_rows} rows, expected {before + 3}"
    finally:
        client.close()


def test_a_pydeephaven_import_is_readable_at_once_every_time(served):
    from pydeephaven import Session

    s = Session(host=served.host, port=served.port)
    try:
        for i in range(100):
            t = s.import_table(batch(i, 3 + i % 4))
            assert t.size == 3 + i % 4
            got = t.to_arrow()  # a DoGet of the session's export, right after the upload returned
            assert got.num_rows == 3 + i % 4, f"import {i}: {got.num_rows} rows"
            assert got.column("k").to_pylist() == list(range(i, i + 3 + i % 4))
    finally:
        s.close()


def test_concurrent_doputs_each_read_their_own_rows(served):
    """Read-your-writes holds under concurrency: each writer's DoGet after its DoPut sees its rows."""
    errors: list[str] = []

    def writer(w: int):
        client = fl.FlightClient(f"grpc://{served.target}")
        opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
        try:
            for i in range(10):
                name = f"conc_{w}"
                wr, _ = client.do_put(fl.FlightDescriptor.for_path("scope", name), SCHEMA, options=opts)
                wr.write_table(batch(i * 2, 2))
                wr.close()
                n = client.do_get(fl.Ticket(f"s/{name}".encode()), options=opts).read_all().num_rows
                if n != (i + 1) * 2:
                    errors.append(f"writer {w} upload {i}: {n} rows")
        finally:
            client.close()

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []


# what only the engine (tickwire.server.engine, the folder server/engine/) names: the update graph's
# class, an object's `.graph` (not the package tickwire.server.engine.graph), the graph's lock,
# registry and stepping, its intake lock, `exclusive()`, `add_table`, and the sources' queue calls,
# also when named in a string (getattr, setattr)
ENGINE_ONLY = re.compile(r"\bUpdateGraph\b"
                         r"|(?<!server\.engine)\.graph\b"
                         r"|\bgraph\.(?:lock|tables|remove_table|run_cycle|step)\b"
                         r"|\.(?:_?intake_lock|add_table|queue_rows|queue_ops|queue_delete|queue_update)\b"
                         r"|\.exclusive\("
                         r"|[\"'](?:graph|_?intake_lock|exclusive|add_table|queue_(?:rows|ops|delete|update))[\"']")
ENGINE_AREA = "server/engine/"


def test_nothing_outside_the_engine_reaches_into_the_graph():
    """Read as text, line by line, comments and strings included (tests/test_layers.py reads the
    syntax tree): nothing outside the engine names the update graph or its private calls."""
    offenders = []
    for folder in ("server", "clients", "tickwire", "protocol"):
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ENGINE_AREA):
                continue
            for n, line in enumerate(path.read_text().splitlines(), start=1):
                if ENGINE_ONLY.search(line):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert offenders == [], "the update graph is the engine's:\n" + "\n".join(offenders)


def test_the_rule_sees_every_way_of_reaching_in_and_not_the_graph_package():
    reaching_in = ["with self.engine.graph.lock:", "graph = engine.graph", "with graph.lock:",
                   "from tickwire.server.engine.graph.graph import UpdateGraph", "g = UpdateGraph(100)",
                   "from tickwire.server.engine.graph.graph import TableListener",
                   "with engine.graph.exclusive():", "lock = table._intake_lock", "table.intake_lock",
                   "graph.add_table(t)", "t.queue_rows(batch)", "t.queue_ops(ops, batch_id=b)",
                   "t.queue_delete(keys)", "t.queue_update(op)", "getattr(engine, 'graph')",
                   'getattr(t, "queue_rows")(batch)', "graph.tables[name]", "graph.remove_table(name)"]
    assert [line for line in reaching_in if not ENGINE_ONLY.search(line)] == []
    fine = ["from tickwire.server.engine.graph import RowSet, TableUpdate",
            "from tickwire.server.engine.graph.keyindex import KeyIndex",
            "# a derived table of the update graph (tickwire.server.engine.graph.ops)",
            "with self.engine.reading():", "engine.write(table, batch)", "engine.tables(hidden=True)",
            "paragraph = 1", "graphs = []"]
    assert [line for line in fine if ENGINE_ONLY.search(line)] == []


def test_an_engine_owns_its_tables_and_two_engines_share_nothing():
    a, b = Engine(interval_ms=3_600_000), Engine(interval_ms=3_600_000)
    t = a.create(TableSpec("t", "append", SCHEMA))
    assert a.resolve("t") is t and b.resolve("t", hidden=True) is None and b.public_names() == []
    u = b.create(TableSpec("t", "append", SCHEMA))  # the same name in the other engine: another table
    assert u is not t
    a.write(t, batch(0, 3))
    a.run_cycle()
    assert (a.step, b.step) == (1, 0) and a.snapshot(t)[1].num_rows == 3 and b.snapshot(u) == (0, SCHEMA.empty_table())
    b.run_cycle()
    assert (a.step, b.step) == (1, 1) and t.size == 3 and u.size == 0


def test_every_kind_of_table_offers_the_cycle_hooks():
    from tickwire.server.engine.graph.graph import CycleHooks

    from .scripted import scripted_table

    e = Engine(interval_ms=3_600_000)
    tables = [e.get_or_create(TableSpec(k, k, SCHEMA, keys=("k",) if k == "keyed" else (),
                                        capacity=5 if k == "ring" else None))[0]
              for k in ("append", "keyed", "ring", "blink")]
    tables.append(e.get_or_create(TableSpec("static", "static", data=batch(0, 2)))[0])
    with e.reading():
        tables.append(tables[0].where(lambda t: np.ones(t.num_rows, dtype=bool), name="w"))
    tables.append(scripted_table(e, "scripted"))
    for t in tables:
        assert isinstance(t, CycleHooks), type(t).__name__


def _put_messages(table: pa.Table, path: list[str], *, corrupt_last: bool = False) -> list[bytes]:
    """Raw DoPut FlightData: the schema (with the descriptor), then one message per record batch."""
    from tickwire.protocol.flight import FlightDescriptor, encode_flight_data

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        for b in table.to_batches(max_chunksize=2):
            w.write_batch(b)
    reader = pa.ipc.MessageReader.open_stream(sink.getvalue())
    schema_msg = reader.read_next_message()
    out = [encode_flight_data(schema_msg.metadata.to_pybytes(), None, descriptor=FlightDescriptor.for_path(*path))]
    while True:
        try:
            m = reader.read_next_message()
        except StopIteration:
            break
        if m is None:
            break
        out.append(encode_flight_data(m.metadata.to_pybytes(), None, body=m.body.to_pybytes()))
    if corrupt_last:  # the last batch keeps its header and loses most of its body
        from tickwire.protocol.flight import decode_flight_data

        fd = decode_flight_data(out[-1])
        out[-1] = encode_flight_data(fd.data_header, None, body=bytes(fd.data_body)[:3])
    return out


def test_an_upload_cut_as_its_stream_ends_writes_nothing():
    """grpc's asyncio server ends the request stream of a cut call (cancelled, past its deadline,
    its connection lost) as it ends a finished one; the handler's cancellation comes later, from
    another event, as late as a loaded machine makes it. What gRPC does at once is fail the next
    send on the cut call and not resume the handler. Here the call is driven that way and the
    cancellation never comes: an upload cut as its stream ends is not written, whether it has
    batches or none, adds to a table or would make one; one that ends cleanly is written."""
    import asyncio

    from tests.harness import Services
    from tickwire.protocol.proto.methods import FLIGHT_SERVICE

    with Services() as s:
        fn = s.server.methods[f"/{FLIGHT_SERVICE}/DoPut"].fn

        def upload(messages: list[bytes], cut: bool) -> str:
            ctx = _FakeContext()

            async def requests():
                for m in messages:
                    yield m
                ctx.cut = cut  # gRPC knows the call was cut before the handler sees the stream end

            async def run() -> str:
                handler = fn(requests(), ctx)
                try:
                    async for _ in handler:  # gRPC sends each response before resuming the handler
                        if ctx.cut:
                            await handler.aclose()
                            return "cut"
                except asyncio.CancelledError:
                    return "cut"
                return "ok"

            return asyncio.run_coroutine_threadsafe(run(), s.server.loop).result(30)

        assert upload(_put_messages(batch(0, 4), ["scope", "kept"]), cut=False) == "ok"
        s.cycle()
        assert s.doget(b"s/kept").column("k").to_pylist() == [0, 1, 2, 3]
        assert upload(_put_messages(batch(100, 6), ["scope", "kept"]), cut=True) == "cut"
        assert upload(_put_messages(batch(100, 6), ["scope", "kept"])[:1], cut=True) == "cut"  # no batch
        assert upload(_put_messages(batch(0, 6), ["scope", "never"]), cut=True) == "cut"
        assert upload(_put_messages(batch(0, 6), ["scope", "empty"])[:1], cut=True) == "cut"
        s.cycle()
        assert s.doget(b"s/kept").column("k").to_pylist() == [0, 1, 2, 3]
        assert s.engine.resolve("never") is None and s.engine.resolve("empty") is None
        assert upload(_put_messages(batch(0, 6), ["scope", "empty"])[:1], cut=False) == "ok"
        assert s.engine.resolve("empty") is not None


class _FakeContext:
    """What DoPut asks of its call: credentials, the peer, its headers (an anonymous call, no
    deadline); like gRPC, it refuses to send on a call that was cut."""

    cut = False

    async def send_initial_metadata(self, metadata) -> None:
        if self.cut:
            raise RuntimeError("the call was cut")

    def invocation_metadata(self) -> tuple:
        return (("authorization", "Anonymous"),)

    def peer(self) -> str:
        return "in-process"

    def time_remaining(self):
        return None

    async def abort(self, code, details: str = "", trailing_metadata=()) -> None:
        import grpc

        raise grpc.aio.AbortError(f"{code.name}: {details}")


def test_a_refused_or_cut_doput_leaves_the_table_and_the_catalog_as_they_were(served):
    import grpc

    from tickwire.protocol.proto import flight_pb2

    client = fl.FlightClient(f"grpc://{served.target}")
    opts = fl.FlightCallOptions(headers=[(b"authorization", b"Anonymous")])
    writer, _ = client.do_put(fl.FlightDescriptor.for_path("scope", "kept"), SCHEMA, options=opts)
    writer.write_table(batch(0, 10))
    writer.close()

    def state():
        listing = sorted(tuple(i.descriptor.path) for i in client.list_flights(options=opts))
        return listing, client.do_get(fl.Ticket(b"s/kept"), options=opts).read_all()

    before = state()
    assert before[1].num_rows == 10
    path = "/arrow.flight.protocol.FlightService/DoPut"
    with grpc.insecure_channel(served.target) as ch:
        put = ch.stream_stream(path, request_serializer=None, response_deserializer=flight_pb2.PutResult.FromString)
        md = (("authorization", "Anonymous"),)
        # a corrupt last batch after good ones: refused, none of its batches applied
        with pytest.raises(grpc.RpcError) as err:
            list(put(iter(_put_messages(batch(100, 6), ["scope", "kept"], corrupt_last=True)), metadata=md, timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # another schema than the table's: refused
        other = pa.table({"k": pa.array([1, 2], pa.int64()), "w": pa.array(["a", "b"])})
        with pytest.raises(grpc.RpcError) as err:
            list(put(iter(_put_messages(other, ["scope", "kept"])), metadata=md, timeout=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        # a stream cut mid-way: two batches sent, then the client goes away
        gate = threading.Event()
        msgs = _put_messages(batch(200, 6), ["scope", "kept"])

        def cut():
            yield from msgs[:3]
            gate.wait(5)

        with pytest.raises(grpc.RpcError) as err:
            list(put(cut(), metadata=md, timeout=1.0))
        gate.set()
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        # cancelled mid-way, again and again (the server has acknowledged a batch of each)
        for _ in range(20):
            gate = threading.Event()
            call = put(cut(), metadata=md, timeout=10)
            assert isinstance(next(call), flight_pb2.PutResult)
            call.cancel()
            gate.set()
            with pytest.raises(grpc.RpcError) as err:
                list(call)
            assert err.value.code() == grpc.StatusCode.CANCELLED
        # the same three into a new name: nothing is created
        for bad in (_put_messages(batch(0, 6), ["scope", "never"], corrupt_last=True),):
            with pytest.raises(grpc.RpcError):
                list(put(iter(bad), metadata=md, timeout=10))
    after = state()
    assert after[0] == before[0]
    assert after[1].equals(before[1]), "a refused upload changed the table"
    client.close()


def test_with_cycle_on_write_a_write_runs_the_next_cycle_at_once():
    """The clock never moves: the 60 s cycle's time never comes, so only the writes' kicks run
    cycles (a fan-out worker's replicas apply each upstream update as it arrives)."""
    from tickwire.clock import ManualClock
    from tickwire.server.engine import EngineConfig

    engine = Engine(EngineConfig(interval_ms=60_000, cycle_on_write=True), clock=ManualClock()).start()
    try:
        t = engine.create(TableSpec("t", "append", pa.schema([("x", pa.int64())])))
        for i in range(3):
            engine.write(t, pa.table({"x": [i]}), timeout=30)  # waits for the cycle that applies it
        with engine.writes() as w:
            w.write(t, pa.table({"x": [3, 4]}))
        assert engine.resolve("t").size == 5
    finally:
        engine.stop()
