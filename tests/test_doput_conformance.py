"""Uploads of map, union, list_view and null columns, and refused uploads, against a real
Deephaven 42.7 and tickwire, with pydeephaven's `import_table` and with pyarrow's Flight client.

What Deephaven 42.7 does, as these tests measure it:

- map<K, V>, dense and sparse unions (type codes and member names kept), list_view<T> and null
  columns are accepted and served back with the uploaded Arrow type (DoGet, GetFlightInfo; unions,
  list_views and nulls also in Barrage subscriptions): `deephaven:type` java.util.Map,
  java.lang.Object, `T[]` (a list_view is not made a list) and java.lang.Object. Unions inside
  lists, maps and unions too. A list of nulls or of unions is `java.lang.Object[]` and a list of
  maps `java.util.Map[]`, each with `deephaven:componentType` java.lang.String.
- Sentinel values read as null inside these types as in lists: a map's values (not its keys),
  list_view elements, union members (instants' -2^63 too), uint16 0xFFFF included.
- Deephaven's DoGet of a map column cannot be read by pyarrow ("Map array child array should have
  no nulls": it sends the entries struct's field node as (rows + 1, 1)); tickwire sends a well-formed one.
- large_list_view, large_list, large_string and large_binary are refused (with or without a
  `deephaven:type`), and so are decimal32/64 inside lists, maps and unions, and structs inside
  lists, list_views, maps and unions.
- A refused upload: Deephaven answers the refusal only after the client sent a record batch or
  half-closed (a client that waits after sending the schema waits for its deadline); tickwire ends
  the call as soon as the schema is read. pydeephaven's `import_table` writes its batches at once
  and reads one PutResult, and pyarrow turns a call that ended without one into `None`, not an
  error: against both servers `import_table` returns and the refusal comes with the next call
  naming the table (Deephaven: the refusal or "Export in state DEPENDENCY_FAILED"; tickwire:
  INVALID_ARGUMENT naming the column and its type).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine

from .interop.dh_server import deephaven_server_available
from .test_doput_types import (
    REFUSED_NESTED,
    UPLOAD_ONLY,
    UPLOAD_ONLY_NULLED,
    Uploader,
    answer,
    barrage_updates,
    expected_upload_only,
    values,
)

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")



def _has_map(t: pa.DataType) -> bool:
    return bool(pa.types.is_map(t)) or any(_has_map(t.field(i).type) for i in range(t.num_fields))


#: columns holding maps (a list of maps too), whose Deephaven batches pyarrow cannot read
MAPS = [n for n, (arr, _dh) in UPLOAD_ONLY.items() if _has_map(arr.type)]
NOT_MAPS = [n for n in UPLOAD_ONLY if n not in MAPS]
#: what pyarrow says of Deephaven 42.7's DoGet of a map column
DH_MAP_BATCH = "Map array child array should have no nulls"


@pytest.fixture(scope="module")
def tickwire():
    engine = Engine(interval_ms=50)
    server = TickwireServer(engine, port=0).start()
    try:
        yield server
    finally:
        server.stop()
        engine.stop()


@pytest.fixture(scope="module")
def ports(deephaven_server, tickwire):
    return {"deephaven": deephaven_server.port, "tickwire": tickwire.port}


@pytest.fixture(scope="module")
def uploaders(deephaven_server, tickwire):
    ups = {"deephaven": Uploader(deephaven_server.target), "tickwire": Uploader(f"127.0.0.1:{tickwire.port}")}
    yield ups
    for up in ups.values():
        up.close()


def _table(names) -> pa.Table:
    return pa.table({n: UPLOAD_ONLY[n][0] for n in names})


def test_pydeephaven_reads_unions_list_views_and_nulls_back_alike(ports):
    got = {}
    for kind, port in ports.items():
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        try:
            back = session.import_table(_table(NOT_MAPS)).to_arrow()
            got[kind] = (answer(back), {f.name: (f.metadata or {}).get(b"deephaven:componentType")
                                        for f in back.schema})
        finally:
            session.close()
    assert got["deephaven"][0] == {n: a for n, a in expected_upload_only().items() if n in NOT_MAPS}
    assert got["tickwire"] == got["deephaven"]


def test_maps_are_kept_and_tickwire_sends_them_readable(ports):
    for name in MAPS:
        data = _table([name])
        theirs = ours = None
        for kind, port in ports.items():
            session = pydeephaven.Session(host="127.0.0.1", port=port)
            try:
                table = session.import_table(data)
                if kind == "deephaven":
                    try:
                        theirs = answer(table.to_arrow())
                    except Exception as exc:  # noqa: BLE001 - Deephaven 42.7's map batches (see the docstring)
                        assert DH_MAP_BATCH in str(exc.__cause__ or exc), exc
                else:
                    ours = answer(table.to_arrow())
            finally:
                session.close()
        assert ours == {name: expected_upload_only()[name]}, name
        if theirs is not None:  # (a Deephaven whose map batches pyarrow reads)
            assert theirs == ours, name


def test_flight_info_and_doget_types_agree(uploaders):
    data = _table(UPLOAD_ONLY)
    info = {}
    for kind, up in uploaders.items():
        i = up.put(data)
        info[kind] = [(f.name, str(f.type), (f.metadata or {}).get(b"deephaven:type")) for f in up.info_schema(i)]
    assert info["tickwire"] == info["deephaven"]
    assert info["deephaven"] == [(n, str(arr.type), dh.encode()) for n, (arr, dh) in UPLOAD_ONLY.items()]
    ours = uploaders["tickwire"]
    assert answer(ours.get(uploaders["tickwire"].next_id)) == expected_upload_only()


def test_sentinels_inside_these_types_read_as_null_alike(uploaders):
    names = [n for n, (arr, _) in UPLOAD_ONLY_NULLED.items() if not _has_map(arr.type)]
    got = {}
    for kind, up in uploaders.items():
        for n in names:  # one table each: they differ in length
            got.setdefault(kind, {}).update(values(up.get(up.put(pa.table({n: UPLOAD_ONLY_NULLED[n][0]})))))
    assert got["deephaven"] == {n: (str(UPLOAD_ONLY_NULLED[n][0].type), UPLOAD_ONLY_NULLED[n][1]) for n in names}
    assert got["tickwire"] == got["deephaven"]
    # maps (read by tickwire only, see the docstring): their values read as null, their keys not
    ours = uploaders["tickwire"]
    for n in (n for n in UPLOAD_ONLY_NULLED if n not in names):
        assert values(ours.get(ours.put(pa.table({n: UPLOAD_ONLY_NULLED[n][0]})))) == {
            n: (str(UPLOAD_ONLY_NULLED[n][0].type), UPLOAD_ONLY_NULLED[n][1])}


def test_barrage_subscriptions_serve_them_alike(ports):
    data = _table(NOT_MAPS)
    got = {}
    for kind, port in ports.items():
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        try:
            table = session.import_table(data)
            headers = [(k.decode() if isinstance(k, bytes) else k, v.decode() if isinstance(v, bytes) else v)
                       for k, v in session.grpc_metadata]
            schema, (snapshot,) = barrage_updates(f"127.0.0.1:{port}", headers, table.ticket.bytes, 1)
            got[kind] = ([str(f.type) for f in schema], values(snapshot.added_table(schema)))
        finally:
            session.close()
    assert got["deephaven"] == ([str(data.schema.field(n).type) for n in NOT_MAPS], values(data))
    assert got["tickwire"] == got["deephaven"]


@pytest.mark.parametrize("name", sorted(REFUSED_NESTED))
def test_both_refuse_the_same_uploads(uploaders, name):
    data = pa.table({name: REFUSED_NESTED[name]})
    theirs = uploaders["deephaven"].refusal(data)
    ours = uploaders["tickwire"].refusal(data)
    assert "invalid argument" in theirs.lower(), theirs
    assert "invalid argument" in ours.lower(), ours
    assert repr(name) in ours and str(data.schema.field(0).type) in ours, ours


def _session_options(session, timeout: float) -> fl.FlightCallOptions:
    return fl.FlightCallOptions(headers=session.grpc_metadata, timeout=timeout)


def test_a_refused_schema_ends_tickwires_call_at_once_and_deephavens_at_the_clients_end(ports):
    """After sending only the schema, the client reads: tickwire has ended the call with the
    refusal; Deephaven answers nothing until the client half-closes (here: its deadline)."""
    schema = pa.schema([("LV", pa.large_list_view(pa.int32()))])
    ended = {}
    for kind, port in ports.items():
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        client = fl.FlightClient(f"grpc://127.0.0.1:{port}")
        try:
            timeout = 30 if kind == "tickwire" else 3
            writer, reader = client.do_put(fl.FlightDescriptor.for_path("export", "41"), schema,
                                           _session_options(session, timeout))
            assert reader.read() is None  # the call ended: tickwire's refusal, or Deephaven's deadline
            with pytest.raises(fl.FlightError if kind == "deephaven" else pa.ArrowInvalid) as err:
                writer.close()
            ended[kind] = str(err.value)
        finally:
            client.close()
            session.close()
    assert "'LV'" in ended["tickwire"] and "large_list_view<item: int32>" in ended["tickwire"], ended
    assert "deadline" in ended["deephaven"].lower(), ended


def test_pydeephaven_hears_a_refusal_at_its_next_call_on_both(ports):
    """import_table cannot raise on a refusal that arrives after its batches were written
    (pyarrow reads an ended call as no PutResult); the next call naming the table does."""
    data = pa.table({"LS": pa.array([[{"a": 1}], None], pa.list_(pa.struct([("a", pa.int32())])))})
    heard = {}
    for kind, port in ports.items():
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        try:
            try:
                table = session.import_table(data)
            except pydeephaven.DHError as exc:  # the refusal arrived before the batch was written
                heard[kind] = str(exc.__cause__)
                continue
            with pytest.raises(pydeephaven.DHError) as err:
                table.to_arrow()
            heard[kind] = str(err.value.__cause__)
        finally:
            session.close()
    assert "invalid argument" in heard["deephaven"].lower() and "Struct" in heard["deephaven"], heard
    assert "invalid argument" in heard["tickwire"].lower(), heard
    assert "'LS'" in heard["tickwire"] and "list<item: struct<a: int32>>" in heard["tickwire"], heard



def test_head_and_tail_send_them_as_deephaven_sends_objects(ports):
    """A table made from an upload by head or tail no longer has the upload's schema: maps,
    unions and nulls are sent as their Java toString() (utf8), list_views as lists, lists of
    them as lists of those; the same as Deephaven, metadata included. (A list inside a map or a
    union has no reproducible text: Deephaven sends its identity, `[I@44e988ca`; tickwire refuses.)"""
    names = [n for n, (arr, _dh) in UPLOAD_ONLY.items() if n not in ("MapList", "SparseList")]
    data = _table(names)
    got = {}
    for kind, port in ports.items():
        session = pydeephaven.Session(host="127.0.0.1", port=port)
        try:
            table = session.import_table(data)
            got[kind] = [answer(table.head(3).to_arrow()), answer(table.tail(2).to_arrow())]
        finally:
            session.close()
    assert got["tickwire"] == got["deephaven"]
    assert got["deephaven"][0]["Map"] == ("string", "java.util.Map", ["{a=1, b=null}", None, "{}"])
    assert got["deephaven"][0]["ListView"][0] == "list<: int32>"
