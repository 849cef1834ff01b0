"""A history table answers as Deephaven 42.7's `parquet.read` of the same Hive-partitioned files:
the same columns (partition column first, a String marked isPartitioning), the same rows in the
same order, and the same answers to a where on the partition column, a where on a data column,
head and tail, read through pydeephaven from both servers."""
from __future__ import annotations

import pyarrow as pa
import pytest

from tests.interop import close_dh_session
from tests.interop.dh_server import deephaven_server_available
from tests.test_history import write_dataset

pytestmark = [pytest.mark.interop, pytest.mark.skipif(deephaven_server_available() is not None,
                                                       reason=str(deephaven_server_available()))]

NAME = "history_conformance"


@pytest.fixture(scope="module")
def sessions(deephaven_server, tmp_path_factory):
    from pydeephaven import Session
    from pydeephaven.table import Table as DhTable

    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    root = str(tmp_path_factory.mktemp("history") / "trades")
    write_dataset(root)
    patch = pytest.MonkeyPatch()
    patch.setattr(DhTable, "__del__", lambda self: None)  # as in the update_by conformance test
    engine = Engine(interval_ms=50)
    engine.history(NAME, root)
    tw = TickwireServer(engine, port=0).start()
    with deephaven_server.tables(f"from deephaven.parquet import read\n{NAME} = read({root!r})\n"):
        dh_session = Session(host="127.0.0.1", port=deephaven_server.port)
        tw_session = Session(host="127.0.0.1", port=tw.port)
        try:
            yield {"dh": dh_session, "tw": tw_session, "engine": engine}
        finally:
            for s in (dh_session, tw_session):
                close_dh_session(s)
            tw.stop()
            engine.stop()
            patch.undo()


QUERIES = {
    "whole": lambda t: t,
    "where_partition": lambda t: t.where(["Date in `2026-11-19`, `2026-11-20`"]),
    "where_partition_eq": lambda t: t.where(["Date = `2026-11-18`"]),
    "where_data": lambda t: t.where(["Qty % 250 == 7"]),
    "where_both": lambda t: t.where(["Date = `2026-11-20`", "Px > 1400.0"]),
    "head": lambda t: t.head(5),
    "tail": lambda t: t.tail(5),
    "view": lambda t: t.view(["Date", "Qty"]),
}


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_history_answers_as_deephavens_parquet_read(sessions, query):
    got = {side: QUERIES[query](sessions[side].open_table(NAME)).to_arrow() for side in ("dh", "tw")}
    dh, tw = got["dh"], got["tw"]
    assert tw.schema.names == dh.schema.names
    assert [f.type for f in tw.schema] == [f.type for f in dh.schema]
    for f_dh, f_tw in zip(dh.schema, tw.schema):
        for key in (b"deephaven:type", b"deephaven:isPartitioning"):
            assert (f_tw.metadata or {}).get(key) == (f_dh.metadata or {}).get(key), (f_dh.name, key)
    assert tw.num_rows == dh.num_rows and tw.num_rows > 0
    assert pa.Table.from_arrays(tw.columns, names=tw.column_names).equals(
        pa.Table.from_arrays(dh.columns, names=dh.column_names))


def test_a_where_on_the_partition_column_through_table_service_reads_no_parquet_data(sessions):
    history = sessions["engine"].resolve(NAME).history
    before = history.stats.chunks_read
    w = sessions["tw"].open_table(NAME).where(["Date in `2026-11-20`"])
    assert w.size == 1000
    assert history.stats.chunks_read == before
