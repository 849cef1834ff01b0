"""Flight SQL in process: the SQL tickwire serves (server/services/sql.py), its commands, tickets,
prepared statements and their lifetimes (server/services/flight_sql.py), and the logins Flight SQL
clients use (a bearer value that is an auth type and credentials; Deephaven's auth cookie).
Real clients (ADBC, flightsql-dbapi) and the comparison with Deephaven are in
tests/test_flight_sql_interop.py."""
from __future__ import annotations

import grpc
import pyarrow as pa
import pytest
from google.protobuf import any_pb2

from tests.harness import Services
from tickwire.protocol.proto import flight_pb2, flight_sql_pb2
from tickwire.protocol.proto.methods import FLIGHT_SERVICE
from tickwire.server.config import ServerConfig
from tickwire.server.engine import TableSpec
from tickwire.server.services.flight_sql import MAX_PENDING_QUERIES, QUERY_TIMEOUT_S, filter_predicate
from tickwire.server.services.sessions import PSK_SCHEME
from tickwire.server.services.sql import ColumnItem, Compare, LiteralItem, SqlError, parse_select

PREFIX = "type.googleapis.com/arrow.flight.protocol.sql."
DATA = pa.table({"A": pa.array([1, 2, 3, None], pa.int32()), "B": [1.5, float("nan"), -2.0, 4.0],
                 "S": ["x", "y", None, "z"], "L": pa.array([10, 20, 30, 40], pa.int64())})


def _packed(msg) -> bytes:
    return any_pb2.Any(type_url=PREFIX + type(msg).DESCRIPTOR.name, value=msg.SerializeToString()).SerializeToString()


def _cmd(msg) -> flight_pb2.FlightDescriptor:
    return flight_pb2.FlightDescriptor(type=flight_pb2.FlightDescriptor.CMD, cmd=_packed(msg))


def _info(s: Services, msg, token: str) -> flight_pb2.FlightInfo:
    return s.call(FLIGHT_SERVICE, "GetFlightInfo", _cmd(msg), token=token)


def _query(s: Services, sql: str, token: str) -> pa.Table:
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query=sql), token)
    return s.doget(info.endpoint[0].ticket.ticket, token=token)


def _action(s: Services, kind: str, msg, token: str) -> list[bytes]:
    results = s.stream(FLIGHT_SERVICE, "DoAction", flight_pb2.Action(type=kind, body=_packed(msg)), token=token)
    return [r.body for r in results]


@pytest.fixture()
def s():
    with Services() as services:
        services.engine.create(TableSpec("t", "static", data=DATA))
        yield services


# -- the SQL ---------------------------------------------------------------------------------------------
def test_literals_take_deephavens_types_and_names():
    plan = parse_select("select 88, 2147483648 AS big, -2147483648, 2.5e0, 'it''s', 'a', TRUE x")
    items = [(i.literal.kind, i.literal.value, i.alias) for i in plan.items if isinstance(i, LiteralItem)]
    assert items == [("int", 88, None), ("long", 2147483648, "big"), ("int", None, None), ("double", 2.5, None),
                     ("string", "it's", None), ("char", "a", None), ("bool", True, "x")]


def test_conditions_put_the_column_first():
    plan = parse_select('SELECT "A", t.S FROM t WHERE 2 < A')
    assert plan.where == Compare(">", plan.where.left, plan.where.right) and plan.where.left.name == "A"
    assert [i.column.name for i in plan.items if isinstance(i, ColumnItem)] == ["A", "S"]


