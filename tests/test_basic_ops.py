"""TableService DropColumns, EmptyTable, TimeTable, Slice, Flatten, MetaTable, Snapshot, SeekRow and
ComputeColumnStatistics in process (tests.harness.Services): each alone and as a Batch step, the
refusals, and ticking sources (Slice, Flatten, TimeTable) followed cycle by cycle and compared with a
recomputation from the source. tests/test_basic_ops_conformance.py compares the answers with a real
Deephaven server."""
from __future__ import annotations

import struct
from typing import Any

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.harness import Services
from tickwire.protocol.flight import decode_flight_data
from tickwire.protocol.proto import flight_pb2, table_pb2
from tickwire.protocol.proto.methods import FLIGHT_SERVICE, TABLE_SERVICE
from tickwire.protocol.tickets import export_ticket
from tickwire.server.engine import TableSpec
from tickwire.server.engine.graph.ops.slice_flatten import flattened_shifts, slice_positions
from tickwire.server.engine.graph.row_set import RowSet
from tickwire.server.services.basic_ops import parse_duration_nanos

NS = 10 ** 9
SCHEMA = pa.schema([("K", pa.int64()), ("V", pa.float64()), ("S", pa.string())])


def _plain(t: pa.Table) -> pa.Table:
    return pa.Table.from_arrays(t.columns, names=t.column_names)


@pytest.fixture
def svc():
    with Services() as s:
        s.engine.create(TableSpec("static", "static", data=pa.table({
            "I": pa.array([5, None, -3, 5, 7], pa.int32()), "S": pa.array(["a", None, "B", "b", "a"]),
            "D": pa.array([1.5, None, -2.0, float("nan"), 0.0])})))
        s.token = s.new_session()
        yield s


class Calls:
    """Unary TableService calls of one session, results under consecutive export tickets."""

    def __init__(self, s):
        self.s, self.next = s, 1

    def op(self, method: str, req, source: bytes | None = None) -> tuple[bytes, Any]:
        ticket = export_ticket(self.next)
        self.next += 1
        req.result_id.ticket = ticket
        if source is not None:
            req.source_id.ticket.ticket = source
        return ticket, self.s.call(TABLE_SERVICE, method, req, token=self.s.token)

    def get(self, ticket: bytes) -> pa.Table:
        return _plain(self.s.doget(ticket, token=self.s.token))

    def status(self, method: str, req, source: bytes | None = None):
        return self.s.status(lambda: self.op(method, req, source))


def test_drop_columns_keeps_the_others_and_refuses_unknown_columns(svc):
    c = Calls(svc)
    t, r = c.op("DropColumns", table_pb2.DropColumnsRequest(column_names=["S"]), b"s/static")
    assert r.success and r.is_static and r.size == 5
    assert c.get(t).column_names == ["I", "D"]
    code, msg = c.status("DropColumns", table_pb2.DropColumnsRequest(column_names=["I", "Nope"]), b"s/static")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'Nope'" in msg
    t, _ = c.op("DropColumns", table_pb2.DropColumnsRequest(), b"s/static")  # nothing dropped: the table itself
    assert c.get(t).column_names == ["I", "S", "D"]
    t, r = c.op("DropColumns", table_pb2.DropColumnsRequest(column_names=["I", "S", "D"]), b"s/static")
    assert r.size == 5 and c.get(t).num_columns == 0


def test_empty_table_has_rows_and_no_columns(svc):
    c = Calls(svc)
    t, r = c.op("EmptyTable", table_pb2.EmptyTableRequest(size=7))
    assert r.success and r.is_static and r.size == 7
    assert c.get(t).num_columns == 0
    code, msg = c.status("EmptyTable", table_pb2.EmptyTableRequest(size=-1))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "Size must be greater than zero"
    t, r = c.op("EmptyTable", table_pb2.EmptyTableRequest(size=0))
    assert r.size == 0 and c.get(t).num_rows == 0


def _arrow_doget(s: Services, ticket: bytes) -> pa.Table:
    """A DoGet read as any Arrow Flight client reads it: its FlightData as an Arrow IPC stream."""
    fn = s.channel().unary_stream(f"/{FLIGHT_SERVICE}/DoGet", request_serializer=flight_pb2.Ticket.SerializeToString)
    stream = b""
    for raw in fn(flight_pb2.Ticket(ticket=ticket), metadata=(("authorization", f"Bearer {s.token}"),)):
        fd = decode_flight_data(raw)
        header, body = bytes(fd.data_header), bytes(fd.data_body or b"")
        pad = (-len(header)) % 8
        stream += b"\xff\xff\xff\xff" + struct.pack("<i", len(header) + pad) + header + b"\0" * pad + body
    return pa.ipc.open_stream(stream).read_all()


