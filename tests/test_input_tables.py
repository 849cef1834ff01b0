"""Input tables: TableService.CreateInputTable and InputTableService (AddTableToInputTable,
DeleteTableFromInputTable), in process and through pydeephaven against tickwire and a real
Deephaven 42.7.

In process (tests/harness.py, the test stepping the cycles): each kind (append-only, key-backed,
blink) is made from an Arrow schema or a source table, marked as Deephaven marks an input table,
changed by adds and deletes that tickwire's client sees as a subscriber, and refuses what Deephaven
refuses with Deephaven's status. Through pydeephaven: the same calls against both servers give the
same rows, types, schema marks and refusals; pydeephaven-ticking follows a blink input table.

One difference is known: a key deleted from a key-backed table and added again comes back at its
old place in Deephaven (which keeps the row of every key it has seen) and at the end in tickwire,
so those contents are compared in key order.
"""
from __future__ import annotations

import base64
import gc

import grpc
import pyarrow as pa
import pytest

from tests.harness import Services, until
from tickwire.protocol.proto import inputtable_pb2, table_pb2
from tickwire.protocol.proto.methods import INPUT_TABLE_SERVICE, TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket

from .interop import close_dh_session
from .interop.dh_server import deephaven_server_available

KIND = table_pb2.CreateInputTableRequest.InputTableKind
SCHEMA = pa.schema([("K", pa.string()), ("K2", pa.int32()), ("V", pa.float64()), ("T", pa.timestamp("ns", "UTC"))])


def _rows(ks, k2s, vs, ts=None) -> pa.Table:
    ts = ts if ts is not None else list(range(len(ks)))
    return pa.table({"K": pa.array(ks, pa.string()), "K2": pa.array(k2s, pa.int32()),
                     "V": pa.array(vs, pa.float64()), "T": pa.array(ts, pa.timestamp("ns", "UTC"))})


def _kind(kind: str, keys=()) -> table_pb2.CreateInputTableRequest.InputTableKind:
    if kind == "keyed":
        return KIND(in_memory_key_backed=KIND.InMemoryKeyBacked(key_columns=list(keys)))
    if kind == "append":
        return KIND(in_memory_append_only=KIND.InMemoryAppendOnly())
    return KIND(blink=KIND.Blink())


def _schema_of(resp) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(resp.schema_header))


def _column_kinds(schema: pa.Schema) -> dict[str, str]:
    """column -> "key"/"value" from the schema's DeephavenTableMetadata (what the web client reads)."""
    raw = base64.b64decode((schema.metadata or {})[b"deephaven:tableMetadata"])
    md = inputtable_pb2.DeephavenTableMetadata.FromString(raw)
    info = inputtable_pb2.InputTableColumnInfo
    names = {info.KIND_KEY: "key", info.KIND_VALUE: "value"}
    return {c: names[info.kind] for c, info in md.input_table_metadata.column_info.items()}


def _marks(schema: pa.Schema) -> dict:
    """Everything that marks a schema as an input table's, to compare between servers."""
    md = schema.metadata or {}
    return {
        "attributes": sorted(k for k in md if k.startswith((b"deephaven:attribute", b"deephaven:unsent"))),
        "attribute values": sorted((k, v) for k, v in md.items() if k.startswith(b"deephaven:attribute.")),
        "columns": _column_kinds(schema),
        "fields": [(f.name, str(f.type), (f.metadata or {}).get(b"deephaven:inputtable.isKey"),
                    (f.metadata or {}).get(b"deephaven:inputtable.isValue"), (f.metadata or {}).get(b"deephaven:type"))
                   for f in schema],
    }


# -- in process -----------------------------------------------------------------------------------------------

