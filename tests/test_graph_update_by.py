"""update_by under random traffic, in process: after every cycle each update_by table must equal the
same operations computed from scratch on a static copy of its parent's current rows, every update
it emits must validate and, applied to a client's copy of the previous state (`Follower`), give the
new state, and previous values of modified rows must equal that copy.

Parents: a keyed table (upserts in the middle of buckets, deletions, rows changing bucket), an
append table, a ring table (rows leave at the front), a scripted table whose updates shift rows,
and a sort of the keyed table (its rows move). Values carry nulls, NaN and -0.0. Semantics against
Deephaven itself are in tests/test_update_by_conformance.py; here the question is only whether the
incremental answer equals the answer from scratch. Replay a failure with TICKWIRE_SEED=<seed>.
"""
from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from tests.scripted import random_update, scripted_table
from tests.soak import seeds
from tests.test_graph_joins import Checked
from tests.test_graph_ops import MARKET, market_rows
from tickwire.server.engine import Engine, OperationError, TableSpec
from tickwire.server.engine import updateby as U
from tickwire.server.engine.graph.column_store import equal_mask
from tickwire.server.engine.graph.tables import StaticTable

SEEDS = seeds([41, 42, 43], 2)
CYCLES = 80

STAMPED = pa.schema([("sym", pa.string()), ("px", pa.float64()), ("qty", pa.int64()), ("ts", pa.timestamp("ns"))])


