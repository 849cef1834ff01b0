"""Flight SQL with real clients: ADBC's Flight SQL driver (prepared statements, a bearer header of
auth type and key) and flightsql-dbapi's FlightSQLClient (Deephaven's auth cookie), as
pydeephaven's own test_flightsql.py drives a server; then the same queries against a real
Deephaven 42.7 and tickwire, compared: the same columns, types and rows, or a refusal by both
(tickwire's refusals of SQL it does not serve are listed in NOT_SERVED and must say so)."""
from __future__ import annotations

import math

import pyarrow as pa
import pyarrow.flight as flight
import pytest

from tests.interop.dh_server import deephaven_server_available

adbc_dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi")
adbc = pytest.importorskip("adbc_driver_flightsql")
flightsql = pytest.importorskip("flightsql")

pytestmark = [pytest.mark.interop]

PSK = "flightsql-psk"
PSK_AUTH = f"io.deephaven.authentication.psk.PskAuthenticationHandler {PSK}"
TABLE = "fsql_t"
DATA = pa.table({"A": pa.array([1, 2, 3, None, -7], pa.int32()), "B": [1.5, float("nan"), -2.0, 4.0, None],
                 "S": ["x", "y", None, "z", "xy"], "L": pa.array([10, 20, 30, 40, None], pa.int64())})
DH_TABLE_SCRIPT = f"""
from deephaven import new_table
from deephaven.column import int_col, double_col, string_col, long_col
from deephaven.constants import NULL_INT, NULL_LONG, NULL_DOUBLE
{TABLE} = new_table([int_col("A", [1, 2, 3, NULL_INT, -7]),
                     double_col("B", [1.5, float("nan"), -2.0, 4.0, NULL_DOUBLE]),
                     string_col("S", ["x", "y", None, "z", "xy"]),
                     long_col("L", [10, 20, 30, 40, NULL_LONG])])
"""

QUERIES = [
    "SELECT 88", "select 88 AS x", "SELECT 1, 2", "SELECT 2.5e0", "SELECT true", "SELECT 'a', 7 AS b",
    "SELECT 'abc'", "SELECT 'it''s'", "SELECT 2147483647", "SELECT 2147483648", "SELECT -2147483648", "SELECT -5",
    f"SELECT * FROM {TABLE}", f"SELECT A, S FROM {TABLE} WHERE A > 1", f"SELECT A FROM {TABLE} WHERE A < 2",
    f"SELECT A FROM {TABLE} WHERE A <= 3", f"SELECT A FROM {TABLE} WHERE A <> 2", f"SELECT A FROM {TABLE} WHERE 2 < A",
    f"SELECT S FROM {TABLE} WHERE S < 'y'", f"SELECT S FROM {TABLE} WHERE S >= 'xy'",
    f"SELECT S FROM {TABLE} WHERE S = 'x' OR S IS NULL", f"SELECT B FROM {TABLE} WHERE B < 0",
    f"SELECT B FROM {TABLE} WHERE B <> 1.5e0", f"SELECT A FROM {TABLE} WHERE B > 1",
    f"SELECT A FROM {TABLE} WHERE NOT (A = 1)", f"SELECT A FROM {TABLE} WHERE NOT (A <> 2 AND B > 0)",
    f"SELECT A FROM {TABLE} WHERE A IS NOT NULL", f"SELECT L FROM {TABLE} WHERE L IS NULL",
    f"SELECT A, A FROM {TABLE}", f"SELECT A AS X, A AS Y FROM {TABLE}", f"SELECT *, A FROM {TABLE}",
    f"SELECT {TABLE}.A FROM {TABLE}", f"SELECT x.L AS LL FROM {TABLE} AS x WHERE x.A >= 2",
    f"SELECT A FROM {TABLE} WHERE A = 1.0e0", f"SELECT A FROM {TABLE} WHERE L > 2147483648",
    f"SELECT A FROM {TABLE} WHERE TRUE", f"SELECT A FROM {TABLE} WHERE A < L",
    f"SELECT * FROM {TABLE} WHERE S = 'xy' AND L IS NULL",
    # refused by both
    "SELECT * FROM nope", "SEL 1", f"SELECT A FROM {TABLE};", f"select a from {TABLE}", "SELECT ?",
    "SELECT 1.5", "SELECT NULL", f"SELECT A FROM {TABLE} WHERE A = NULL", f'SELECT A AS "my col" FROM {TABLE}',
    f"SELECT y.A FROM {TABLE} x",
    # answered by Deephaven, refused by tickwire (NOT_SERVED)
    f"SELECT COUNT(*) FROM {TABLE}", f"SELECT A FROM {TABLE} ORDER BY A", f"SELECT A FROM {TABLE} LIMIT 2",
    "SELECT 1 + 2", f"SELECT 88 FROM {TABLE}", "SELECT 88 UNION ALL SELECT 89", "SELECT x FROM (SELECT 1 AS x)",
]
NOT_SERVED = {
    f"SELECT COUNT(*) FROM {TABLE}": "function COUNT", f"SELECT A FROM {TABLE} ORDER BY A": "ORDER BY",
    f"SELECT A FROM {TABLE} LIMIT 2": "LIMIT", "SELECT 1 + 2": "operator '+'",
    f"SELECT 88 FROM {TABLE}": "literal in the select list", "SELECT 88 UNION ALL SELECT 89": "UNION",
    "SELECT x FROM (SELECT 1 AS x)": "subquery",
}