class Client:
    """A session of tickwire's client over the in-process server; the test's calls use its
    session, so that its subscriptions see the session's exports."""

    def __init__(self, s: Services):
        self.s = s
        self.client = s.client()
        self.md = self.client.auth.metadata()
        self.next_id = 1

    def ticket(self) -> bytes:
        t = export_ticket(self.next_id)
        self.next_id += 1
        return t

    def create(self, kind: str, keys=(), *, schema: pa.Schema = SCHEMA, source: bytes | None = None,
               result: bytes | None = None):
        req = table_pb2.CreateInputTableRequest(kind=_kind(kind, keys))
        req.result_id.ticket = result if result is not None else self.ticket()
        if source is not None:
            req.source_table_id.ticket.ticket = source
        else:
            req.schema = schema.serialize().to_pybytes()
        return self.s.call(TABLE_SERVICE, "CreateInputTable", req, metadata=self.md)

    def put(self, data: pa.Table) -> bytes:
        t = self.ticket()
        self.s.put(["export", str(int.from_bytes(t[1:], "little"))], data, metadata=self.md)
        self.s.cycle()  # an upload's rows are in its table once a cycle has applied them
        return t

    def add(self, target: bytes, data: pa.Table) -> None:
        req = inputtable_pb2.AddTableRequest()
        req.input_table.ticket, req.table_to_add.ticket = target, self.put(data)
        self.s.call(INPUT_TABLE_SERVICE, "AddTableToInputTable", req, metadata=self.md)
        self.s.cycle()

    def delete(self, target: bytes, keys: pa.Table) -> None:
        req = inputtable_pb2.DeleteTableRequest()
        req.input_table.ticket, req.table_to_remove.ticket = target, self.put(keys)
        self.s.call(INPUT_TABLE_SERVICE, "DeleteTableFromInputTable", req, metadata=self.md)
        self.s.cycle()

    def rows(self, target: bytes) -> dict:
        return self.s.doget(target, metadata=self.md).to_pydict()


@pytest.fixture
def c():
    with Services() as s:
        yield Client(s)


def test_a_keyed_input_table_is_marked_as_deephaven_marks_one(c):
    resp = c.create("keyed", ["K", "K2"])
    assert resp.success and not resp.is_static and resp.size == 0
    schema = _schema_of(resp)
    assert schema.names == SCHEMA.names and schema.types == SCHEMA.types
    assert schema.metadata[b"deephaven:unsent.attribute.InputTable"] == b""
    assert not [k for k in schema.metadata if k.startswith(b"deephaven:attribute.")]
    assert _column_kinds(schema) == {"K": "key", "K2": "key", "V": "value", "T": "value"}
    assert [(f.metadata.get(b"deephaven:inputtable.isKey"), f.metadata.get(b"deephaven:inputtable.isValue"))
            for f in schema] == [(b"true", None), (b"true", None), (None, b"true"), (None, b"true")]


@pytest.mark.parametrize("kind, attributes", [("append", {"AddOnly", "AppendOnly", "IsFlat"}),
                                              ("blink", {"BlinkTable", "IsFlat"})])
def test_append_and_blink_input_tables_carry_their_kinds_attributes(c, kind, attributes):
    schema = _schema_of(c.create(kind))
    md = schema.metadata
    assert {k.decode().rpartition(".")[2] for k in md if k.startswith(b"deephaven:attribute.")} == attributes
    assert all(md[f"deephaven:attribute.{a}".encode()] == b"true" for a in attributes)
    assert b"deephaven:unsent.attribute.InputTable" in md
    assert set(_column_kinds(schema).values()) == {"value"}


def test_keyed_adds_upsert_and_deletes_remove_keys_and_a_subscriber_sees_each_change(c):
    target = c.create("keyed", ["K", "K2"]).result_id.ticket.ticket
    sub = c.client.subscribe(target)
    # within one add the last row of a key wins, at the place of its first row; a null key is a key
    c.add(target, _rows(["a", "b", "a", None], [1, 2, 1, 3], [1.0, 2.0, 3.0, 4.0]))
    assert c.rows(target)["V"] == [3.0, 2.0, 4.0]
    assert c.s.wait_for(sub, lambda x: x.size == 3)
    c.add(target, _rows(["b", "c"], [2, 5], [20.0, 50.0]))
    want = {"K": ["a", "b", None, "c"], "K2": [1, 2, 3, 5], "V": [3.0, 20.0, 4.0, 50.0]}
    got = c.rows(target)
    assert {k: got[k] for k in want} == want
    assert c.s.wait_for(sub, lambda x: x.table.column("V").to_pylist() == want["V"])
    # keys not in the table are ignored; key columns in any order; null keys delete
    c.delete(target, pa.table({"K2": pa.array([1, 9], pa.int32()), "K": ["a", "zz"]}))
    c.delete(target, pa.table({"K": pa.array([None], pa.string()), "K2": pa.array([3], pa.int32())}))
    assert c.rows(target)["K"] == ["b", "c"]
    assert c.s.wait_for(sub, lambda x: x.table.column("K").to_pylist() == ["b", "c"])
    assert sub.table.schema.field("T").type == pa.timestamp("ns", "UTC")