@pytest.mark.parametrize("sql, named", [
    ("SELECT COUNT(*) FROM t", "function COUNT"), ("SELECT A FROM t ORDER BY A", "ORDER BY"),
    ("SELECT A FROM t LIMIT 2", "LIMIT"), ("SELECT S, A FROM t GROUP BY S", "GROUP BY"),
    ("SELECT A + 1 FROM t", "operator '+'"), ("SELECT 1.5", "exact decimal 1.5"),
    ("SELECT 88 UNION ALL SELECT 89", "UNION"), ("SELECT DISTINCT A FROM t", "DISTINCT"),
    ("SELECT A FROM t JOIN u ON t.A = u.A", "joins"), ("SELECT A FROM t, u", "joins"),
    ("SELECT NULL", "NULL literal"), ("SELECT A FROM t WHERE A = NULL", "NULL literal"),
    ("SELECT A FROM t WHERE A IN (1, 2)", "IN lists"), ("SELECT 88 FROM t", "literal in the select list"),
    ("SELECT A FROM (SELECT A FROM t)", "subquery"), ("SELECT A FROM t WHERE 1 = 1", "two literals"),
])
def test_what_is_not_served_is_refused_by_name(sql, named):
    with pytest.raises(SqlError) as err:
        parse_select(sql)
    assert named in str(err.value) and "not served" in str(err.value) and err.value.code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("sql", ["SELEC 1", "SELECT A FROM t;", "SELECT", "SELECT A FROM", "SELECT A FROM t WHERE",
                                 "SELECT A FROM t WHERE A >", "SELECT 'open", "SELECT A B C FROM t", "SELECT #"])
def test_text_that_is_not_sql_cannot_be_parsed(sql):
    with pytest.raises(SqlError, match="query can't be parsed"):
        parse_select(sql)


def test_parameters_are_refused_as_deephaven_words_it():
    with pytest.raises(SqlError, match="Illegal use of dynamic parameter"):
        parse_select("SELECT ?")


def test_name_patterns_match_as_deephaven_reads_them():
    assert filter_predicate("%")("anything") and not filter_predicate("")("t")
    assert filter_predicate("t_a%")("tXabc") and not filter_predicate("t_a%")("ta")
    assert filter_predicate("a.b")("a.b") and not filter_predicate("a.b")("aXb")  # '.' is not special


# -- queries through the Flight service -------------------------------------------------------------------
def test_a_query_answers_its_schema_then_its_rows_once(s):
    token = s.new_session()
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT A, S AS Name FROM t WHERE A > 1"), token)
    schema = pa.ipc.read_schema(pa.py_buffer(info.schema))
    assert schema.names == ["A", "Name"] and info.total_records == 2
    ticket = info.endpoint[0].ticket.ticket
    assert ticket[:1] == b"q"
    assert s.doget(ticket, token=token).to_pydict() == {"A": [2, 3], "Name": ["y", None]}
    code, details = s.status(lambda: s.doget(ticket, token=token))
    assert code == grpc.StatusCode.NOT_FOUND and "at most once" in details
    assert s.ctx.ops.owned == 0  # the result (and the filter under it) left the engine with the read


@pytest.mark.parametrize("sql, expected", [
    ("SELECT 88", {"EXPR$0": [88]}),
    ("SELECT 'a', 7 AS b, 'abc', 2.5e0, FALSE", {"EXPR$0": [97], "b": [7], "EXPR$2": ["abc"], "EXPR$3": [2.5],
                                                 "EXPR$4": [False]}),
    ("SELECT -2147483648, 3000000000", {"EXPR$0": [None], "EXPR$1": [3000000000]}),
    ("SELECT * FROM t WHERE L = 20", {"A": [2], "B": [pytest.approx(float("nan"), nan_ok=True)], "S": ["y"],
                                      "L": [20]}),
    ("SELECT A FROM t WHERE A < 2", {"A": [1, None]}),  # null is below every value
    ("SELECT A FROM t WHERE A <> 2", {"A": [1, 3, None]}),
    ("SELECT S FROM t WHERE S < 'y'", {"S": ["x", None]}),
    ("SELECT S FROM t WHERE S >= 'y'", {"S": ["y", "z"]}),
    ("SELECT B FROM t WHERE B <> 1.5e0", {"B": [pytest.approx(float("nan"), nan_ok=True), -2.0, 4.0]}),
    ("SELECT A FROM t WHERE B > 1", {"A": [1, None]}),  # NaN is not above 1
    ("SELECT A FROM t WHERE NOT (A = 1)", {"A": [2, 3, None]}),
    ("SELECT A FROM t WHERE NOT (A <> 2 AND B > 0)", {"A": [2, 3]}),
    ("SELECT S FROM t WHERE S = 'x' OR S IS NULL", {"S": ["x", None]}),
    ("SELECT A, A FROM t WHERE A IS NOT NULL", {"A": [1, 2, 3], "A0": [1, 2, 3]}),
    ("SELECT x.L AS LL FROM t AS x WHERE x.A >= 2", {"LL": [20, 30]}),
    ("SELECT A FROM t WHERE TRUE AND L > 2147483648", {"A": []}),
])
def test_queries_answer_as_deephaven(s, sql, expected):
    got = _query(s, sql, s.new_session()).to_pydict()
    assert got == expected


