"""Deephaven clients asking tickwire for aggregations: TableService Aggregate, AggregateAll,
ComboAggregate and SelectDistinct, alone and in Batch.

pydeephaven's `agg_by`, `sum_by`, `count_by`, `agg_all_by`, `select_distinct` on a live keyed
table must equal the same aggregation computed with pyarrow on the source; the exports tick
(pydeephaven-ticking follows an aggregation through random writes); refusals name what was
refused (in process, tests.harness.Services)."""
from __future__ import annotations

import grpc
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.harness import Services, until
from tests.test_table_service_ops import _quotes, _rows, _source, user_tables
from tickwire.protocol.proto import table_pb2
from tickwire.protocol.proto.methods import TABLE_SERVICE
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec


@pytest.fixture
def served():
    rng = np.random.default_rng(7)
    engine = Engine(interval_ms=20)
    keyed = _quotes(engine, rng)
    server = TickwireServer(engine, port=0, start_engine=False).start()
    yield engine, keyed, server, rng
    server.stop()


def _by_venue(src: pa.Table, aggs) -> pa.Table:
    """pyarrow's group_by, in the order of each venue's first row (as Deephaven orders groups)."""
    order = {}
    for v in src["Venue"].to_pylist():
        order.setdefault(v, len(order))
    out = src.group_by("Venue", use_threads=False).aggregate(aggs)
    idx = np.argsort([order[v] for v in out["Venue"].to_pylist()])
    return out.take(pa.array(idx))


def _close(a, b) -> bool:
    return all(x == y or (isinstance(x, float) and abs(x - y) <= 1e-9 * max(1, abs(x))) for x, y in zip(a, b)) \
        and len(a) == len(b)


def test_pydeephaven_aggregations_equal_pyarrow_on_the_source(served):
    from pydeephaven import Session, agg

    engine, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    try:
        src = _source(engine)
        t = s.open_table("quotes")
        got = t.agg_by([agg.sum_(["Size"]), agg.avg(["Price"]), agg.count_("N"), agg.max_(["Hi=Price"])],
                       by=["Venue"]).to_arrow()
        want = _by_venue(src, [("Size", "sum"), ("Price", "mean"), ("Price", "count"), ("Price", "max")])
        assert got.column_names == ["Venue", "Size", "Price", "N", "Hi"]
        assert got["Venue"].to_pylist() == want["Venue"].to_pylist()
        assert got["Size"].type == pa.int64() and got["Size"].to_pylist() == want["Size_sum"].to_pylist()
        assert _close(got["Price"].to_pylist(), want["Price_mean"].to_pylist())
        assert got["N"].to_pylist() == want["Price_count"].to_pylist()
        assert got["Hi"].to_pylist() == want["Price_max"].to_pylist()
        got = t.view(["Venue", "Size"]).sum_by("Venue").to_arrow()
        assert got["Size"].to_pylist() == want["Size_sum"].to_pylist()
        got = t.count_by("N", by=["Venue"]).to_arrow()
        assert got["N"].to_pylist() == want["Price_count"].to_pylist()
        got = t.view(["Venue", "Size"]).agg_all_by(agg.min_(), by=["Venue"]).to_arrow()
        assert got["Size"].to_pylist() == _by_venue(src, [("Size", "min")])["Size_min"].to_pylist()
        got = t.agg_by([agg.count_where("Big", ["Size > 500", "Price < 105"])], by=["Venue"]).to_arrow()
        big = src.filter(pc.and_(pc.greater(src["Size"], 500), pc.less(src["Price"], 105)))
        by_venue = big.group_by("Venue").aggregate([("Size", "count")])
        counts = dict(zip(by_venue["Venue"].to_pylist(), by_venue["Size_count"].to_pylist()))
        assert sum(counts.values()) > 0
        assert got["Big"].to_pylist() == [counts.get(v, 0) for v in want["Venue"].to_pylist()]
        got = t.select_distinct(["Venue"]).to_arrow()
        assert got["Venue"].to_pylist() == want["Venue"].to_pylist()
        got = t.agg_by([agg.sum_(["Size"]), agg.count_("N")], by=[]).to_arrow()  # no key columns: one row
        assert got.to_pylist() == [{"Size": pc.sum(src["Size"]).as_py(), "N": src.num_rows}]
    finally:
        s.close()
    assert until(lambda: user_tables(engine) == {"quotes"}), "closing the session removes its aggregations"