def test_an_append_input_table_appends_every_add(c):
    target = c.create("append").result_id.ticket.ticket
    data = _rows(["a", "a"], [1, 1], [1.0, 2.0])
    c.add(target, data)
    c.add(target, data.select(["V", "T", "K2", "K"]))  # columns in another order
    assert c.rows(target)["V"] == [1.0, 2.0, 1.0, 2.0]


def test_a_blink_input_table_holds_an_adds_rows_for_one_cycle(c):
    target = c.create("blink").result_id.ticket.ticket
    sub = c.client.subscribe(target)
    c.add(target, _rows(["a", "b"], [1, 2], [1.0, 2.0]))
    assert c.rows(target)["K"] == ["a", "b"]
    assert c.s.wait_for(sub, lambda x: x.size == 2)
    c.s.cycle()
    assert c.rows(target)["K"] == []
    assert c.s.wait_for(sub, lambda x: x.size == 0)


def test_an_input_table_made_from_a_source_takes_its_columns_and_none_of_its_rows(c):
    source = c.put(_rows(["a", "b"], [1, 2], [1.0, 2.0]))
    resp = c.create("keyed", ["K2"], source=source)
    assert resp.size == 0
    schema = _schema_of(resp)
    assert schema.names == SCHEMA.names
    assert _column_kinds(schema) == {"K": "value", "K2": "key", "V": "value", "T": "value"}
    assert c.rows(resp.result_id.ticket.ticket)["K"] == []


def test_input_tables_are_made_inside_a_batch(c):
    """CreateInputTable as a Batch step: from a schema, and from an earlier step's table (by
    batch_offset), whose columns it takes; a later step reads it; a refused step ends the batch."""
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add().empty_table
    op.size = 3
    first = batch.ops.add().create_input_table
    first.kind.CopyFrom(_kind("keyed", ["K"]))
    first.schema = SCHEMA.serialize().to_pybytes()
    first.result_id.ticket = keyed = c.ticket()
    second = batch.ops.add().create_input_table
    second.kind.CopyFrom(_kind("append"))
    second.source_table_id.batch_offset = 1
    second.result_id.ticket = appended = c.ticket()
    view = batch.ops.add().view
    view.source_id.batch_offset = 2
    view.column_specs.append("K")
    out = list(c.s.stream(TABLE_SERVICE, "Batch", batch, metadata=c.md))
    assert [r.success for r in out] == [True, True, True, True]
    assert _column_kinds(_schema_of(out[1])) == {"K": "key", "K2": "value", "V": "value", "T": "value"}
    assert _schema_of(out[2]).names == SCHEMA.names and _schema_of(out[3]).names == ["K"]
    c.add(appended, _rows(["a"], [1], [1.0]))
    c.add(keyed, _rows(["b", "b"], [1, 2], [1.0, 2.0]))
    assert c.rows(appended)["K"] == ["a"] and c.rows(keyed)["K2"] == [2]
    bad = table_pb2.BatchTableRequest()
    step = bad.ops.add().create_input_table
    step.kind.CopyFrom(_kind("keyed", ["Nope"]))
    step.schema = SCHEMA.serialize().to_pybytes()
    step.result_id.ticket = c.ticket()
    code, details = c.s.status(lambda: list(c.s.stream(TABLE_SERVICE, "Batch", bad, metadata=c.md)))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "Nope" in details