def test_literal_types_on_the_wire(s):
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT 1, 3000000000, 'c', 'cc', 1e0, TRUE"),
                 s.new_session())
    schema = pa.ipc.read_schema(pa.py_buffer(info.schema))
    assert [f.type for f in schema] == [pa.int32(), pa.int64(), pa.uint16(), pa.string(), pa.float64(), pa.bool_()]
    assert [f.metadata[b"deephaven:type"] for f in schema] == [b"int", b"long", b"char", b"java.lang.String",
                                                              b"double", b"java.lang.Boolean"]


@pytest.mark.parametrize("sql, code, words", [
    ("SELECT * FROM nope", grpc.StatusCode.NOT_FOUND, "Flight SQL: Object 'nope' not found"),
    ("select a from t", grpc.StatusCode.NOT_FOUND, "Column 'a' not found in any table; did you mean 'A'?"),
    ("SELECT y.A FROM t x", grpc.StatusCode.NOT_FOUND, "Table 'y' not found"),
    ("SELEC 1", grpc.StatusCode.INVALID_ARGUMENT, "Flight SQL: query can't be parsed"),
    ("SELECT A FROM t ORDER BY A", grpc.StatusCode.INVALID_ARGUMENT, "ORDER BY is not served"),
    ("SELECT A FROM t WHERE S > 1", grpc.StatusCode.INVALID_ARGUMENT, "the condition cannot be evaluated"),
    ('SELECT A AS "my col" FROM t', grpc.StatusCode.INVALID_ARGUMENT, "'my col' is not a valid column name"),
])
def test_refusals_say_what_was_wrong_and_leave_nothing_behind(s, sql, code, words):
    token = s.new_session()
    got = s.status(lambda: _info(s, flight_sql_pb2.CommandStatementQuery(query=sql), token))
    assert got[0] == code and words in got[1]
    assert s.ctx.ops.owned == 0
    assert _query(s, "SELECT 1", token).to_pydict() == {"EXPR$0": [1]}  # the server goes on


def test_a_query_of_a_ticking_table_reads_its_rows_when_run(s):
    live = s.engine.create(TableSpec("live", "append", schema=pa.schema([("X", pa.int64())])))
    s.write(live, pa.table({"X": [1, 2, 3]}))
    s.cycle()
    token = s.new_session()
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT X FROM live WHERE X >= 2"), token)
    assert info.total_records == -1
    s.write(live, pa.table({"X": [4]}))
    s.cycle()
    assert s.doget(info.endpoint[0].ticket.ticket, token=token).to_pydict() == {"X": [2, 3, 4]}


def test_a_result_is_read_by_its_session_only(s):
    mine, other = s.new_session(), s.new_session()
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT 1"), mine)
    ticket = info.endpoint[0].ticket.ticket
    code, details = s.status(lambda: s.doget(ticket, token=other))
    assert code == grpc.StatusCode.PERMISSION_DENIED and "x-deephaven-auth-cookie-request" in details
    assert s.doget(ticket, token=mine).to_pydict() == {"EXPR$0": [1]}  # still there for its owner