class _Cookies(flight.ClientMiddlewareFactory):
    """Keeps the server's set-cookie and sends it back, as pydeephaven's Flight SQL test does."""

    def __init__(self):
        self.cookie = None

    def start_call(self, info):
        return _CookieCall(self)


class _CookieCall(flight.ClientMiddleware):
    def __init__(self, factory: _Cookies):
        self.factory = factory

    def sending_headers(self):
        return {"cookie": self.factory.cookie} if self.factory.cookie else {}

    def received_headers(self, headers):
        if "set-cookie" in headers:
            value = headers["set-cookie"]
            self.factory.cookie = value[0] if isinstance(value, list) else value


def _client(port: int, token: str):
    return flightsql.FlightSQLClient(host="127.0.0.1", port=port, insecure=True, token=token,
                                     metadata={"x-deephaven-auth-cookie-request": "true"}, middleware=[_Cookies()])


def _answer(client, sql: str):
    """("ok", schema, rows) or ("error", status class name, message)."""
    try:
        info = client.execute(sql)
        table = client.do_get(info.endpoints[0].ticket).read_all()
    except (flight.FlightError, pa.ArrowException) as exc:
        return ("error", type(exc).__name__, str(exc))
    return ("ok", table.schema, table.to_pydict())


def _same_rows(a: dict, b: dict) -> bool:
    if list(a) != list(b):
        return False
    for col in a:
        if len(a[col]) != len(b[col]):
            return False
        for x, y in zip(a[col], b[col]):
            if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
                continue
            if x != y:
                return False
    return True


@pytest.fixture(scope="module")
def tickwire_psk():
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=50)
    engine.create(TableSpec(TABLE, "static", data=DATA))
    server = TickwireServer(engine, port=0, psk=PSK, web=False).start()
    try:
        yield server
    finally:
        server.stop()
        engine.stop()