def test_released_input_tables_leave_the_engine(c):
    owned = c.s.ctx.ops.owned
    target = c.create("keyed", ["K"]).result_id.ticket.ticket
    assert c.s.ctx.ops.owned == owned + 1
    from tickwire.protocol.proto import session_pb2
    from tickwire.protocol.proto.methods import SESSION_SERVICE
    req = session_pb2.ReleaseRequest()
    req.id.ticket = target
    c.s.call(SESSION_SERVICE, "Release", req, metadata=c.md)
    assert until(lambda: c.s.ctx.ops.owned == owned)


def _status(c: Client, fn) -> tuple[grpc.StatusCode, str]:
    return c.s.status(fn)


def test_refusals_are_deephavens(c):
    keyed = c.create("keyed", ["K", "K2"]).result_id.ticket.ticket
    append = c.create("append").result_id.ticket.ticket
    blink = c.create("blink").result_id.ticket.ticket
    plain = c.put(_rows(["a"], [1], [1.0]))
    incompatible = "Provided tables's columns are not compatible: Table definition incompatibilities: \n\t"
    cases = [
        (lambda: c.add(keyed, _rows(["a"], [1], [1.0]).drop_columns(["T"])), incompatible
         + "this column 'T' is missing in other"),
        (lambda: c.add(keyed, _rows(["a"], [1], [1.0]).append_column("X", pa.array([1]))), incompatible
         + "other column 'X' is missing in this"),
        (lambda: c.add(keyed, _rows(["a"], [1], [1.0]).set_column(2, "V", pa.array([1], pa.int64()))), incompatible
         + "column 'V' is different ...\n\t    V: this dataType 'double' does not match other dataType 'long'"),
        (lambda: c.add(keyed, pa.table({"K": ["a"]})), incompatible
         + "this column 'K2' is missing in other\n\tthis column 'V' is missing in other\n\t"
           "this column 'T' is missing in other"),
        (lambda: c.add(plain, _rows(["a"], [1], [1.0])), "Table can't be used as an input table"),
        (lambda: c.delete(plain, pa.table({"K": ["a"]})), "Table can't be used as an input table"),
        (lambda: c.delete(append, pa.table({"K": ["a"]})), "Provided input table does not support delete."),
        (lambda: c.delete(keyed, _rows(["a"], [1], [1.0])),
         "Invalid Key Table Definition: Unknown key columns: [V, T]"),
        (lambda: c.delete(keyed, pa.table({"K": ["a"]})),
         'Invalid Key Table Definition: Key Column "K2" does not exist.\n'),
        (lambda: c.delete(keyed, pa.table({"K": ["a"], "K2": pa.array([1], pa.int64())})),
         'Invalid Key Table Definition: Key Column "K2" is not compatible.\n'),
        (lambda: c.delete(blink, pa.table({"K": ["a"]})), "Invalid Key Table Definition: Unknown key columns: [K]"),
        (lambda: c.create("keyed", ["Nope"]),
         "Missing key columns in definition: [Nope], available columns: [K, K2, V, T]"),
    ]
    for fn, message in cases:
        assert _status(c, fn) == (grpc.StatusCode.INVALID_ARGUMENT, message)
    assert c.rows(keyed)["K"] == []  # nothing refused was written


def test_create_requests_deephaven_refuses(c):
    def call(**fields):
        return lambda: c.s.call(TABLE_SERVICE, "CreateInputTable", table_pb2.CreateInputTableRequest(**fields),
                                metadata=c.md)
    schema = SCHEMA.serialize().to_pybytes()
    assert _status(c, call(schema=schema, kind=_kind("blink")))[0] == grpc.StatusCode.FAILED_PRECONDITION
    assert _status(c, call(result_id={"ticket": c.ticket()}, schema=schema)) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Unrecognized InputTableKind")
    assert _status(c, call(result_id={"ticket": c.ticket()}, kind=_kind("blink"))) == (
        grpc.StatusCode.INVALID_ARGUMENT, "Must specify one of schema and source_table_id")
    code, details = _status(c, call(result_id={"ticket": c.ticket()}, schema=b"garbage", kind=_kind("blink")))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "schema" in details