def test_an_aggregation_export_ticks_and_pydeephaven_ticking_follows_it(served):
    from pydeephaven import Session, agg
    from pydeephaven_ticking.table_listener import listen

    from tests.test_interop_clients import _current

    engine, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    states, errors = [], []
    try:
        t = s.open_table("quotes").agg_by([agg.sum_(["Size"]), agg.min_(["Lo=Price"]), agg.count_("N")],
                                          by=["Venue"])
        handle = listen(t, lambda u: states.append(_current(u)), errors.append)
        handle.start()
        try:
            assert until(lambda: states or errors)
            for step in range(12):
                n = len(states)
                syms = [f"S{i:02d}" for i in rng.choice(60, 6, replace=False)]
                engine.write(keyed, _rows(rng, syms), wait=False)
                ups = engine.run_cycle()
                src = _source(engine)
                want = _by_venue(src, [("Size", "sum"), ("Price", "min"), ("Price", "count")])
                if any(".aggregate" in name for name in ups):
                    assert until(lambda n=n: len(states) > n or errors), f"step {step}"
                assert not errors, errors
                got = states[-1]
                # groups keep the row they got when first seen: compare in venue order
                assert got["Venue"].to_pylist() == states[0]["Venue"].to_pylist(), f"step {step}"
                got = got.sort_by("Venue")
                want = want.sort_by("Venue")
                assert got["Venue"].to_pylist() == want["Venue"].to_pylist(), f"step {step}"
                assert got["Size"].to_pylist() == want["Size_sum"].to_pylist(), f"step {step}"
                assert got["Lo"].to_pylist() == want["Price_min"].to_pylist(), f"step {step}"
                assert got["N"].to_pylist() == want["Price_count"].to_pylist(), f"step {step}"
        finally:
            handle.stop()
    finally:
        s.close()


def test_formula_aggregations_follow_their_ticking_source(served):
    """Formula aggregations (AggregationFormula and AggSpecFormula) on the live keyed table equal a
    recomputation with pyarrow after every cycle of random writes; the hidden aggregations they
    read are not columns of the result and go with it."""
    from pydeephaven import Session
    from pydeephaven.agg import formula

    engine, keyed, server, rng = served
    s = Session(host="127.0.0.1", port=server.port)
    try:
        t = s.open_table("quotes").agg_by([
            formula("Tot = sum(Size) * 2 + 1"), formula("Spread = max(Price) - min(Price)"),
            formula(formula="avg(x)", formula_param="x", cols=["AvgSize=Size"]), formula("N = Size.size()"),
            formula("Up = Venue + `!`")], by=["Venue"])
        for step in range(10):
            src = _source(engine)
            want = _by_venue(src, [("Size", "sum"), ("Price", "max"), ("Price", "min"), ("Size", "mean"),
                                   ("Size", "count")]).sort_by("Venue")
            got = t.to_arrow()
            assert got.column_names == ["Venue", "Tot", "Spread", "AvgSize", "N", "Up"], f"step {step}"
            assert got.schema.field("Tot").type == pa.int64() and got.schema.field("AvgSize").type == pa.float64()
            got = got.sort_by("Venue")
            assert got["Venue"].to_pylist() == want["Venue"].to_pylist(), f"step {step}"
            assert got["Tot"].to_pylist() == [2 * v + 1 for v in want["Size_sum"].to_pylist()], f"step {step}"
            spread = [a - b for a, b in zip(want["Price_max"].to_pylist(), want["Price_min"].to_pylist())]
            assert _close(got["Spread"].to_pylist(), spread), f"step {step}"
            assert _close(got["AvgSize"].to_pylist(), want["Size_mean"].to_pylist()), f"step {step}"
            assert got["N"].to_pylist() == want["Size_count"].to_pylist(), f"step {step}"
            assert got["Up"].to_pylist() == [v + "!" for v in want["Venue"].to_pylist()], f"step {step}"
            syms = [f"S{i:02d}" for i in rng.choice(60, 8, replace=False)]
            engine.write(keyed, _rows(rng, syms), wait=False)
            engine.run_cycle()
    finally:
        s.close()
    assert until(lambda: user_tables(engine) == {"quotes"}), "closing the session removes the aggregation and view"


@pytest.fixture
def svc():
    with Services() as s:
        _quotes(s.engine, np.random.default_rng(4))
        yield s


