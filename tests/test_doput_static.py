"""An upload (DoPut) to an export ticket makes a static table holding the uploaded rows, as
Deephaven's does: GetExportedTableCreationResponse says is_static, everything derived from it is
static, so formulas may use the row variables `i` and `ii` (refused on a ticking table that is
not append-only), after an aggregation too (pydeephaven's `import_table(t).agg_by(...).update(["C
= i"])`). An upload with key columns to an export, and an upload to ['scope', name], make (or
write) a live table as before.

The services run in process (tests.harness.Services); the comparison with Deephaven (slow,
interop) runs pydeephaven's import_table against both servers.
"""
from __future__ import annotations

import grpc
import pyarrow as pa
import pytest

from tests.harness import Services
from tickwire.protocol.proto import config_pb2, table_pb2, ticket_pb2
from tickwire.protocol.proto.methods import CONFIG_SERVICE, SESSION_SERVICE, TABLE_SERVICE
from tickwire.protocol.schema import BARRAGE_SCHEMA
from tickwire.protocol.tickets import export_ticket
from tickwire.server.engine import kind_of

DATA = pa.table({"A": pa.array([1, 2, 1, 3, 2], pa.int32()), "B": [1.5, 2.0, 3.0, 4.0, 0.5],
                 "S": ["a", "b", None, "d", "e"]})


class Client:
    def __init__(self, s: Services):
        self.s = s
        _r, headers = s.call_with_headers(CONFIG_SERVICE, "GetConfigurationConstants",
                                          config_pb2.ConfigurationConstantsRequest())
        self.token = dict(headers)["authorization"].split()[-1]

    def unary(self, method: str, request, service: str = TABLE_SERVICE):
        return self.s.call(service, method, request, token=self.token)

    def put(self, path: list[str], data: pa.Table, keys=None) -> None:
        self.s.put(path, data, token=self.token, keys=keys)

    def info(self, export_id: int) -> table_pb2.ExportedTableCreationResponse:
        return self.unary("GetExportedTableCreationResponse", ticket_pb2.Ticket(ticket=export_ticket(export_id)))

    def update(self, source: int, formulas: list[str], result: int):
        req = table_pb2.SelectOrUpdateRequest(column_specs=formulas)
        req.source_id.ticket.ticket = export_ticket(source)
        req.result_id.ticket = export_ticket(result)
        return self.unary("Update", req)

    def sum_by(self, source: int, by: list[str], result: int):
        req = table_pb2.AggregateAllRequest(spec=table_pb2.AggSpec(sum=table_pb2.AggSpec.AggSpecSum()),
                                            group_by_columns=by)
        req.source_id.ticket.ticket = export_ticket(source)
        req.result_id.ticket = export_ticket(result)
        return self.unary("AggregateAll", req)

    def doget(self, export_id: int) -> pa.Table:
        return self.s.doget(export_ticket(export_id), token=self.token)

    def release(self, export_id: int) -> None:
        from tickwire.protocol.proto import session_pb2

        req = session_pb2.ReleaseRequest()
        req.id.ticket = export_ticket(export_id)
        self.unary("Release", req, SESSION_SERVICE)


def _table(s: Services, c: Client, export_id: int):
    session = s.session_of(c.token)
    assert session is not None
    return session.get(export_id)


def test_an_export_upload_is_a_static_table_of_the_uploaded_rows():
    with Services() as s:
        c = Client(s)
        c.put(["export", "1"], DATA)
        table = _table(s, c, 1)
        assert kind_of(table) == "static" and not table.is_refreshing and table.hidden
        assert table.attributes[BARRAGE_SCHEMA] == DATA.schema and table.attributes["IsFlat"] is True
        info = c.info(1)
        assert info.success and info.is_static and info.size == 5
        assert c.doget(1).equals(DATA)  # no cycle ran: the rows are there when the upload answers
        assert s.engine.step == 0


def test_what_derives_from_an_upload_is_static_and_may_use_the_row_variables():
    with Services() as s:
        c = Client(s)
        c.put(["export", "1"], DATA)
        c.update(1, ["Row = i", "Row2 = ii"], 2)
        assert c.info(2).is_static
        got = c.doget(2)
        assert got["Row"].to_pylist() == [0, 1, 2, 3, 4] and got["Row2"].to_pylist() == [0, 1, 2, 3, 4]
        c.put(["export", "3"], DATA.select(["A", "B"]))
        c.sum_by(3, ["A"], 4)  # pydeephaven's test_agg_all_by: an aggregation, then `i`
        c.update(4, ["Col1 = i"], 5)
        assert c.info(5).is_static
        assert c.doget(5).to_pydict() == {"A": [1, 2, 3], "B": [4.5, 2.5, 4.0], "Col1": [0, 1, 2]}


def test_an_empty_export_upload_is_an_empty_static_table():
    with Services() as s:
        c = Client(s)
        c.put(["export", "1"], DATA.slice(0, 0))
        info = c.info(1)
        assert info.success and info.is_static and info.size == 0
        assert c.doget(1).schema.names == DATA.schema.names


def test_keyed_and_scope_uploads_stay_live_tables():
    with Services() as s:
        c = Client(s)
        c.put(["export", "1"], DATA.slice(0, 2), keys=["A"])
        c.put(["scope", "t"], DATA)
        c.put(["scope", "t"], DATA.slice(0, 1))  # appends
        s.cycle()
        keyed, scope = _table(s, c, 1), s.engine.resolve("t")
        assert kind_of(keyed) == "keyed" and keyed.is_refreshing and not c.info(1).is_static
        assert kind_of(scope) == "append" and scope.is_refreshing and scope.size == 6
        code, details = Services.status(lambda: c.update(1, ["Row = i"], 2))
        assert code == grpc.StatusCode.INVALID_ARGUMENT  # `i` on a ticking table that is not append-only


def test_a_released_upload_leaves_the_engine():
    with Services() as s:
        c = Client(s)
        before = len(s.engine.tables(hidden=True))
        c.put(["export", "1"], DATA)
        assert len(s.engine.tables(hidden=True)) == before + 1 and s.ctx.ops.owned == 1
        c.release(1)
        assert len(s.engine.tables(hidden=True)) == before and s.ctx.ops.owned == 0


# -- against a real Deephaven ---------------------------------------------------------------------

def _story(port: int) -> list:
    from pydeephaven import Session, agg

    s = Session(host="127.0.0.1", port=port)
    try:
        t = s.import_table(DATA)
        info = s.table_service.fetch_etcr(t.ticket.pb_ticket)
        summed = t.agg_by([agg.sum_("B")], by=["A"]).update(["Col1 = i"])
        rows = t.update(["Row = i", "Row2 = ii"])
        return [info.is_static, info.size, summed.is_refreshing, summed.to_arrow().to_pydict(),
                rows.is_refreshing, rows.to_arrow()["Row2"].to_pylist()]
    finally:
        s.close()


@pytest.mark.slow
@pytest.mark.interop
def test_export_uploads_are_static_as_in_deephaven(deephaven_server):
    from tests.interop import told_by_both

    dh, tw = told_by_both(deephaven_server.port, _story)
    assert dh == tw
    assert dh[:3] == [True, 5, False]