def test_a_table_without_columns_keeps_its_rows_over_doget(svc):
    """RecordBatch.length carries the rows of a table without columns (as Deephaven sends them)."""
    c = Calls(svc)
    for size in (7, 0, 70000):
        t, _ = c.op("EmptyTable", table_pb2.EmptyTableRequest(size=size))
        got = _arrow_doget(svc, t)
        assert got.num_rows == size and got.num_columns == 0


def test_slice_positions_follow_deephavens_rules():
    cases = {(2, 5): (2, 5), (-3, 0): (7, 10), (-3, -1): (7, 9), (2, -2): (2, 8), (-5, 8): (5, 8), (8, -5): (8, 8),
             (0, 100): (0, 10), (100, 200): (10, 10), (-100, 3): (0, 3), (3, 3): (3, 3), (9, -1): (9, 9)}
    for (a, b), want in cases.items():
        assert slice_positions(a, b, 10) == want, (a, b)


def test_slice_and_its_refusals(svc):
    c = Calls(svc)
    t, r = c.op("Slice", table_pb2.SliceRequest(first_position_inclusive=1, last_position_exclusive=-1), b"s/static")
    assert r.size == 3 and c.get(t)["I"].to_pylist() == [None, -3, 5]
    for a, b, why in ((5, 2, "non-negative start"), (-1, -3, "negative start")):
        code, msg = c.status("Slice", table_pb2.SliceRequest(first_position_inclusive=a, last_position_exclusive=b),
                             b"s/static")
        assert code == grpc.StatusCode.INVALID_ARGUMENT and why in msg


def test_meta_table_names_each_columns_deephaven_type(svc):
    c = Calls(svc)
    t, r = c.op("MetaTable", table_pb2.MetaTableRequest(), b"s/static")
    assert r.is_static and r.size == 3
    assert c.get(t).to_pylist() == [
        {"Name": "I", "DataType": "int", "ColumnType": "Normal", "IsPartitioning": False},
        {"Name": "S", "DataType": "java.lang.String", "ColumnType": "Normal", "IsPartitioning": False},
        {"Name": "D", "DataType": "double", "ColumnType": "Normal", "IsPartitioning": False}]


def test_batch_with_source_less_steps_and_the_new_operations(svc):
    batch = table_pb2.BatchTableRequest()
    batch.ops.add().empty_table.size = 4
    op = batch.ops.add().drop_columns
    op.source_id.ticket.ticket = b"s/static"
    op.column_names.append("D")
    sl = batch.ops.add().slice
    sl.source_id.batch_offset = 1
    sl.first_position_inclusive, sl.last_position_exclusive = 1, 3
    fl = batch.ops.add().flatten
    fl.source_id.batch_offset = 2
    fl.result_id.ticket = export_ticket(20)
    sn = batch.ops.add().snapshot
    sn.source_id.batch_offset = 3
    sn.result_id.ticket = export_ticket(21)
    mt = batch.ops.add().meta_table
    mt.source_id.batch_offset = 0
    mt.result_id.ticket = export_ticket(22)
    cs = batch.ops.add().column_statistics
    cs.source_id.ticket.ticket = b"s/static"
    cs.column_name = "I"
    cs.result_id.ticket = export_ticket(23)
    got = list(svc.stream(TABLE_SERVICE, "Batch", batch, token=svc.token))
    assert [r.success for r in got] == [True] * 7
    assert [r.size for r in got] == [4, 5, 2, 2, 2, 0, 1]
    flat = _plain(svc.doget(export_ticket(20), token=svc.token))
    assert flat.to_pydict() == {"I": [None, -3], "S": [None, "B"]}
    assert _plain(svc.doget(export_ticket(21), token=svc.token)).equals(flat)
    stats = _plain(svc.doget(export_ticket(23), token=svc.token)).to_pylist()[0]
    assert stats["COUNT"] == 4 and stats["SUM"] == 14 and stats["MIN"] == -3 and stats["SUM_SQRD"] == 108