def test_adbc_runs_statements_with_a_bearer_auth_type_header(tickwire_psk):
    with adbc_dbapi.connect(f"grpc://127.0.0.1:{tickwire_psk.port}",
                            db_kwargs={adbc.DatabaseOptions.AUTHORIZATION_HEADER.value: f"Bearer {PSK_AUTH}"}) as conn:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 88")
            assert cursor.fetchall() == [(88,)]
            cursor.execute("SELECT 98")
            assert cursor.fetchall() == [(98,)]
            cursor.execute(f"SELECT L, S FROM {TABLE} WHERE L >= 30")
            assert cursor.fetchall() == [(30, None), (40, "z")]
            assert [d[0] for d in cursor.description] == ["L", "S"]
            cursor.execute(f"SELECT A FROM {TABLE} WHERE A > 1")
            assert cursor.fetch_arrow_table().column("A").type == pa.int32()
            with pytest.raises(adbc_dbapi.Error, match="ORDER BY is not served"):
                cursor.execute(f"SELECT A FROM {TABLE} ORDER BY A")
            with pytest.raises(adbc_dbapi.Error, match="Object 'nope' not found"):
                cursor.execute("SELECT * FROM nope")
        # catalog queries (GetTableTypes; GetTables with its schemas)
        assert conn.adbc_get_table_types() == ["TABLE"]
        assert conn.adbc_get_table_schema(TABLE).names == ["A", "B", "S", "L"]
        # the catalog tables' columns are nullable, as Deephaven's are: ADBC's check of the spec's
        # non-null catalog_name refuses them from both servers alike
        with pytest.raises(adbc_dbapi.Error, match="Invalid schema returned"):
            conn.adbc_get_objects(depth="catalogs").read_all()
    with pytest.raises(adbc_dbapi.Error):
        with adbc_dbapi.connect(f"grpc://127.0.0.1:{tickwire_psk.port}",
                                db_kwargs={adbc.DatabaseOptions.AUTHORIZATION_HEADER.value: "Bearer wrong"}) as conn:
            with conn.cursor() as cursor:
                cursor.execute("SELECT 1")


def test_flightsql_dbapi_reads_a_query_through_the_auth_cookie(tickwire_psk):
    client = _client(tickwire_psk.port, PSK_AUTH)
    try:
        info = client.execute("SELECT 88")
        assert client.do_get(info.endpoints[0].ticket).read_all()[0][0].as_py() == 88
        info = client.execute(f"SELECT S FROM {TABLE} WHERE S IS NOT NULL AND S <> 'y'")
        assert client.do_get(info.endpoints[0].ticket).read_all().to_pydict() == {"S": ["x", "z", "xy"]}
    finally:
        client.close()
    assert len(tickwire_psk.ctx.sessions.live()) >= 1


@pytest.mark.skipif(deephaven_server_available() is not None, reason=str(deephaven_server_available()))
def test_queries_answer_as_deephaven(deephaven_server):
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine, TableSpec

    engine = Engine(interval_ms=50)
    engine.create(TableSpec(TABLE, "static", data=DATA))
    tw = TickwireServer(engine, port=0, web=False).start()
    mismatches, both_answered = [], 0
    try:
        with deephaven_server.tables(DH_TABLE_SCRIPT):
            dh_client, tw_client = _client(deephaven_server.port, "Anonymous"), _client(tw.port, "Anonymous")
            try:
                for sql in QUERIES:
                    dh, mine = _answer(dh_client, sql), _answer(tw_client, sql)
                    if sql in NOT_SERVED:
                        assert dh[0] == "ok", f"{sql!r}: Deephaven answers it ({dh})"
                        assert mine[0] == "error" and "not served" in mine[2] and NOT_SERVED[sql] in mine[2], \
                            f"{sql!r}: {mine}"
                        continue
                    if dh[0] != mine[0]:
                        mismatches.append(f"{sql!r}: Deephaven {dh}, tickwire {mine}")
                    elif dh[0] == "ok":
                        both_answered += 1
                        dh_schema, tw_schema = dh[1], mine[1]
                        if [(f.name, f.type) for f in dh_schema] != [(f.name, f.type) for f in tw_schema]:
                            mismatches.append(f"{sql!r}: schema {dh_schema} != {tw_schema}")
                        elif [(f.metadata or {}).get(b"deephaven:type") for f in dh_schema] != \
                                [(f.metadata or {}).get(b"deephaven:type") for f in tw_schema]:
                            mismatches.append(f"{sql!r}: Deephaven types differ")
                        elif not _same_rows(dh[2], mine[2]):
                            mismatches.append(f"{sql!r}: rows {dh[2]} != {mine[2]}")
            finally:
                dh_client.close()
                tw_client.close()
    finally:
        tw.stop()
        engine.stop()
    assert not mismatches, "\n".join(mismatches)
    assert both_answered == len(QUERIES) - len(NOT_SERVED) - 10  # all but the ten both refuse