def close(a: pa.ChunkedArray, b: pa.ChunkedArray, nan_is_any: bool = False) -> bool:
    """Equal, floats within 1e-9 relative (the sums of a recomputation may round differently);
    `nan_is_any`: a NaN on either side matches anything (see WALKED)."""
    a, b = a.combine_chunks(), b.combine_chunks()
    if a.type != b.type or len(a) != len(b):
        return False
    if pa.types.is_floating(a.type):
        same_null = np.array_equal(np.asarray(a.is_null().to_numpy(zero_copy_only=False)),
                                   np.asarray(b.is_null().to_numpy(zero_copy_only=False)))
        x = np.asarray(a.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        y = np.asarray(b.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.float64)
        either = (np.isnan(x) | np.isnan(y)) if nan_is_any else np.zeros(x.size, dtype=bool)
        return same_null and bool(np.all(either | (np.isnan(x) & np.isnan(y)) | (x == y) |
                                         (np.abs(x - y) <= 1e-9 * np.maximum(np.abs(x), np.abs(y)))))
    return bool(equal_mask(a, b).all())


class Scratch:
    """Recomputations from scratch: a static copy of a table's current rows, in row order, with
    the same update_by on it."""

    def __init__(self) -> None:
        self.engine = Engine()
        self.n = 0

    def update_by(self, parent, ops, by):
        self.n += 1
        data = parent.gather()
        src = StaticTable(self.engine.graph, f"copy{self.n}", data)
        return src.update_by(ops, by, name=f"ub{self.n}").gather()


def stamped_rows(rng, n: int, t0: int) -> pa.Table:
    """Rows whose stamps do not go backwards (a time-based update_by needs that within a bucket)."""
    step = rng.integers(0, 3, n) * 500_000_000  # repeated stamps too
    ts = t0 + np.cumsum(step)
    mask_ts = rng.random(n) < 0.05
    return pa.table({
        "sym": pa.array([f"S{x}" for x in rng.integers(0, 4, n)], pa.string(), mask=rng.random(n) < 0.05),
        "px": pa.array(np.round(rng.normal(50, 20, n), 1), pa.float64(), mask=rng.random(n) < 0.1),
        "qty": pa.array(rng.integers(0, 6, n), pa.int64(), mask=rng.random(n) < 0.05),
        "ts": pa.array(ts, pa.timestamp("ns"), mask=mask_ts),
    }, schema=STAMPED)


def setup(seed):
    rng = np.random.default_rng(seed)
    engine = Engine()
    keyed = engine.create(TableSpec("keyed", "keyed", MARKET, keys=["sym", "k"]))
    trades = engine.create(TableSpec("trades", "append", STAMPED))
    ring = engine.create(TableSpec("ring", "ring", STAMPED, capacity=70))
    raw = scripted_table(engine, "scripted")
    engine.write(keyed, market_rows(rng, 30))
    engine.write(trades, stamped_rows(rng, 30, 0))
    engine.run_cycle()
    t = {"keyed": keyed, "trades": trades, "ring": ring, "raw": raw,
         "sorted": keyed.sort(["px"], name="keyed_by_px", spacing=2),
         "stamped": trades.where(pc.is_valid(pc.field("ts")), name="trades_stamped"),
         "scripted_k": raw.view(["a", "b", "c", ("k", pc.bit_wise_and(pc.field("a"), 3))], name="scripted_k")}
    return rng, engine, t


def traffic(rng, engine, t, skeys, clock):
    if rng.random() < 0.8:
        engine.write(t["keyed"], market_rows(rng, int(rng.integers(1, 12))))
    if rng.random() < 0.3:
        engine.write(t["keyed"], delete=market_rows(rng, int(rng.integers(1, 6))).select(["sym", "k"]))
    if rng.random() < 0.6:
        n = int(rng.integers(0, 8))
        engine.write(t["trades"], stamped_rows(rng, n, clock[0]))
        clock[0] += 4_000_000_000 * n
    if rng.random() < 0.6:
        n = int(rng.integers(1, 20))
        engine.write(t["ring"], stamped_rows(rng, n, clock[1]))
        clock[1] += 4_000_000_000 * n
    for _ in range(int(rng.integers(0, 3))):
        update, values, skeys = random_update(rng, skeys, max_add=10, span=40)
        engine.write(t["raw"], (update, values))
    return skeys


TICK_OPS = [U.cum_sum(["SumPx=px", "SumQ=qty"]), U.cum_prod(["ProdQ=qty"]), U.cum_min(["MinPx=px"]),
            U.cum_max(["MaxQ=qty"]), U.forward_fill(["FillPx=px"]), U.delta(["DQ=qty"]),
            U.delta(["DV=qty"], delta_control="value_dominates"),
            U.ema_tick(3, ["EmaPx=px", "EmaQ=qty"]), U.ems_tick(2.5, ["EmsPx=px"]), U.emmin_tick(2, ["EmMin=px"]),
            U.emmax_tick(2, ["EmMax=qty"]), U.emstd_tick(4, ["EmStd=px"]),
            U.ema_tick(2, ["EmaReset=px"], op_control={"on_nan": "reset", "on_null": "reset"}),
            U.ema_tick(2, ["EmaPoison=px"], op_control={"on_nan": "poison"}),
            U.rolling_sum_tick(["RSum=qty"], rev_ticks=3), U.rolling_avg_tick(["RAvg=px"], rev_ticks=4, fwd_ticks=2),
            U.rolling_min_tick(["RMin=px"], rev_ticks=2, fwd_ticks=3), U.rolling_max_tick(["RMax=qty"], rev_ticks=5),
            U.rolling_prod_tick(["RProd=qty"], rev_ticks=2), U.rolling_count_tick(["RCnt=px"], rev_ticks=6),
            U.rolling_std_tick(["RStd=px"], rev_ticks=5, fwd_ticks=1),
            U.rolling_wavg_tick("qty", ["RWavg=px"], rev_ticks=3, fwd_ticks=1),
            U.rolling_group_tick(["RGrp=qty"], rev_ticks=2, fwd_ticks=1),
            U.rolling_sum_tick(["RAhead=qty"], rev_ticks=-1, fwd_ticks=3),
            U.cum_count_where("Big", pc.field("qty") > 2, ["qty"]),
            U.rolling_count_where_tick("BigNear", pc.field("qty") > 2, rev_ticks=3, fwd_ticks=1,
                                       filter_columns=["qty"])]

TIME_OPS = [U.ema_time("ts", "PT3s", ["EmaT=px", "EmaQ=qty"]), U.ems_time("ts", 2_000_000_000, ["EmsT=px"]),
            U.emstd_time("ts", "PT5s", ["EmStdT=px"]), U.emmax_time("ts", "PT2s", ["EmMaxT=px"]),
            U.rolling_sum_time("ts", ["RSumT=qty"], "PT4s"), U.rolling_avg_time("ts", ["RAvgT=px"], "PT6s", "PT2s"),
            U.rolling_min_time("ts", ["RMinT=px"], "PT3s", "PT1s"), U.rolling_count_time("ts", ["RCntT=px"], "PT5s"),
            U.rolling_sum_time("ts", ["RBack=qty"], "PT8s", "-PT2s")]
# strings compare (as Deephaven's String.compareTo, for these ASCII names)
FORMULA_OPS = [U.rolling_formula_tick("max(y) - min(y)", "y", ["RngQ=qty", "RngPx=px"], 3, 1),
               U.rolling_formula_tick("sum(v) * 2 + count(v) / 4", "v", ["FQ=qty"], 4),
               U.rolling_formula_tick("median(z)", "z", ["MedPx=px", "MedQ=qty"], 3, 2)]
# rolling_min/rolling_max of floats walk Deephaven's operator from where a cycle's computation
# starts: a NaN it took stays until a window without values, so which rows are NaN depends on the
# history and a recomputation from scratch may differ there (tests/test_update_by_conformance.py
# checks those rows against Deephaven, ticking too); here the other rows must match
WALKED = {"RMin", "RMinT"}
STRING_OPS = [U.cum_min(["MinSym=sym"]), U.cum_max(["MaxSym=sym"]), U.rolling_min_tick(["RMinSym=sym"], rev_ticks=3),
              U.rolling_max_tick(["RMaxSym=sym"], rev_ticks=2, fwd_ticks=2)]
# over rows that all have a stamp (as Deephaven, tickwire refuses a row without one before a stamped one)
STAMPED_ONLY_OPS = [U.rolling_group_time("ts", ["RGrpT=qty"], "PT2s", "PT1s"),
                    U.rolling_formula_time("ts", "max(x) - min(x)", "x", ["RngT=px"], "PT3s"),
                    U.rolling_avg_time("ts", ["RAvgT=px"], "PT4s")]

SCRIPTED_OPS = [U.cum_sum(["SA=a"]), U.ema_tick(2, ["EA=c"]), U.rolling_avg_tick(["RA=c"], rev_ticks=3, fwd_ticks=1),
                U.forward_fill(["FB=b"]), U.cum_max(["MA=a"]), U.rolling_max_tick(["RC=c"], rev_ticks=2, fwd_ticks=2),
                U.rolling_group_tick(["GB=b"], rev_ticks=2, fwd_ticks=1)]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_update_by_matches_recomputation(seed):
    rng, engine, t = setup(seed)
    scratch = Scratch()
    cases = [
        ("keyed", TICK_OPS, ["sym"]),
        ("keyed", TICK_OPS[:8] + TICK_OPS[14:20], []),
        ("sorted", TICK_OPS[:12] + TICK_OPS[14:22] + STRING_OPS + FORMULA_OPS, ["k"]),
        ("trades", TIME_OPS + [U.cum_sum(["CS=qty"])], ["sym"]),
        ("ring", TIME_OPS, ["sym"]),
        ("ring", TIME_OPS[:3] + TIME_OPS[4:7], []),
        ("stamped", STAMPED_ONLY_OPS, ["sym"]),
        ("scripted_k", SCRIPTED_OPS, ["k"]),
    ]
    nodes = []
    for i, (parent, ops, by) in enumerate(cases):
        tbl = t[parent].update_by(ops, by, name=f"ub{i}")

        def check(tbl=tbl, parent=t[parent], ops=ops, by=by):
            want = scratch.update_by(parent, ops, by)
            got = tbl.gather()
            return want.schema == got.schema and all(close(got.column(c), want.column(c), c in WALKED)
                                                     for c in got.column_names)
        assert check(), f"{tbl.name}: initial state"
        nodes.append(Checked(tbl, check))
    skeys = np.zeros(0, dtype=np.int64)
    clock = [10**12, 10**12]
    updates = 0
    for cycle in range(CYCLES):
        skeys = traffic(rng, engine, t, skeys, clock)
        ups = engine.run_cycle()
        updates += sum(1 for n in nodes if n.table.name in ups)
        for n in nodes:
            assert n.check(), f"seed {seed} cycle {cycle}: {n.table.name} differs from its recomputation"
    assert updates > CYCLES  # the tables did change
    assert sum(n.prev_checked for n in nodes) > 100  # previous values were checked


def test_an_appended_row_continues_each_bucket_from_its_state():
    engine = Engine()
    sch = pa.schema([("sym", pa.string()), ("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"sym": ["a", "b", "a"], "x": [1.0, 10.0, 3.0]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.cum_sum("S=x"), U.ema_tick(2, "E=x"), U.rolling_sum_tick("R=x", rev_ticks=2)], "sym")
    seen = []
    u.add_listener(lambda tbl, up, step: seen.append(up))
    engine.write(src, pa.table({"sym": ["a", "b"], "x": [5.0, 1.0]}, schema=sch))
    engine.run_cycle()
    got = u.gather().to_pydict()
    a = np.exp(-0.5)
    ema_a = a * (a * 1.0 + (1 - a) * 3.0) + (1 - a) * 5.0
    assert got["S"] == [1.0, 10.0, 4.0, 9.0, 11.0]
    assert got["R"] == [1.0, 10.0, 4.0, 8.0, 11.0]
    assert got["E"][3] == pytest.approx(ema_a, rel=1e-12)
    (up,) = seen
    assert up.added.keys().tolist() == [3, 4] and up.modified.is_empty()  # earlier rows kept their values


def test_a_change_in_the_middle_of_a_bucket_modifies_the_rows_after_it_only():
    engine = Engine()
    sch = pa.schema([("id", pa.int64()), ("sym", pa.string()), ("x", pa.int64())])
    src = engine.create(TableSpec("src", "keyed", sch, keys=["id"]))
    engine.write(src, pa.table({"id": list(range(8)), "sym": list("abababab"), "x": [1] * 8}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.cum_sum("S=x")], "sym")
    seen = []
    u.add_listener(lambda tbl, up, step: seen.append(up))
    engine.write(src, pa.table({"id": [4], "sym": ["a"], "x": [5]}, schema=sch))
    engine.run_cycle()
    assert u.gather().column("S").to_pylist() == [1, 1, 2, 2, 7, 3, 8, 4]
    (up,) = seen
    assert up.modified.keys().tolist() == [4, 6]  # row 4 (x and S) and the 'a' row after it (S)


def test_time_based_operations_refuse_stamps_that_go_backwards_in_a_bucket():
    engine = Engine()
    sch = pa.schema([("sym", pa.string()), ("ts", pa.timestamp("ns")), ("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"sym": ["a", "b", "a"], "ts": [5, 1, 3], "x": [1.0, 2.0, 3.0]}, schema=sch))
    engine.run_cycle()
    with pytest.raises(OperationError, match="must not decrease"):
        src.update_by([U.ema_time("ts", 10, "E=x")], "sym")
    with pytest.raises(OperationError, match="must not decrease"):
        src.update_by([U.rolling_sum_time("ts", "R=x", 10)], "sym")
    engine.write(src, pa.table({"sym": ["c", "c"], "ts": [7, 7], "x": [1.0, 2.0]}, schema=sch))
    engine.run_cycle()
    ok = src.where(pc.field("sym") == "c").update_by([U.ema_time("ts", 10, "E=x")], "sym")  # equal stamps are fine
    assert ok.gather().column("E").to_pylist() == [1.0, 1.0]  # the second one is skipped (no time passed)


def test_bad_requests_are_refused_with_the_reason():
    engine = Engine()
    sch = pa.schema([("sym", pa.string()), ("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    with pytest.raises(OperationError, match="Nope"):
        src.update_by([U.cum_sum("S=Nope")])
    with pytest.raises(OperationError, match="sym"):
        src.update_by([U.cum_sum("S=sym")])
    with pytest.raises(OperationError, match="given twice"):
        src.update_by([U.cum_sum("x"), U.cum_max("x")])


def test_rolling_std_keeps_the_digits_of_values_far_from_zero():
    """A one-pass sum of squares in a double loses the spread of values far from zero and close
    together; rolling_std keeps it (tick windows and time windows, built and appended to). As
    Deephaven: a spread within one ulp of the sum of squares is 0 (so is a window of one repeated
    value), and a sum of squares that is not a finite double gives NaN."""
    engine = Engine()
    sch = pa.schema([("g", pa.string()), ("ts", pa.timestamp("ns")), ("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    b = 1e4
    xs = [b + 0.1, b + 0.3, b + 0.3, b + 0.3, 1e8 + 0.1, 1e8 + 0.3, 1.0, 1e200, 1.0]
    gs = ["a"] * 6 + ["z"] * 3  # a value whose square is no double, in a bucket of its own
    engine.write(src, pa.table({"g": gs, "ts": list(range(len(xs))), "x": xs}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.rolling_std_tick("T=x", rev_ticks=2), U.rolling_std_time("ts", "S=x", 1)], "g")
    engine.write(src, pa.table({"g": ["a", "a"], "ts": [6, 7], "x": [b + 0.1, b + 0.3]}, schema=sch))
    engine.run_cycle()  # the appended rows continue from the stored prefixes
    spread = float(np.std(np.array([b + 0.1, b + 0.3]) - b, ddof=1))  # of what the doubles hold
    for col in ("T", "S"):
        got = u.gather().column(col).to_pylist()
        assert math.isnan(got[0])  # one value
        assert got[1] == pytest.approx(spread, rel=1e-12)  # a double sum of squares is ~1e-6 off
        assert got[2] == 0.0 and got[3] == 0.0  # one repeated value
        assert got[4] == pytest.approx((1e8 - b - 0.2) / math.sqrt(2), rel=1e-12)
        assert got[5] == 0.0  # 0.2 apart at 1e8: within an ulp of the sum of squares (2e16)
        assert math.isnan(got[6]) and math.isnan(got[7]) and math.isnan(got[8])  # (1e200)^2 is no double
        assert got[9] == pytest.approx((1e8 + 0.3 - b - 0.1) / math.sqrt(2), rel=1e-12)
        assert got[10] == pytest.approx(spread, rel=1e-12)


def test_rolling_group_over_time_refuses_a_row_without_a_stamp_before_a_stamped_one():
    """As Deephaven 42.7 (which fails with an internal error of its row sets there): refused when
    made, and the table fails when such a row arrives; rows without a stamp at a bucket's end are
    answered (they are in no window: null)."""
    engine = Engine()
    sch = pa.schema([("sym", pa.string()), ("ts", pa.timestamp("ns")), ("x", pa.int64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"sym": ["a", "a", "b"], "ts": [1, None, 2], "x": [1, 2, 3]}, schema=sch))
    engine.run_cycle()
    g = src.update_by([U.rolling_group_time("ts", "G=x", 5)], "sym")
    assert g.gather().column("G").to_pylist() == [[1], None, [3]]
    with pytest.raises(OperationError, match="without a stamp comes before a stamped row"):
        src.update_by([U.rolling_group_time("ts", "G=x", 5)])  # no buckets: the null before b's stamp
    engine.write(src, pa.table({"sym": ["a"], "ts": [3], "x": [4]}, schema=sch))
    engine.run_cycle()
    assert g.failure is not None and "without a stamp" in g.failure.message


def test_an_output_named_like_a_by_column_replaces_it_and_the_buckets_stay_the_parents():
    """As Deephaven: the output takes the by column's place (and type); rows are bucketed by the
    parent's column, also when a row moves to another bucket."""
    engine = Engine()
    sch = pa.schema([("id", pa.int64()), ("G", pa.string()), ("I32", pa.int32())])
    src = engine.create(TableSpec("src", "keyed", sch, keys=["id"]))
    engine.write(src, pa.table({"id": [0, 1, 2, 3], "G": ["a", "b", "a", None], "I32": [1, 2, 3, 4]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.cum_sum("G=I32")], ["G"])
    assert u.schema.names == ["id", "G", "I32"] and u.schema.field("G").type == pa.int64()
    assert u.gather().column("G").to_pylist() == [1, 2, 4, 4]
    seen = []
    u.add_listener(lambda tbl, up, step: seen.append(up))
    engine.write(src, pa.table({"id": [1], "G": ["a"], "I32": [10]}, schema=sch))  # b -> a
    engine.run_cycle()
    assert u.gather().column("G").to_pylist() == [1, 11, 14, 4]
    (up,) = seen
    assert up.modified.keys().tolist() == [1, 2] and "G" in up.modified_columns


def test_strings_have_a_min_and_a_max():
    """cum_min, cum_max, rolling_min and rolling_max of a String column, as Deephaven compares
    Strings; appended rows continue from the row before's output."""
    engine = Engine()
    sch = pa.schema([("id", pa.int64()), ("G", pa.string()), ("S", pa.string())])
    src = engine.create(TableSpec("src", "keyed", sch, keys=["id"]))
    engine.write(src, pa.table({"id": [0, 1, 2, 3, 4], "G": ["a", "b", "a", None, "a"],
                                "S": ["m", None, "c", "q", None]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.cum_min("Mn=S"), U.cum_max("Mx=S"), U.rolling_min_tick("Rn=S", rev_ticks=2),
                       U.rolling_max_tick("Rx=S", rev_ticks=2)], ["G"])
    assert u.schema.field("Mn").type == pa.string()
    engine.write(src, pa.table({"id": [5, 6], "G": ["a", "b"], "S": ["a", "z"]}, schema=sch))
    engine.run_cycle()
    got = u.gather().to_pydict()
    assert got["Mn"] == ["m", None, "c", "q", "c", "a", "z"]
    assert got["Mx"] == ["m", None, "m", "q", "m", "m", "z"]
    assert got["Rn"] == ["m", None, "c", "q", "c", "a", "z"]
    assert got["Rx"] == ["m", None, "m", "q", "c", "a", "z"]


def test_rolling_formula_is_arithmetic_over_aggregations_typed_as_java():
    """max(y) - min(y) of a byte column is an int (Java promotes byte arithmetic), sum(y) + 1 a long,
    a division a double, median a double that is NaN when the window holds a NaN; a null operand
    gives null; other formulas are refused naming the part tickwire does not read."""
    engine = Engine()
    sch = pa.schema([("I8", pa.int8()), ("F", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"I8": [1, None, 3, 7], "F": [1.5, float("nan"), 3.0, None]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.rolling_formula_tick("max(y) - min(y)", "y", ["R8=I8"], 2),
                       U.rolling_formula_tick("sum(y) + 1", "y", ["S8=I8"], 2),
                       U.rolling_formula_tick("-max(y) / 2", "y", ["D8=I8"], 1),
                       U.rolling_formula_tick("median(y)", "y", ["M8=I8", "MF=F"], 3)])
    assert [u.schema.field(c).type for c in ("R8", "S8", "D8", "M8", "MF")] == \
        [pa.int32(), pa.int64(), pa.float64(), pa.float64(), pa.float64()]
    got = u.gather().to_pydict()
    assert got["R8"] == [0, 0, 0, 4]
    assert got["S8"] == [2, 2, 4, 11]
    assert got["D8"] == [-0.5, None, -1.5, -3.5]
    assert got["M8"] == [1.0, 1.0, 2.0, 5.0]
    assert got["MF"][0] == 1.5 and all(math.isnan(v) for v in got["MF"][1:3]) and math.isnan(got["MF"][3])
    for bad in ("foo(y)", "max(y) % 2", "max(q)", "y.size()"):
        with pytest.raises(OperationError, match="rolling_formula"):
            U.rolling_formula_tick(bad, "y", ["X=I8"], 2)


def test_a_decay_of_zero_multiplies_the_previous_value_by_zero_and_a_reset_restarts_at_the_value():
    """As Deephaven: alpha is exp(-1/0) = 0, applied literally (0 * inf is NaN, which stays); a
    state reset starts again at the next value itself, -0.0 keeping its sign."""
    engine = Engine()
    sch = pa.schema([("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"x": [1.0, math.inf, 2.0, 3.0]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.ema_tick(0, "E=x"), U.ems_tick(0, "S=x")])
    got = u.gather().to_pydict()
    assert got["E"][:2] == [1.0, math.inf] and math.isnan(got["E"][2]) and math.isnan(got["E"][3])
    assert got["S"][:2] == [1.0, math.inf] and math.isnan(got["S"][2])
    src2 = engine.create(TableSpec("src2", "append", sch))
    engine.write(src2, pa.table({"x": [1.0, math.nan, -0.0, 2.0]}, schema=sch))
    engine.run_cycle()
    r = src2.update_by([U.ema_tick(2, "E=x", op_control={"on_nan": "reset"})]).gather().column("E").to_pylist()
    assert r[0] == 1.0 and r[1] is None and r[2] == 0.0 and math.copysign(1.0, r[2]) == -1.0


def test_em_min_and_max_with_a_decay_of_zero_read_zero_times_the_previous_value_row_by_row():
    """As Deephaven: min/max(0.0 * previous, x): -0.0 after a negative value, NaN after an
    infinity (and it stays), continued from the state across cycles."""
    engine = Engine()
    sch = pa.schema([("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"x": [-1.0, 2.0, -math.inf, math.inf, 5.0]}, schema=sch))
    engine.run_cycle()
    got = src.update_by([U.emmax_tick(0, "M=x")]).gather().column("M").to_pylist()
    assert got[:3] == [-1.0, 2.0, 0.0] and math.copysign(1.0, got[2]) == 1.0
    assert got[3] == math.inf and math.isnan(got[4])
    src2 = engine.create(TableSpec("src2", "append", sch))
    engine.write(src2, pa.table({"x": [2.0, 3.0, -math.inf, 4.0]}, schema=sch))
    engine.run_cycle()
    got = src2.update_by([U.emmin_tick(0, "M=x")]).gather().column("M").to_pylist()
    assert got[:3] == [2.0, 0.0, -math.inf] and math.isnan(got[3])
    src3 = engine.create(TableSpec("src3", "append", sch))
    engine.write(src3, pa.table({"x": [-1.0]}, schema=sch))
    engine.run_cycle()
    m = src3.update_by([U.emmin_tick(0, "M=x")])
    engine.write(src3, pa.table({"x": [3.0]}, schema=sch))
    engine.run_cycle()
    got = m.gather().column("M").to_pylist()
    assert got == [-1.0, 0.0] and math.copysign(1.0, got[1]) == -1.0  # min(-0.0, 3.0) from the state


def test_a_time_decay_poisoned_before_any_stamped_value_refuses_the_next_stamped_value():
    """As Deephaven 42.7: the poisoned state has no last stamp (Long.MIN_VALUE), and the next
    stamped value's time delta from it overflows; Deephaven fails as for a decreasing stamp. A
    reset in between starts afresh."""
    engine = Engine()
    sch = pa.schema([("ts", pa.timestamp("ns")), ("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"ts": [1, 2], "x": [math.nan, 4.0]}, schema=sch))
    engine.run_cycle()
    with pytest.raises(OperationError, match="must not decrease"):
        src.update_by([U.ema_time("ts", 10, "E=x", op_control={"on_nan": "poison"})])
    ok = src.update_by([U.ema_time("ts", 10, "E=x")])  # NaN skipped: answered
    assert ok.gather().column("E").to_pylist() == [None, 4.0]
    src2 = engine.create(TableSpec("src2", "append", sch))
    engine.write(src2, pa.table({"ts": [1, 2, 3], "x": [math.nan, None, 4.0]}, schema=sch))
    engine.run_cycle()
    reset = src2.update_by([U.ema_time("ts", 10, "E=x", op_control={"on_nan": "poison", "on_null": "reset"})])
    assert reset.gather().column("E").to_pylist()[1:] == [None, 4.0]
    src3 = engine.create(TableSpec("src3", "append", sch))
    engine.write(src3, pa.table({"ts": [1], "x": [math.nan]}, schema=sch))
    engine.run_cycle()
    g = src3.update_by([U.ems_time("ts", 10, "E=x", op_control={"on_nan": "poison"})])
    assert math.isnan(g.gather().column("E").to_pylist()[0])
    engine.write(src3, pa.table({"ts": [2], "x": [4.0]}, schema=sch))
    engine.run_cycle()
    assert g.failure is not None and "must not decrease" in g.failure.message


def test_rolling_min_of_infinities_answers_max_value_as_deephaven():
    """Deephaven's rolling_min of doubles starts at Double.MAX_VALUE and its window buffer's
    identity is MAX_VALUE: a window of +inf only answers MAX_VALUE, but +inf when the operator took
    it as the first value after a window without values and nothing has left the window since."""
    engine = Engine()
    sch = pa.schema([("x", pa.float64()), ("f", pa.float32())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"x": [math.inf, None, math.inf, math.inf, 2.0],
                                "f": [math.inf, None, math.inf, math.inf, 2.0]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.rolling_min_tick(["M=x", "F=f"], rev_ticks=1)])
    big, big32 = float(np.finfo(np.float64).max), float(np.finfo(np.float32).max)
    assert u.gather().column("M").to_pylist() == [big, None, math.inf, big, 2.0]
    assert u.gather().column("F").to_pylist() == [big32, None, math.inf, big32, 2.0]
    engine.write(src, pa.table({"x": [None, math.inf], "f": [None, math.inf]}, schema=sch))
    engine.run_cycle()
    assert u.gather().column("M").to_pylist()[5:] == [None, math.inf]


def test_rolling_min_and_max_of_floats_walk_deephavens_operator_over_nan():
    """Deephaven's rolling_max starts null and takes its first value, a NaN included, which then
    stays (a NaN never compares) until a window without values; its rolling_min starts at
    MAX_VALUE, which a NaN does not replace."""
    engine = Engine()
    sch = pa.schema([("x", pa.float64())])
    src = engine.create(TableSpec("src", "append", sch))
    engine.write(src, pa.table({"x": [math.nan, 1.0, None, None, 3.0, 2.0]}, schema=sch))
    engine.run_cycle()
    u = src.update_by([U.rolling_max_tick("Mx=x", rev_ticks=2), U.rolling_min_tick("Mn=x", rev_ticks=2)])
    got = u.gather().to_pydict()
    mx = got["Mx"]
    assert all(math.isnan(v) for v in mx[:3]) and mx[3:] == [None, 3.0, 3.0]
    assert got["Mn"] == [float(np.finfo(np.float64).max), 1.0, 1.0, None, 3.0, 2.0]
