"""DropColumns, EmptyTable, TimeTable, Slice, Flatten, MetaTable, Snapshot, SeekRow and
ComputeColumnStatistics answer what a real Deephaven 42.7 answers on the same data.

The same Arrow table goes into a real Deephaven server (pydeephaven's `import_table`) and into a
tickwire server as a static table; each operation is sent to both with pydeephaven (raw
TableService requests through its stubs where pydeephaven has no call) and the answers must be
equal: rows, values, Arrow types, and the status code of refusals. One Deephaven server serves the
whole module."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from .interop.dh_server import deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pydeephaven = pytest.importorskip("pydeephaven")

NS = 10 ** 9
T0 = 1_700_000_400 * NS
NAN = math.nan

DATA = pa.table({
    "I8": pa.array([1, None, -3, 1, 2, 127, -127, 4, 1], pa.int8()),
    "I32": pa.array([5, None, -3, 5, 7, 5, 100000, -100000, 5], pa.int32()),
    "I64": pa.array([5, None, -3, 5, 7, 5, 2 ** 62, 2 ** 62, 1], pa.int64()),
    "F32": pa.array([1.5, None, -3.0, NAN, -0.0, 0.0, 1.5, 2.25, 8.0], pa.float32()),
    "F64": pa.array([1.5, None, -3.0, NAN, -0.0, 0.0, 1.5, 2.25, 1e300], pa.float64()),
    "B": pa.array([True, None, False, True, True, None, False, True, True]),
    "S": pa.array(["Apple", None, "banana", "apple", "APPLE pie", "x", "Apple", "b", "Apple"]),
    "Ts": pa.array([T0, None, 0, T0, T0 + 1, 5, T0, 7, T0 - NS], pa.timestamp("ns", "UTC")),
})


@pytest.fixture(scope="module")
def servers(deephaven_server):
    from .interop import Beside

    with Beside(deephaven_server.port, {"data": DATA}) as both:
        dh_t, tw_t = both.pair("data")
        yield (both.dh, dh_t), (both.tw, tw_t)


def _plain(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays([c.combine_chunks() for c in t.columns], names=t.column_names)


def _code(fn):
    """("ok", result) or the status code of the refusal."""
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - pydeephaven wraps the gRPC error
        c = exc
        while c is not None and not hasattr(c, "code"):
            c = c.__cause__
        if c is None:
            raise
        return c.code(), None


def _both(servers, fn):
    (dh_s, dh_t), (tw_s, tw_t) = servers
    return _code(lambda: fn(dh_s, dh_t)), _code(lambda: fn(tw_s, tw_t))


def _same(dh, tw):
    assert dh[0] == tw[0], (dh, tw)
    if dh[0] == "ok" and isinstance(dh[1], pa.Table):
        a, b = _plain(dh[1]), _plain(tw[1])
        assert a.schema.equals(b.schema), (a.schema, b.schema)
        assert a.to_pylist() == b.to_pylist() or _nan_equal(a, b), (a.to_pylist(), b.to_pylist())
    elif dh[0] == "ok":
        assert dh[1] == tw[1]


def _nan_equal(a: pa.Table, b: pa.Table) -> bool:
    def norm(v):
        return "NaN" if isinstance(v, float) and math.isnan(v) else v
    return [{k: norm(v) for k, v in r.items()} for r in a.to_pylist()] == \
        [{k: norm(v) for k, v in r.items()} for r in b.to_pylist()]


def test_meta_table(servers):
    _same(*_both(servers, lambda s, t: t.meta_table.to_arrow()))


@pytest.mark.parametrize("cols", [["I8"], ["S", "Ts"], ["Nope"], ["I8", "Nope"]])
def test_drop_columns(servers, cols):
    _same(*_both(servers, lambda s, t: t.drop_columns(cols).to_arrow()))


@pytest.mark.parametrize("a, b", [(2, 5), (0, 0), (5, 2), (-3, 0), (-3, -1), (-1, -3), (2, -2), (-5, 8), (8, -5),
                                  (0, 100), (100, 200), (-100, 3), (3, 3), (-2, -2), (8, -1)])
def test_slice(servers, a, b):
    _same(*_both(servers, lambda s, t: t.slice(a, b).to_arrow()))


def test_flatten_and_snapshot(servers):
    from pydeephaven._table_ops import FlattenOp

    _same(*_both(servers, lambda s, t: s.table_service.grpc_table_op(t.where("I32 > 0"), FlattenOp()).to_arrow()))
    _same(*_both(servers, lambda s, t: t.where("I32 > 0").snapshot().to_arrow()))


def test_empty_table_and_time_table_refusals(servers):
    _same(*_both(servers, lambda s, t: (s.empty_table(5).size, s.empty_table(5).is_static)))
    _same(*_both(servers, lambda s, t: s.empty_table(-1)))
    _same(*_both(servers, lambda s, t: s.time_table(0)))
    _same(*_both(servers, lambda s, t: s.time_table(-5)))
    _same(*_both(servers, lambda s, t: s.time_table("bogus")))
    _same(*_both(servers, lambda s, t: (s.time_table(10 ** 9).size, s.time_table(10 ** 9).is_static)))
    _same(*_both(servers, lambda s, t: s.time_table(10 ** 9, start_time=0).schema.names))


def _seek(s, t, col, lit, start=0, ins=False, con=False, back=False):
    from deephaven_core.proto import table_pb2

    req = table_pb2.SeekRowRequest(column_name=col, starting_row=start, insensitive=ins, contains=con, is_backward=back)
    req.source_id.CopyFrom(t.pb_ticket)
    for k, v in lit.items():
        setattr(req.seek_value, k, v)
    return s.wrap_rpc(s.table_service._grpc_table_stub.SeekRow, req).result_row


SEEKS = [("S", {"string_value": "Apple"}, {"start": st, "back": b})
         for st in (-1, 0, 3, 6, 8, 100) for b in (False, True)]
SEEKS += [("S", {"string_value": "apple"}, {"ins": True}), ("S", {"string_value": "apple"}, {"ins": True, "con": True}),
          ("S", {"string_value": "PPL"}, {"con": True}), ("S", {"string_value": "ppl"}, {"con": True, "start": 3}),
          ("S", {"string_value": "zzz"}, {}), ("I32", {"long_value": 5}, {}), ("I32", {"long_value": 5}, {"start": 5}),
          ("I32", {"double_value": 5.7}, {}), ("I32", {"string_value": "5"}, {}), ("I32", {"bool_value": True}, {}),
          ("I32", {"long_value": 5}, {"con": True}), ("I32", {"nano_time_value": 5}, {}),
          ("F64", {"double_value": NAN}, {}), ("F64", {"double_value": 0.0}, {}), ("F64", {"double_value": -0.0}, {}),
          ("F64", {"long_value": 1}, {}), ("F64", {"double_value": 1.5}, {"start": 1}),
          ("F32", {"double_value": 2.25}, {}), ("I8", {"long_value": 257}, {}),
          ("B", {"bool_value": False}, {}), ("B", {"bool_value": True}, {"back": True}), ("B", {"long_value": 1}, {}),
          ("Ts", {"nano_time_value": T0}, {"start": 1}), ("Ts", {"long_value": T0}, {}),
          ("Nope", {"long_value": 1}, {}),
          ("S", {}, {}), ("S", {"string_value": "x"}, {"start": 2 ** 33 + 5}),
          ("S", {"string_value": "apple"}, {"con": True, "ins": True, "back": True, "start": 2})]


@pytest.mark.parametrize("col, lit, kw", SEEKS)
def test_seek_row(servers, col, lit, kw):
    _same(*_both(servers, lambda s, t: _seek(s, t, col, lit, **kw)))


def _stats(s, t, col, limit=None):
    from deephaven_core.proto import table_pb2
    from pydeephaven.table import Table
    from pydeephaven.ticket import ExportTicket

    req = table_pb2.ColumnStatisticsRequest(column_name=col)
    req.result_id.CopyFrom(s.make_export_ticket().pb_ticket)
    req.source_id.ticket.CopyFrom(t.pb_ticket)
    if limit is not None:
        req.unique_value_limit = limit
    r = s.wrap_rpc(s.table_service._grpc_table_stub.ComputeColumnStatistics, req)
    return Table(s, ticket=ExportTicket(r.result_id.ticket.ticket), schema_header=r.schema_header, size=r.size,
                 is_static=r.is_static).to_arrow()


@pytest.mark.parametrize("col, limit", [("I8", None), ("I32", None), ("I64", None), ("F32", None), ("F64", None),
                                        ("B", None), ("S", None), ("S", 2), ("S", 0), ("S", -1), ("Ts", None),
                                        ("Nope", None)])
def test_column_statistics(servers, col, limit):
    _same(*_both(servers, lambda s, t: _stats(s, t, col, limit)))