def test_a_result_not_read_in_time_is_released(s):
    token = s.new_session()
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT A FROM t WHERE A > 1"), token)
    assert s.ctx.ops.owned == 2  # the filter and the view over it
    s.advance(QUERY_TIMEOUT_S)
    code, _ = s.status(lambda: s.doget(info.endpoint[0].ticket.ticket, token=token))
    assert code == grpc.StatusCode.NOT_FOUND
    assert s.ctx.ops.owned == 0


def test_unread_results_of_a_session_are_bounded(s):
    token = s.new_session()
    infos = [_info(s, flight_sql_pb2.CommandStatementQuery(query=f"SELECT {i}"), token)
             for i in range(MAX_PENDING_QUERIES + 3)]
    assert s.ctx.ops.owned == MAX_PENDING_QUERIES
    assert s.status(lambda: s.doget(infos[0].endpoint[0].ticket.ticket, token=token))[0] == grpc.StatusCode.NOT_FOUND
    assert s.doget(infos[-1].endpoint[0].ticket.ticket, token=token).to_pydict() == {
        "EXPR$0": [MAX_PENDING_QUERIES + 2]}


def test_a_session_that_ends_releases_its_results_and_statements(s):
    token = s.new_session()
    _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT A FROM t"), token)
    _action(s, "CreatePreparedStatement", flight_sql_pb2.ActionCreatePreparedStatementRequest(query="SELECT 1"),
            token)
    assert s.ctx.ops.owned == 1
    s.call("io.deephaven.proto.backplane.grpc.SessionService", "CloseSession", token=token)
    assert s.until(lambda: s.ctx.ops.owned == 0)


def test_prepared_statements_run_any_number_of_times_until_closed(s):
    token = s.new_session()
    [body] = _action(s, "CreatePreparedStatement",
                     flight_sql_pb2.ActionCreatePreparedStatementRequest(query="SELECT L FROM t WHERE L > 20"), token)
    packed = any_pb2.Any.FromString(body)
    assert packed.type_url == PREFIX + "ActionCreatePreparedStatementResult"
    created = flight_sql_pb2.ActionCreatePreparedStatementResult.FromString(packed.value)
    handle = created.prepared_statement_handle
    run = flight_sql_pb2.CommandPreparedStatementQuery(prepared_statement_handle=handle)
    for _ in range(2):
        info = _info(s, run, token)
        assert s.doget(info.endpoint[0].ticket.ticket, token=token).to_pydict() == {"L": [30, 40]}
    code, _ = s.status(lambda: _info(s, run, s.new_session()))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    assert _action(s, "ClosePreparedStatement",
                   flight_sql_pb2.ActionClosePreparedStatementRequest(prepared_statement_handle=handle), token) == []
    code, details = s.status(lambda: _info(s, run, token))
    assert code == grpc.StatusCode.NOT_FOUND and "Unknown Prepared Statement" in details


def test_catalog_commands_list_the_scopes_tables(s):
    token = s.new_session()
    s.engine.create(TableSpec("t_b", "static", data=pa.table({"Q": [1]})))

    def read(msg):
        info = _info(s, msg, token)
        ticket = info.endpoint[0].ticket.ticket
        first = s.doget(ticket, token=token)
        assert s.doget(ticket, token=token).equals(first)  # a catalog ticket reads again
        return first.to_pydict()

    assert read(flight_sql_pb2.CommandGetTableTypes()) == {"table_type": ["TABLE"]}
    assert read(flight_sql_pb2.CommandGetCatalogs()) == {"catalog_name": []}
    assert read(flight_sql_pb2.CommandGetDbSchemas()) == {"catalog_name": [], "db_schema_name": []}
    tables = read(flight_sql_pb2.CommandGetTables())
    assert sorted(tables["table_name"]) == ["t", "t_b"] and set(tables["table_type"]) == {"TABLE"}
    assert read(flight_sql_pb2.CommandGetTables(table_name_filter_pattern="t_%"))["table_name"] == ["t_b"]
    assert read(flight_sql_pb2.CommandGetTables(catalog="c"))["table_name"] == []
    assert read(flight_sql_pb2.CommandGetTables(table_types=["VIEW"]))["table_name"] == []
    with_schema = read(flight_sql_pb2.CommandGetTables(table_name_filter_pattern="t", include_schema=True))
    [raw] = with_schema["table_schema"]
    assert pa.ipc.read_schema(pa.py_buffer(raw)).names == ["A", "B", "S", "L"]
    assert s.ctx.ops.owned == 0