# -- through pydeephaven, against tickwire and a real Deephaven ------------------------------------------------

def _dh_status(exc: BaseException) -> str:
    seen: BaseException | None = exc
    while seen is not None:
        code = getattr(seen, "code", None)
        if callable(code):
            try:
                return f"{code().name}: {seen.details()}"
            except (AttributeError, TypeError, ValueError):
                pass
        seen = seen.__cause__ or seen.__context__
    return f"{type(exc).__name__}: {exc}"


@pytest.fixture(scope="module")
def sessions(request):
    why = deephaven_server_available()
    if why:
        pytest.skip(why)
    pytest.importorskip("pydeephaven")
    from pydeephaven import Session

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    dh = request.getfixturevalue("deephaven_server")
    engine = Engine(interval_ms=50)
    tw = TickwireServer(engine, port=0).start()
    out = {"deephaven": Session(host="127.0.0.1", port=dh.port), "tickwire": Session(host="127.0.0.1", port=tw.port)}
    try:
        yield out
    finally:
        for s in out.values():
            close_dh_session(s)  # each, whatever the other's close did
        tw.stop()
        engine.stop()


def _both(sessions, scenario) -> dict:
    """`scenario(session)` on each server. The tickwire server runs in this process: a pydeephaven
    Table that the cycle collector frees on one of its worker threads (one holding the engine's
    lock) would call into its session while the test's thread waits on that session for an answer
    that needs the lock, so the collector runs only between scenarios, on the test's thread."""
    out = {}
    for name, s in sessions.items():
        gc.disable()
        try:
            out[name] = scenario(s)
        finally:
            gc.enable()
            gc.collect()
    return out


def _attempt(fn):
    from pydeephaven import DHError
    try:
        return ("ok", fn())
    except DHError as exc:
        return ("refused", _dh_status(exc))


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_keyed_input_table_same_on_both(sessions):
    def scenario(s):
        t = s.input_table(schema=SCHEMA, key_cols=["K", "K2"])
        steps = [_marks(t.schema)]
        t.add(s.import_table(_rows(["a", "b", "a", None], [1, 2, 1, 3], [1.0, 2.0, 3.0, 4.0])))
        steps.append(t.to_arrow())
        t.add(s.import_table(_rows(["b", "c"], [2, 5], [20.0, 50.0], [10, 11])))
        steps.append(t.to_arrow())
        t.delete(s.import_table(pa.table({"K": ["a", "zz"], "K2": pa.array([1, 9], pa.int32())})))
        steps.append(t.to_arrow())
        t.delete(s.import_table(pa.table({"K2": pa.array([3], pa.int32()), "K": pa.array([None], pa.string())})))
        steps.append(t.to_arrow())
        t.add(s.import_table(_rows(["a", "d"], [1, 4], [7.0, 8.0])))  # "a" comes back: compared in key order
        steps.append(t.to_arrow().sort_by([("K", "ascending"), ("K2", "ascending")]))
        return steps

    got = _both(sessions, scenario)
    dh, tw = got["deephaven"], got["tickwire"]
    assert dh[0] == tw[0]
    for i, (a, b) in enumerate(zip(dh[1:], tw[1:])):
        assert a.schema.types == b.schema.types and a.to_pydict() == b.to_pydict(), f"step {i}"


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_append_and_blink_input_tables_same_on_both(sessions):
    def scenario(s):
        out = []
        t = s.input_table(schema=SCHEMA)
        out.append(_marks(t.schema))
        data = s.import_table(_rows(["a", None], [1, 2], [1.0, None]))
        t.add(data)
        t.add(data)
        out.append(t.to_arrow().to_pydict())
        b = s.input_table(schema=SCHEMA, blink_table=True)
        out.append(_marks(b.schema))
        src = s.input_table(init_table=data, key_cols="K2")  # columns only, no rows
        out.append((_marks(src.schema), src.size, src.to_arrow().num_rows))
        return out

    got = _both(sessions, scenario)
    assert got["deephaven"] == got["tickwire"]


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_refusals_same_on_both(sessions):
    def scenario(s):
        keyed = s.input_table(schema=SCHEMA, key_cols=["K", "K2"])
        append = s.input_table(schema=SCHEMA)
        plain = s.import_table(_rows(["a"], [1], [1.0]))
        svc = s.input_table_service
        exact = [
            _attempt(lambda: keyed.add(s.import_table(_rows(["a"], [1], [1.0]).drop_columns(["T"])))),
            _attempt(lambda: keyed.add(s.import_table(_rows(["a"], [1], [1.0]).append_column("X", pa.array([1]))))),
            _attempt(lambda: keyed.add(s.import_table(
                _rows(["a"], [1], [1.0]).set_column(2, "V", pa.array([1], pa.int64()))))),
            _attempt(lambda: svc.add(plain, plain)),
            _attempt(lambda: svc.delete(plain, plain)),
            _attempt(lambda: svc.delete(append, s.import_table(pa.table({"K": ["a"]})))),
            _attempt(lambda: keyed.to_arrow().num_rows),
        ]
        # Deephaven answers these INVALID_ARGUMENT with an opaque "Details Logged w/ID" message
        coded = [
            _attempt(lambda: keyed.delete(plain)),
            _attempt(lambda: keyed.delete(s.import_table(pa.table({"K": ["a"]})))),
            _attempt(lambda: s.input_table(schema=SCHEMA, key_cols=["Nope"])),
        ]
        try:
            append.delete(plain)
            refused_locally = None
        except PermissionError as exc:  # pydeephaven refuses it before asking the server
            refused_locally = str(exc)
        return exact, [(k, m.split(":")[0]) for k, m in coded], refused_locally

    got = _both(sessions, scenario)
    assert got["deephaven"] == got["tickwire"]
    assert got["tickwire"][1] == [("refused", "INVALID_ARGUMENT")] * 3