def _agg_request(spec_field: str, pairs, by=("Venue",)) -> table_pb2.AggregateRequest:
    req = table_pb2.AggregateRequest()
    req.source_id.ticket.ticket = b"s/quotes"
    req.result_id.ticket = b"e\x01\x00\x00\x00"
    a = req.aggregations.add()
    getattr(a.columns.spec, spec_field).SetInParent()
    a.columns.match_pairs.extend(pairs)
    req.group_by_columns.extend(by)
    return req


def test_combo_aggregate_and_batch_steps_are_served(svc):
    s = svc
    req = table_pb2.ComboAggregateRequest()
    req.source_id.ticket.ticket = b"s/quotes"
    req.result_id.ticket = b"e\x02\x00\x00\x00"
    req.group_by_columns.append("Venue")
    a = req.aggregates.add()
    a.type = table_pb2.ComboAggregateRequest.SUM
    a.match_pairs.append("Total=Size")
    c = req.aggregates.add()
    c.type = table_pb2.ComboAggregateRequest.COUNT
    c.column_name = "N"
    resp = s.call(TABLE_SERVICE, "ComboAggregate", req)
    assert resp.success and resp.size == 3
    batch = table_pb2.BatchTableRequest()
    op = batch.ops.add()
    op.aggregate_all.source_id.ticket.ticket = b"s/quotes"
    op.aggregate_all.spec.max.SetInParent()
    op.aggregate_all.group_by_columns.append("Venue")
    op2 = batch.ops.add()
    op2.select_distinct.source_id.batch_offset = 0
    op2.select_distinct.column_names.append("Venue")
    op2.select_distinct.result_id.ticket = b"e\x03\x00\x00\x00"
    out = list(s.stream(TABLE_SERVICE, "Batch", batch))
    assert [r.success for r in out] == [True, True] and out[1].size == 3


@pytest.mark.parametrize("req, code, words", [
    (_agg_request("sum", ["Sym"]), grpc.StatusCode.INVALID_ARGUMENT, "sum cannot aggregate column 'Sym'"),
    (_agg_request("sum", ["Nope"]), grpc.StatusCode.INVALID_ARGUMENT, "unknown column 'Nope'"),
    (_agg_request("sum", ["Size"], by=("Nope",)), grpc.StatusCode.INVALID_ARGUMENT, "unknown group-by column 'Nope'"),
    (_agg_request("formula", ["Size"]), grpc.StatusCode.INVALID_ARGUMENT, "formula"),
    (_agg_request("t_digest", ["Size"]), grpc.StatusCode.UNIMPLEMENTED, "'t_digest' is not supported"),
    (_agg_request("sum", ["a b"]), grpc.StatusCode.INVALID_ARGUMENT, "cannot parse column pair"),
])
def test_refused_aggregations_say_why_and_make_nothing(svc, req, code, words):
    s = svc
    got, details = s.status(lambda: s.call(TABLE_SERVICE, "Aggregate", req))
    assert got == code and words in details
    assert user_tables(s.engine) == {"quotes"}


def test_the_schema_of_a_keyless_aggregation_of_an_empty_table(svc):
    """No rows, as Deephaven answers (a keyless aggregation has a row only while its table has rows);
    with preserve_empty one row, in which a sum of nothing is null and a count of nothing is 0."""
    s = svc
    s.engine.create(TableSpec("empty", "static", data=pa.table({"X": pa.array([], pa.int32())})))
    req = table_pb2.AggregateRequest()
    req.source_id.ticket.ticket = b"s/empty"
    req.result_id.ticket = b"e\x04\x00\x00\x00"
    a = req.aggregations.add()
    a.columns.spec.sum.SetInParent()
    a.columns.match_pairs.append("X")
    req.aggregations.add().count.column_name = "N"
    resp = s.call(TABLE_SERVICE, "Aggregate", req)
    assert resp.success and resp.size == 0
    req.preserve_empty = True
    req.result_id.ticket = b"e\x05\x00\x00\x00"
    resp = s.call(TABLE_SERVICE, "Aggregate", req)
    assert resp.success and resp.size == 1
    kept = [t for t in s.engine.tables(hidden=True) if ".aggregate" in t.name and t.size == 1]
    assert [t.to_arrow().to_pylist() for t in kept] == [[{"X": None, "N": 0}]]
    assert kept[0].schema.field("X").type == pa.int64()