def test_seek_row(svc):
    def seek(col, start=0, back=False, contains=False, insensitive=False, **lit):
        req = table_pb2.SeekRowRequest(column_name=col, starting_row=start, is_backward=back, contains=contains,
                                       insensitive=insensitive)
        req.source_id.ticket = b"s/static"
        for k, v in lit.items():
            setattr(req.seek_value, k, v)
        return svc.call(TABLE_SERVICE, "SeekRow", req, token=svc.token).result_row

    assert seek("I", long_value=5) == 3 and seek("I", start=3, long_value=5) == 0
    assert seek("I", start=3, back=True, long_value=5) == 0 and seek("I", start=0, back=True, long_value=5) == 3
    assert seek("I", long_value=6) == -1 and seek("I", double_value=5.9) == 3
    assert seek("S", string_value="b") == 3 and seek("S", string_value="b", insensitive=True) == 2
    assert seek("S", string_value="A", insensitive=True, contains=True, start=4) == 0
    assert seek("D", double_value=float("nan")) == 3 and seek("D", double_value=-0.0) == -1
    code, msg = svc.status(lambda: seek("I", string_value="5"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "Invalid String type for seek: int"
    code, msg = svc.status(lambda: seek("S", long_value=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "Invalid column type for seek: class java.lang.String"
    code, _ = svc.status(lambda: seek("Nope", long_value=5))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_column_statistics_of_strings_and_refusals(svc):
    c = Calls(svc)
    t, r = c.op("ComputeColumnStatistics", table_pb2.ColumnStatisticsRequest(column_name="S"), b"s/static")
    row = c.get(t).to_pylist()[0]
    assert row["COUNT"] == 4 and row["SIZE"] == 5 and row["UNIQUE_VALUES"] == 3
    assert row["UNIQUE_KEYS"][0] == "a" and row["UNIQUE_COUNTS"] == [2, 1, 1]
    code, msg = c.status("ComputeColumnStatistics", table_pb2.ColumnStatisticsRequest(column_name="Nope"), b"s/static")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and msg == "Table doesn't have a column with the specified name"


def test_time_table_ticks_with_the_clock(svc):
    c = Calls(svc)
    start = svc.clock.now_ns() - 2 * NS - NS // 2
    t, r = c.op("TimeTable", table_pb2.TimeTableRequest(start_time_nanos=start, period_nanos=NS))
    assert not r.is_static and r.size == 3
    svc.advance(1.25)
    svc.cycle()
    got = c.get(t)["Timestamp"].cast(pa.int64()).to_pylist()
    assert got == [start + i * NS for i in range(4)]
    t2, r = c.op("TimeTable", table_pb2.TimeTableRequest(period_string="PT0.5S", blink_table=True))
    assert r.size == 0
    svc.cycle()
    assert c.get(t2).num_rows == 1
    svc.advance(1.0)
    svc.cycle()
    assert c.get(t2).num_rows == 2
    code, msg = c.status("TimeTable", table_pb2.TimeTableRequest(period_nanos=0))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and msg == "periodNanos must be >= 0 (found: 0)"


def test_parse_duration():
    assert parse_duration_nanos("PT1S") == NS and parse_duration_nanos("PT0.001S") == NS // 1000
    assert parse_duration_nanos("PT00:00:.001") == NS // 1000 and parse_duration_nanos("P1DT1H") == 25 * 3600 * NS
    assert parse_duration_nanos("-PT1M") == -60 * NS
    with pytest.raises(ValueError):
        parse_duration_nanos("bogus")


def test_flattened_shifts_are_deephavens():
    # positions 2..3 removed, 0 added: rows 0..1 move by +1, rows 4.. by -1
    got = flattened_shifts(RowSet.from_keys([2, 3]), RowSet.from_keys([0]), 8)
    assert (got.starts.tolist(), got.ends.tolist(), got.deltas.tolist()) == ([0, 4], [1, 7], [1, -1])


# -- ticking parents, step by step -------------------------------------------------------------------------------
def _rows(rng, keys) -> pa.Table:
    n = len(keys)
    return pa.table({"K": pa.array(keys, pa.int64()), "V": pa.array(np.round(rng.uniform(0, 100, n), 1)),
                     "S": pa.array([f"s{k % 7}" for k in keys])}, schema=SCHEMA)


@pytest.mark.parametrize("seed", [1, 2])
def test_slice_and_flatten_of_a_ticking_keyed_parent_follow_a_recomputation(seed):
    """A keyed source with upserts and deletes, filtered (so its row keys have gaps) and sorted (so
    rows shift); slices of every kind and a flatten over it, each checked after every cycle against
    the same operation applied to the source's current rows, and the updates replayed over the
    previous state must give the new one."""
    from tickwire.server.engine.graph.table_update import TableUpdate
    rng = np.random.default_rng(seed)
    with Services() as s:
        src = s.engine.create(TableSpec("src", "keyed", SCHEMA, keys=["K"]))
        s.write(src, _rows(rng, list(range(40))))
        s.cycle()
        import pyarrow.compute as pc
        with s.engine.writing():
            filtered = src.where(pc.field("V") > 20, name="f")
            ordered = filtered.sort(["V"], name="o")
            slices = {(a, b): ordered._derive("slice", f"sl{a}_{b}", a, b)
                      for a, b in ((0, 5), (3, 9), (-6, 0), (-8, -2), (2, -3), (-10, 4), (30, 60))}
            flat = ordered._derive("flatten", "flat")
            flat_f = filtered._derive("flatten", "flat_f")
        keysets = {t.name: t.rowset for t in (*slices.values(), flat, flat_f)}
        for step in range(40):
            live = s.engine.snapshot(src)[1]["K"].to_pylist()
            up_keys = list(rng.choice(60, 8, replace=False))
            s.write(src, _rows(rng, up_keys))
            gone = [k for k in rng.choice(live, 3, replace=False).tolist() if k not in up_keys] if live else []
            if gone:
                s.engine.write(src, delete=pa.table({"K": pa.array(gone, pa.int64())}), wait=False)
            ups = s.engine.run_cycle()
            base = _plain(s.engine.snapshot(ordered)[1])
            for (a, b), t in slices.items():
                lo, hi = slice_positions(a, b, base.num_rows)
                assert _plain(s.engine.snapshot(t)[1]).equals(base.slice(lo, hi - lo)), (step, a, b)
            assert _plain(s.engine.snapshot(flat)[1]).equals(base), step
            assert flat.rowset == RowSet.range(0, base.num_rows - 1)
            assert _plain(s.engine.snapshot(flat_f)[1]).equals(_plain(s.engine.snapshot(filtered)[1]))
            for t in (*slices.values(), flat, flat_f):
                up: TableUpdate | None = ups.get(t.name)
                if up is None:
                    assert t.rowset == keysets[t.name], (step, t.name)
                    continue
                up.validate(keysets[t.name], t.rowset)
                keysets[t.name] = t.rowset


def test_time_table_slice_and_flatten_step_by_step():
    with Services() as s:
        from tickwire.server.engine.synthetic import time_table
        start = s.clock.now_ns()
        tt = time_table(s.engine, "tt", NS // 4, start)
        with s.engine.writing():
            last3 = tt._derive("slice", "last3", -3, 0)
            flat = tt._derive("flatten", "flat")
        for step in range(12):
            s.advance(0.3 + 0.1 * (step % 3))
            s.cycle()
            now = s.clock.now_ns()
            n = (now - start) // (NS // 4) + 1
            want = [start + i * (NS // 4) for i in range(n)]
            assert s.engine.snapshot(tt)[1]["Timestamp"].cast(pa.int64()).to_pylist() == want
            assert s.engine.snapshot(last3)[1]["Timestamp"].cast(pa.int64()).to_pylist() == want[-3:]
            assert s.engine.snapshot(flat)[1]["Timestamp"].cast(pa.int64()).to_pylist() == want


def test_update_by_rolling_formula_is_served_or_refused_naming_what_is_not_read(svc):
    c = Calls(svc)

    def formula(text: str, param: str = "x") -> table_pb2.UpdateByRequest:
        req = table_pb2.UpdateByRequest()
        op = req.operations.add()
        op.column.match_pairs.append("R=I")
        op.column.spec.rolling_formula.formula = text
        op.column.spec.rolling_formula.param_token = param
        op.column.spec.rolling_formula.reverse_window_scale.ticks.ticks = 2
        return req

    t, r = c.op("UpdateBy", formula("max(v) - min(v)", "v"), b"s/static")
    got = c.get(t)
    assert r.success and got.column_names == ["I", "S", "D", "R"] and got.schema.field("R").type == pa.int32()
    assert got.column("R").to_pylist() == [0, 0, 0, 8, 2]
    t, _ = c.op("UpdateBy", formula("sum(x)"), b"s/static")  # one aggregation alone: rolling_sum
    assert c.get(t).schema.field("R").type == pa.int64()
    code, msg = c.status("UpdateBy", formula("x.size()"), b"s/static")
    assert code == grpc.StatusCode.UNIMPLEMENTED and "'x.size()'" in msg
    # as Deephaven's service, every occurrence of the parameter is replaced, inside `max` too
    code, msg = c.status("UpdateBy", formula("max(x) - min(x)"), b"s/static")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "'ma__PARAM_COLUMN__(__PARAM_COLUMN__)" in msg