@pytest.mark.slow
@pytest.mark.interop
def test_pydeephaven_ticking_follows_keyed_and_blink_input_tables_on_both(sessions):
    from pydeephaven_ticking.table_listener import listen

    def scenario(s):
        keyed = s.input_table(schema=SCHEMA, key_cols=["K"])
        blink = s.input_table(schema=SCHEMA, blink_table=True)
        seen: dict = {"keyed": [], "blink": []}
        errors: list = []
        handles = [listen(keyed, lambda u: seen["keyed"].append(
                       (u.added(), u.modified(), u.removed())), errors.append),
                   listen(blink, lambda u: seen["blink"].append(u.added()), errors.append)]
        for h in handles:
            h.start()
        try:
            keyed.add(s.import_table(_rows(["a", "b"], [1, 2], [1.0, 2.0])))
            assert until(lambda: any(len(a.get("K", [])) == 2 for a, _m, _r in seen["keyed"]) or errors)
            keyed.add(s.import_table(_rows(["b"], [2], [5.0])))
            assert until(lambda: any(len(m.get("V", [])) for _a, m, _r in seen["keyed"]) or errors)
            keyed.delete(s.import_table(pa.table({"K": ["a"]})))
            assert until(lambda: any(len(r.get("K", [])) for _a, _m, r in seen["keyed"]) or errors)
            blink.add(s.import_table(_rows(["x", "y", "z"], [1, 2, 3], [1.0, 2.0, 3.0])))
            assert until(lambda: any(len(a.get("K", [])) == 3 for a in seen["blink"]) or errors)
            assert not errors, errors
            added_k = [a["K"].to_pylist() for a, _m, _r in seen["keyed"] if len(a.get("K", []))]
            modified_v = [m["V"].to_pylist() for _a, m, _r in seen["keyed"] if len(m.get("V", []))]
            removed_k = [r["K"].to_pylist() for _a, _m, r in seen["keyed"] if len(r.get("K", []))]
            blink_k = [a["K"].to_pylist() for a in seen["blink"] if len(a.get("K", []))]
            return added_k, modified_v, removed_k, blink_k
        finally:
            for h in handles:
                h.stop()

    got = _both(sessions, scenario)
    assert got["deephaven"] == got["tickwire"] == ([["a", "b"]], [[5.0]], [["a"]], [["x", "y", "z"]])
