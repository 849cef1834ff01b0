"""Aggregate requests that pydeephaven's Table API cannot send (initial_groups, preserve_empty,
count_where) answer what a real Deephaven 42.7 answers: the same raw TableService request, built with
Deephaven's own generated messages, goes to both servers through pydeephaven's `grpc_table_op`."""
from __future__ import annotations

import math

import pyarrow as pa
import pytest

from .interop.dh_server import deephaven_server_available

pytestmark = [pytest.mark.slow, pytest.mark.interop]

_WHY_NOT = deephaven_server_available()
if _WHY_NOT:
    pytest.skip(_WHY_NOT, allow_module_level=True)
pytest.importorskip("pydeephaven")

DATA = pa.table({"K": ["b", "a", "b", None, "a"], "X": pa.array([1, 2, 3, 4, None], pa.int32()),
                 "P": [1.5, math.nan, 60.0, 70.0, None], "S": ["aa", "b", None, "cccc", "dd"]})
GROUPS = pa.table({"K": ["z", "a", "b", "y", None]})


class _Aggregate:
    """An AggregateRequest for pydeephaven's `grpc_table_op`."""

    def __init__(self, initial=None, preserve=False, count_where=()):
        self.initial, self.preserve, self.count_where = initial, preserve, count_where

    @classmethod
    def get_stub_func(cls, stub):
        return stub.Aggregate

    def make_grpc_request(self, result_id, source_id):
        from deephaven_core.proto import table_pb2 as dh

        req = dh.AggregateRequest(result_id=result_id, source_id=source_id, preserve_empty=self.preserve,
                                  group_by_columns=["K"])
        a = req.aggregations.add()
        a.columns.spec.sum.SetInParent()
        a.columns.match_pairs.append("X")
        req.aggregations.add().count.column_name = "N"
        for i, filters in enumerate(self.count_where):
            cw = req.aggregations.add().count_where
            cw.column_name = f"CW{i}"
            cw.filters.extend(filters)
        if self.initial is not None:
            req.initial_groups_id.ticket.CopyFrom(self.initial.pb_ticket)
        return req


@pytest.fixture(scope="module")
def sessions(deephaven_server):
    from .interop import Beside

    with Beside(deephaven_server.port, {"data": DATA, "groups": GROUPS}) as both:
        (dh_t, tw_t), (dh_g, tw_g) = both.pair("data"), both.pair("groups")
        yield (both.dh, dh_t, dh_g), (both.tw, tw_t, tw_g)


def _answer(session, table, op):
    from pydeephaven import DHError

    try:
        out = session.table_service.grpc_table_op(table, op).to_arrow()
    except DHError as exc:
        return "refused", str(exc).splitlines()[0][:80]
    return out.schema.types, out.to_pylist()


@pytest.mark.parametrize("initial", [False, True])
@pytest.mark.parametrize("preserve", [False, True])
def test_initial_groups_and_preserve_empty(sessions, initial, preserve):
    (dh_s, dh_t, dh_g), (tw_s, tw_t, tw_g) = sessions
    dh = _answer(dh_s, dh_t, _Aggregate(dh_g if initial else None, preserve))
    tw = _answer(tw_s, tw_t, _Aggregate(tw_g if initial else None, preserve))
    assert dh[0] != "refused", dh
    assert tw == dh


def test_count_where_with_deephaven_filters(sessions):
    (dh_s, dh_t, _g), (tw_s, tw_t, _g2) = sessions
    wheres = (["P > 50"], ["X > 1", "!isNull(S)"], ["isNull(S)"], ["P != P"], ["X > 1 || P > 1"])
    dh = _answer(dh_s, dh_t, _Aggregate(count_where=wheres))
    tw = _answer(tw_s, tw_t, _Aggregate(count_where=wheres))
    assert dh[0] != "refused", dh
    assert tw == dh


def test_a_condition_that_fails_on_a_row_is_refused_by_both(sessions):
    """A String method on a null (Java's NullPointerException) fails the aggregation in both."""
    (dh_s, dh_t, _g), (tw_s, tw_t, _g2) = sessions
    wheres = (["X > 1", "S.length() > 1"],)
    assert _answer(dh_s, dh_t, _Aggregate(count_where=wheres))[0] == "refused"
    assert _answer(tw_s, tw_t, _Aggregate(count_where=wheres))[0] == "refused"