def test_other_commands_and_actions_are_refused_by_name(s):
    token = s.new_session()
    code, details = s.status(lambda: _info(s, flight_sql_pb2.CommandGetSqlInfo(), token))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "arrow.flight.protocol.sql.CommandGetSqlInfo" in details
    bogus = flight_pb2.Action(type="CreatePreparedSubstraitPlan", body=b"")
    code, details = s.status(lambda: list(s.stream(FLIGHT_SERVICE, "DoAction", bogus, token=token)))
    assert code == grpc.StatusCode.UNIMPLEMENTED and "CreatePreparedSubstraitPlan" in details
    txn = flight_sql_pb2.CommandStatementQuery(query="SELECT 1", transaction_id=b"x")
    code, details = s.status(lambda: _info(s, txn, token))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "transaction ids are not supported" in details


# -- logging in as Flight SQL clients do ---------------------------------------------------------------------
def test_a_bearer_value_that_is_an_auth_type_and_key_logs_in():
    with Services(ServerConfig(psk="sekret")) as s:
        s.engine.create(TableSpec("t", "static", data=DATA))
        md = (("authorization", f"Bearer {PSK_SCHEME} sekret"),)
        info, headers = s.call_with_headers(FLIGHT_SERVICE, "GetFlightInfo",
                                            _cmd(flight_sql_pb2.CommandStatementQuery(query="SELECT L FROM t")),
                                            metadata=md)
        token = dict(headers)["authorization"].removeprefix("Bearer ")
        assert s.session_of(token) is not None
        assert s.doget(info.endpoint[0].ticket.ticket, token=token).num_rows == 4
        for bad in (f"Bearer {PSK_SCHEME} wrong", "Bearer Anonymous", "Bearer not-a-session"):
            code, _ = s.status(lambda bad=bad: s.call(FLIGHT_SERVICE, "GetFlightInfo",
                                                      _cmd(flight_sql_pb2.CommandGetTableTypes()),
                                                      metadata=(("authorization", bad),)))
            assert code == grpc.StatusCode.UNAUTHENTICATED


def test_the_auth_cookie_is_set_when_asked_for_and_names_the_session(s):
    token = s.new_session()
    _, headers = s.call_with_headers(FLIGHT_SERVICE, "GetFlightInfo", _cmd(flight_sql_pb2.CommandGetTableTypes()),
                                     token=token)
    assert "set-cookie" not in dict(headers)
    asked = (("authorization", f"Bearer {token}"), ("x-deephaven-auth-cookie-request", "true"))
    _, headers = s.call_with_headers(FLIGHT_SERVICE, "GetFlightInfo", _cmd(flight_sql_pb2.CommandGetTableTypes()),
                                     metadata=asked)
    assert dict(headers)["set-cookie"] == f"deephaven-auth-cookie={token}"
    # the cookie alone names the session, before any authorization header
    cookie = (("cookie", f"deephaven-auth-cookie={token}"), ("authorization", "Bearer not-a-session"))
    info = _info(s, flight_sql_pb2.CommandStatementQuery(query="SELECT 5"), token)
    assert s.doget(info.endpoint[0].ticket.ticket, metadata=cookie).to_pydict() == {"EXPR$0": [5]}
