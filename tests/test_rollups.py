"""Rollups (Deephaven's HierarchicalTableService and the ObjectService descriptor), in process and
against a real Deephaven 42.7.

In process: a rollup of a ticking keyed source, made, sorted, filtered and viewed through the
service calls, its view subscribed to by tickwire's client; after every cycle the subscribed
rows (the client's state, built from the updates it received) must equal the rows recomputed
from scratch in plain Python from the source's rows: every level's aggregates, the expanded rows
in depth-first order with each node's children sorted, the depth and expanded columns.

Against Deephaven (headless Chromium, Deephaven's own JS API on each server's page): the same
`table.rollup(config)`, `expand`, `setViewport` calls on the same data must show the same rows,
column names and types.
"""
from __future__ import annotations

import math
import struct
from typing import Optional

import grpc
import numpy as np
import pyarrow as pa
import pytest

from tests.harness import Services
from tickwire.protocol.proto import hierarchicaltable_pb2 as H
from tickwire.protocol.proto import object_pb2 as O
from tickwire.protocol.proto import table_pb2 as T
from tickwire.protocol.proto.methods import HIERARCHICAL_TABLE_SERVICE, OBJECT_SERVICE
from tickwire.server.engine import TableSpec
from tickwire.server.engine.hierarchical import (
    CONTRACT,
    EXPAND,
    EXPAND_ALL,
    EXPAND_TO_DEPTH_BASE,
    ROW_DEPTH,
    ROW_EXPANDED,
)

SCHEMA = pa.schema([("id", pa.int64()), ("A", pa.string()), ("B", pa.int32()), ("V", pa.float64()),
                    ("N", pa.int64())])
GROUPS = ["A", "B"]
A_VALUES = ["x", "y", "z", None]


def _ticket(i: int) -> bytes:
    return b"e" + struct.pack("<i", i)


def _tk(i: int):
    from tickwire.protocol.proto import ticket_pb2
    return ticket_pb2.Ticket(ticket=_ticket(i))


def _aggregations():
    cols = T.Aggregation.AggregationColumns
    return [
        T.Aggregation(columns=cols(spec=T.AggSpec(sum=T.AggSpec.AggSpecSum()), match_pairs=["V", "N"])),
        T.Aggregation(columns=cols(spec=T.AggSpec(max=T.AggSpec.AggSpecMax()), match_pairs=["MaxN=N"])),
        T.Aggregation(count=T.Aggregation.AggregationCount(column_name="Cnt")),
    ]


# -- the reference, in plain Python ---------------------------------------------------------------

def _levels(rows: list[dict]) -> list[dict]:
    """level k: {first k group values: (V sum, N sum, N max, count)}."""
    out = []
    for k in range(len(GROUPS) + 1):
        acc: dict = {}
        for r in rows:
            key = tuple(r[g] for g in GROUPS[:k])
            v, n, mx, c = acc.get(key, (0.0, 0, None, 0))
            acc[key] = (v + r["V"], n + r["N"], r["N"] if mx is None else max(mx, r["N"]), c + 1)
        out.append(acc)
    return out


def _sort_key(value, descending: bool):
    # Deephaven's order: null first ascending (so last descending)
    return (value is not None, value if value is not None else 0)


def reference_rows(rows: list[dict], expand: dict, sorts: list[tuple[str, bool]] = (),
                   constituents: bool = False) -> list[tuple]:
    """The expanded rows: `expand` maps (depth, key tuple) -> action (the total row is expanded
    unless said otherwise); each node's children ordered by `sorts` (column, descending), then by
    their group-by values. With `constituents`, the deepest rows expand to the source rows (in
    `rows`' order, sorted by the columns the sorted aggregated columns read), which fill the source
    columns after the aggregated ones."""
    levels = _levels(rows)
    n = len(GROUPS)
    out: list[tuple] = []
    idx = {"V": 0, "N": 1, "MaxN": 2, "Cnt": 3}

    def visit(k: int, key: tuple, remaining: float) -> None:
        depth = k + 1
        v, s, mx, c = levels[k][key]
        act = expand.get((depth, key), EXPAND if depth == 1 else None)
        if k == n and not constituents:
            exp, rem = None, 0.0
        elif act == EXPAND:
            exp, rem = True, 0.0
        elif act == EXPAND_ALL:
            exp, rem = True, math.inf
        elif act == CONTRACT:
            exp, rem = False, 0.0
        elif act is not None and act >= EXPAND_TO_DEPTH_BASE:  # this node and act - BASE levels below
            exp, rem = True, float(act - EXPAND_TO_DEPTH_BASE)
        else:
            exp, rem = remaining > 0, max(remaining - 1, 0)
        groups = list(key) + [None] * (n - k)
        out.append((depth, exp, *groups, v, s, mx, c) + ((None,) * len(SCHEMA) if constituents else ()))
        if exp and k == n:
            under = [r for r in rows if tuple(r[g] for g in GROUPS) == key]
            inputs = {"V": "V", "N": "N", "MaxN": "N", "A": "A", "B": "B"}
            for col, desc in reversed(list(sorts)):
                if col in inputs:
                    under.sort(key=lambda r, col=col, desc=desc: _sort_key(r[inputs[col]], desc), reverse=desc)
            for r in under:
                out.append((n + 2, None) + (None,) * (n + 4) + tuple(r[f] for f in SCHEMA.names))
        elif exp:
            children = [ck for ck in levels[k + 1] if ck[:k] == key]

            def value(ck, col):
                return ck[GROUPS.index(col)] if col in GROUPS else levels[k + 1][ck][idx[col]]
            for col, desc in reversed(list(sorts) + [(g, False) for g in GROUPS[:k + 1]]):
                if col in GROUPS and GROUPS.index(col) > k:
                    continue  # null on every child
                children.sort(key=lambda ck, col=col, desc=desc: _sort_key(value(ck, col), desc), reverse=desc)
            for ck in children:
                visit(k + 1, ck, rem)

    if levels[0]:
        visit(0, (), 0.0)
    return out


def _as_tuples(t: pa.Table) -> list[tuple]:
    cols = [t.column(i).to_pylist() for i in range(t.num_columns)]
    return [tuple(r) for r in zip(*cols)]


# -- in process --------------------------------------------------------------------------------------

class Rolled:
    """A ticking keyed source in a Services harness, and service calls on it."""

    def __init__(self, s: Services, seed: int):
        self.s = s
        self.rng = np.random.default_rng(seed)
        self.source = s.engine.create(TableSpec("src", "keyed", SCHEMA, keys=["id"]))
        self.client = s.client()  # the calls below go in the client's session, whose exports it subscribes to
        assert self.client.auth.bearer
        self.token = self.client.auth.bearer.removeprefix("Bearer ")
        self.next_id = 1
        self.rows: dict[int, dict] = {}

    def tick(self) -> None:
        rng = self.rng
        n = int(rng.integers(1, 12))
        ids = rng.integers(0, 40, n)
        data = {"id": ids, "A": [A_VALUES[i] for i in rng.integers(0, 4, n)],
                "B": pa.array(rng.integers(0, 3, n), pa.int32()),
                "V": rng.integers(-20, 20, n) * 0.5, "N": rng.integers(0, 1000, n)}
        t = pa.table(data, schema=SCHEMA)
        # the last write of an id wins, as the keyed source applies it
        for r in t.to_pylist():
            self.rows[r["id"]] = r
        self.s.write(self.source, t)
        gone = [int(i) for i in rng.integers(0, 40, int(rng.integers(0, 4))) if int(i) not in set(ids.tolist())]
        if gone:
            self.s.write(self.source, delete=pa.table({"id": pa.array(gone, pa.int64())}))
            for i in gone:
                self.rows.pop(i, None)
        self.s.cycle()

    def call(self, method: str, req):
        return self.s.call(HIERARCHICAL_TABLE_SERVICE, method, req, token=self.token)

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def rollup(self, group_by=GROUPS, aggs=None, constituents: bool = False) -> int:
        rid = self.new_id()
        self.call("Rollup", H.RollupRequest(result_rollup_table_id=_tk(rid), source_table_id=_scope("src"),
                                            aggregations=aggs or _aggregations(), group_by_columns=list(group_by),
                                            include_constituents=constituents))
        return rid

    def apply(self, rid: int, sorts=(), filters=()) -> int:
        out = self.new_id()
        req = H.HierarchicalTableApplyRequest(result_hierarchical_table_id=_tk(out),
                                              input_hierarchical_table_id=_tk(rid))
        for col, desc in sorts:
            req.sorts.append(T.SortDescriptor(column_name=col, direction=-1 if desc else 1))
        req.filters.extend(filters)
        self.call("Apply", req)
        return out

    def keys(self, entries: list[tuple[int, tuple, int]]) -> int:
        """A key table uploaded by DoPut, as the JS API makes one: the group-by columns, the depth
        and a byte action column."""
        kid = self.new_id()
        cols = {g: [(list(k) + [None] * len(GROUPS))[i] for _d, k, _a in entries] for i, g in enumerate(GROUPS)}
        table = pa.table({"A": pa.array(cols["A"], pa.string()), "B": pa.array(cols["B"], pa.int32()),
                          ROW_DEPTH: pa.array([d for d, _k, _a in entries], pa.int32()),
                          "__action__": pa.array([a for _d, _k, a in entries], pa.int8())})
        self.s.put(["export", str(kid)], table, token=self.token)
        self.s.cycle()  # the upload's rows arrive with a cycle
        return kid

    def view(self, rid: int, key_id: Optional[int] = None) -> int:
        vid = self.new_id()
        req = H.HierarchicalTableViewRequest(result_view_id=_tk(vid), hierarchical_table_id=_tk(rid))
        if key_id is not None:
            req.expansions.key_table_id.CopyFrom(_tk(key_id))
            req.expansions.key_table_action_column = "__action__"
        self.call("View", req)
        return vid


def _scope(name: str):
    from tickwire.protocol.proto import ticket_pb2
    return ticket_pb2.Ticket(ticket=b"s/" + name.encode())


def _expansions(rng) -> tuple[list[tuple[int, tuple, int]], dict]:
    entries = []
    for a in A_VALUES:
        r = rng.random()
        if r < 0.5:
            entries.append((2, (a,), EXPAND))
        elif r < 0.6:
            entries.append((2, (a,), CONTRACT))
    if rng.random() < 0.3:
        entries.append((1, (), EXPAND_ALL))
        if rng.random() < 0.5:
            entries.append((2, ("x",), CONTRACT))
    if rng.random() < 0.2:
        entries.append((1, (), CONTRACT))
    elif rng.random() < 0.2:
        entries.append((1, (), EXPAND_TO_DEPTH_BASE + 1))  # the total row and the level below it
    expand: dict = {}
    for d, k, a in entries:
        expand[(d, k)] = a
    return entries, expand


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_view_follows_its_ticking_source_cycle_by_cycle(seed):
    with Services() as s:
        r = Rolled(s, seed)
        for _ in range(3):
            r.tick()
        rid = r.rollup()
        # a sort, then the group-by columns: every node's children in one order
        sort = [[], [("V", True)], [("Cnt", False)], [("A", True)]][seed % 4]
        sid = r.apply(rid, sorts=sort + [("A", False), ("B", False)])
        entries, expand = _expansions(r.rng)
        vid = r.view(sid, r.keys(entries))
        sub = r.client.subscribe(_ticket(vid))
        for cycle in range(40):
            want = reference_rows(list(r.rows.values()), expand, sort)
            assert s.wait_for(sub, lambda x, want=want: _as_tuples(x.table) == want, timeout=10), (
                f"seed {seed} cycle {cycle}:\n got {_as_tuples(sub.table)}\nwant {want}")
            r.tick()
        assert sub.table.column_names[:2] == [ROW_DEPTH, ROW_EXPANDED]


def test_default_view_a_viewport_and_the_default_order():
    with Services() as s:
        r = Rolled(s, 7)
        t = pa.table({"id": [1, 2, 3, 4, 5], "A": ["y", "x", "y", None, "x"],
                      "B": pa.array([1, 0, 0, 2, 1], pa.int32()), "V": [1.0, 2.0, 3.0, 4.0, 5.0],
                      "N": [10, 20, 30, 40, 50]}, schema=SCHEMA)
        s.write(r.source, t)
        s.cycle()
        vid = r.view(r.rollup())
        sub = r.client.subscribe(_ticket(vid), viewport=[(0, 2)])
        # the total row expanded, its children in the order their groups first appeared
        assert s.wait_for(sub, lambda x: x.size == 4)
        assert s.doget(_ticket(vid), token=r.token).column("A").to_pylist() == [None, "y", "x", None]
        assert _as_tuples(s.doget(_ticket(vid), token=r.token))[0] == (1, True, None, None, 15.0, 150, 50, 5)
        # a new group arrives last; a change of the total row is a modification
        s.write(r.source, pa.table({"id": [6], "A": ["w"], "B": pa.array([0], pa.int32()), "V": [0.5], "N": [1]},
                                   schema=SCHEMA))
        s.cycle()
        assert s.wait_for(sub, lambda x: x.size == 5)
        got = s.doget(_ticket(vid), token=r.token)
        assert got.column("A").to_pylist() == [None, "y", "x", None, "w"]
        assert got.column(ROW_EXPANDED).to_pylist() == [True, False, False, False, False]
        # the rollup's own ticket is not a table to read or subscribe to (its views are), as Deephaven answers
        rid = r.rollup()
        code, details = s.status(lambda: s.doget(_ticket(rid), token=r.token))
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert details == f"Ticket (export/{rid}) is not a subscribable table."


def test_filters_on_group_by_columns_and_the_source_export():
    with Services() as s:
        r = Rolled(s, 8)
        for _ in range(4):
            r.tick()
        rid = r.rollup()
        cond = T.Condition(compare=T.CompareCondition(
            operation=T.CompareCondition.CompareOperation.Value("EQUALS"),
            lhs=T.Value(reference=T.Reference(column_name="A")),
            rhs=T.Value(literal=T.Literal(string_value="x"))))
        fid = r.apply(rid, filters=[cond], sorts=[("B", False)])
        vid = r.view(fid, r.keys([(2, ("x",), EXPAND)]))
        sub = r.client.subscribe(_ticket(vid))
        for cycle in range(10):
            rows = [x for x in r.rows.values() if x["A"] == "x"]
            want = reference_rows(rows, {(2, ("x",)): EXPAND}, [("B", False)])
            assert s.wait_for(sub, lambda x, want=want: _as_tuples(x.table) == want, timeout=10), (cycle, want)
            r.tick()
        # a filter on another column is refused, naming it
        bad = T.Condition(compare=T.CompareCondition(
            operation=T.CompareCondition.CompareOperation.Value("GREATER_THAN"),
            lhs=T.Value(reference=T.Reference(column_name="V")), rhs=T.Value(literal=T.Literal(double_value=0.0))))
        with pytest.raises(grpc.RpcError) as err:
            r.apply(rid, filters=[bad])
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'V'" in err.value.details()
        # ExportSource: the source of the filtered rollup is the filtered table
        src = r.new_id()
        resp = r.call("ExportSource", H.HierarchicalTableSourceExportRequest(result_table_id=_tk(src),
                                                                             hierarchical_table_id=_tk(fid)))
        assert resp.success
        assert set(s.doget(_ticket(src), token=r.token).column("A").to_pylist()) <= {"x"}


def test_the_descriptor_names_the_structural_and_rollup_columns():
    with Services() as s:
        r = Rolled(s, 9)
        r.tick()
        rid = r.rollup()
        resp = s.call(OBJECT_SERVICE, "FetchObject",
                      O.FetchObjectRequest(source_id={"ticket": _tk(rid), "type": "HierarchicalTable"}), token=r.token)
        assert resp.type == "HierarchicalTable" and not resp.typed_export_ids
        d = H.HierarchicalTableDescriptor.FromString(resp.data)
        assert not d.is_static
        schema = pa.ipc.read_schema(pa.py_buffer(d.snapshot_schema))
        assert schema.names == [ROW_DEPTH, ROW_EXPANDED, "A", "B", "V", "N", "MaxN", "Cnt"]
        md = {f.name: {k.decode(): v.decode() for k, v in (f.metadata or {}).items()} for f in schema}
        p = "deephaven:"
        assert md[ROW_DEPTH][p + "hierarchicalTable.isRowDepthColumn"] == "true"
        assert md[ROW_DEPTH][p + "hierarchicalTable.isExpandByColumn"] == "true"
        assert md[ROW_EXPANDED][p + "hierarchicalTable.isRowExpandedColumn"] == "true"
        assert md["A"][p + "rollupTable.isGroupByColumn"] == "true"
        assert md["V"][p + "rollupTable.aggregationInputColumnName"] == "V"
        assert md["V"][p + "description"] == "V aggregated with sum"
        assert md["MaxN"][p + "rollupTable.aggregationInputColumnName"] == "N"
        assert md["Cnt"][p + "description"] == "count" and md["Cnt"][p + "rollupTable.aggregationInputColumnName"] == ""
        assert md["B"][p + "type"] == "int" and md[ROW_EXPANDED][p + "type"] == "java.lang.Boolean"
        # the same bytes through MessageStream, then the end of the stream
        call = s.bidi(OBJECT_SERVICE, "MessageStream",
                      [O.StreamRequest(connect=O.ConnectRequest(source_id={"ticket": _tk(rid),
                                                                           "type": "HierarchicalTable"}))],
                      token=r.token)
        answers = list(call)
        assert len(answers) == 1 and answers[0].data.payload == resp.data
        # a table is not a hierarchical table
        with pytest.raises(grpc.RpcError) as err:
            s.call(OBJECT_SERVICE, "FetchObject", O.FetchObjectRequest(
                source_id={"ticket": _scope("src"), "type": "HierarchicalTable"}), token=r.token)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_refusals_name_what_is_not_served():
    with Services() as s:
        r = Rolled(s, 10)
        r.tick()
        cases = [
            ({"group_by": ["Nope"]}, grpc.StatusCode.INVALID_ARGUMENT, "'Nope'"),
            ({"aggs": [T.Aggregation(columns=T.Aggregation.AggregationColumns(
                spec=T.AggSpec(median=T.AggSpec.AggSpecMedian()), match_pairs=["V"]))]},
             grpc.StatusCode.INVALID_ARGUMENT, "AggMedian is not supported for rollup()"),
            ({"aggs": [T.Aggregation(formula=T.Aggregation.AggregationFormula(
                selectable=T.Selectable(raw="X = sum(V)")))]},
             grpc.StatusCode.UNIMPLEMENTED, "formula and partition aggregations in rollups"),
            ({"aggs": [T.Aggregation(partition=T.Aggregation.AggregationPartition(column_name="P"))]},
             grpc.StatusCode.UNIMPLEMENTED, "formula and partition aggregations in rollups"),
        ]
        for kw, code, words in cases:
            with pytest.raises(grpc.RpcError) as err:
                r.rollup(**kw)
            assert err.value.code() == code and words in err.value.details(), (kw, err.value.details())
        with pytest.raises(grpc.RpcError) as err:  # a view of something that is not a rollup
            r.call("View", H.HierarchicalTableViewRequest(result_view_id=_tk(r.new_id()),
                                                          hierarchical_table_id=_scope("src")))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            s.call(HIERARCHICAL_TABLE_SERVICE, "Tree", H.TreeRequest(), token=r.token)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_constituents_follow_the_source():
    """include_constituents: the deepest rows expand to their source rows (an append-only source:
    their order is the order they came in, where the sort leaves ties)."""
    with Services() as s:
        r = Rolled(s, 13)
        src = s.engine.create(TableSpec("app", "append", SCHEMA))
        appended: list[dict] = []

        def append(n: int) -> None:
            rng = r.rng
            t = pa.table({"id": rng.integers(0, 10**6, n), "A": [A_VALUES[i] for i in rng.integers(0, 4, n)],
                          "B": pa.array(rng.integers(0, 3, n), pa.int32()), "V": rng.integers(-4, 4, n) * 0.5,
                          "N": rng.integers(0, 1000, n)}, schema=SCHEMA)
            appended.extend(t.to_pylist())
            s.write(src, t)
            s.cycle()

        append(12)
        rid = r.new_id()
        r.call("Rollup", H.RollupRequest(result_rollup_table_id=_tk(rid), source_table_id=_scope("app"),
                                         aggregations=_aggregations(), group_by_columns=GROUPS,
                                         include_constituents=True))
        sorts = [("V", True), ("A", False), ("B", False)]
        entries = [(2, (a,), EXPAND) for a in A_VALUES] + [(3, (a, b), EXPAND) for a in ("x", None) for b in range(3)]
        vid = r.view(r.apply(rid, sorts=sorts), r.keys(entries))
        sub = r.client.subscribe(_ticket(vid))
        expand = {(d, k): a for d, k, a in entries}
        for cycle in range(15):
            want = reference_rows(appended, expand, sorts, constituents=True)
            assert s.wait_for(sub, lambda x, want=want: _as_tuples(x.table) == want, timeout=10), (
                cycle, _as_tuples(sub.table), want)
            append(int(r.rng.integers(1, 5)))
        # the descriptor names the constituent columns as the source does, after the aggregated ones
        resp = s.call(OBJECT_SERVICE, "FetchObject",
                      O.FetchObjectRequest(source_id={"ticket": _tk(rid), "type": "HierarchicalTable"}), token=r.token)
        schema = pa.ipc.read_schema(pa.py_buffer(H.HierarchicalTableDescriptor.FromString(resp.data).snapshot_schema))
        assert schema.names == [ROW_DEPTH, ROW_EXPANDED, "A", "B", "V", "N", "MaxN", "Cnt", *SCHEMA.names]
        md = [{k.decode(): v.decode() for k, v in (f.metadata or {}).items()} for f in schema]
        assert all(m.get("deephaven:rollupTable.isConstituentNodeColumn") == "true" for m in md[8:])
        assert [m.get("deephaven:rollupTable.isGroupByColumn") for m in md[8:]] == [None, "true", "true", None, None]


def test_released_rollups_and_views_leave_the_engine():
    with Services() as s:
        r = Rolled(s, 11)
        r.tick()
        before = set(s.engine.graph.tables) - {"src"}
        rid = r.rollup()
        sid = r.apply(rid, sorts=[("V", True)])
        vid = r.view(sid)
        assert len(s.engine.graph.tables) > len(before) + 1
        from tickwire.protocol.proto import session_pb2
        for i in (vid, sid, rid):
            s.call("io.deephaven.proto.backplane.grpc.SessionService", "Release",
                   session_pb2.ReleaseRequest(id=_tk(i)), token=r.token)
        assert s.until(lambda: set(s.engine.graph.tables) - {"src"} == set(before))


# -- against Deephaven, through its JS API in headless Chromium ---------------------------------------

BROWSER_TABLE = "rollup_src"
#: the same rows on both servers: A a string with nulls, B an int, V and N numbers with exact sums
BROWSER_SCRIPT = f'''
from deephaven import empty_table
{BROWSER_TABLE} = empty_table(30).update([
    "A = i % 4 == 0 ? `x` : (i % 4 == 1 ? `y` : (i % 4 == 2 ? null : `w`))",
    "B = (int) (i % 3)",
    "V = i * 0.5",
    "N = (long) (i * 7 % 11)",
])
'''


def _browser_data() -> pa.Table:
    i = np.arange(30)
    a = [["x", "y", None, "w"][k % 4] for k in i]
    return pa.table({"A": pa.array(a, pa.string()), "B": pa.array(i % 3, pa.int32()), "V": i * 0.5,
                     "N": pa.array(i * 7 % 11, pa.int64())})


TREE_JS = r"""
(() => {
  const tw = window.__tw;
  if (tw.rollup) return 'already';
  const norm = (v) => (v === null || v === undefined) ? null : (typeof v === 'object' ? String(v.valueOf()) : v);
  tw.tree = null; tw.treeRows = null; tw.treeUpdates = 0; tw.treeSize = null;
  tw.captureTree = (data) => {
    const cols = tw.tree.columns;
    tw.treeRows = data.rows.map(r => [r.depth, r.hasChildren ? r.isExpanded : null, ...cols.map(c => norm(r.get(c)))]);
    tw.treeSize = tw.tree.size;
    tw.treeUpdates += 1;
  };
  tw.rollup = async (config) => {
    tw.tree = await tw.table.rollup(config);
    tw.tree.addEventListener(tw.dh.TreeTable.EVENT_UPDATED, (ev) => {
      try { tw.captureTree(ev.detail); } catch (e) { tw.log.push('tree update: ' + (e.stack || e)); }
    });
    return {columns: tw.tree.columns.map(c => c.name + ':' + c.type), size: tw.tree.size};
  };
  tw.treeState = () => ({rows: tw.treeRows, size: tw.treeSize, updates: tw.treeUpdates, log: tw.log});
  return 'installed';
})()
"""


def _browser_served(request, kind: str):
    """(origin, stop, writer) of a server holding BROWSER_TABLE; `writer(rows)` appends rows to it
    (tickwire's, which is live; None for Deephaven's, which is static)."""
    if kind == "deephaven":
        dh = request.getfixturevalue("deephaven_server")
        cm = dh.tables(BROWSER_SCRIPT)
        cm.__enter__()
        return f"http://127.0.0.1:{dh.port}", lambda: cm.__exit__(None, None, None), None
    from tickwire.server.app import TickwireServer
    from tickwire.server.engine import Engine

    engine = Engine(interval_ms=50)
    table = engine.create(TableSpec(BROWSER_TABLE, "append", _browser_data().schema))
    engine.write(table, _browser_data())
    engine.flush()
    server = TickwireServer(engine, port=0).start()

    def stop() -> None:
        server.stop()
        engine.stop()
    return (f"http://127.0.0.1:{getattr(server, 'web_port', None) or server.port}", stop,
            lambda rows: engine.write(table, rows))


def _tree_rows(request, browser, kind: str, constituents: bool = False) -> dict:
    """What Deephaven's JS API shows of a rollup of BROWSER_TABLE on a `kind` server: the
    default view, then with the row of A == "y" expanded, then sorted by V descending; on
    tickwire, then after two rows more (a new group, and a row of an expanded one). With
    `constituents`, the grid's own default instead (the source rows under the deepest rows, and
    the first value of each column not aggregated otherwise), one of the deepest rows expanded
    too, and no ticking."""
    from tests.browser.jsapi import JsApiPage
    from tests.test_browser import _skip_unless

    _skip_unless(kind)
    origin, stop, writer = _browser_served(request, kind)
    page = browser.new_page()
    try:
        js = JsApiPage(page, origin)
        js.login()
        js.open(BROWSER_TABLE)
        js.call(TREE_JS)
        config = ("{groupingColumns: ['A', 'B'], aggregations: {Sum: ['V'], First: ['N']}, includeConstituents: true}"
                  if constituents else "{groupingColumns: ['A', 'B'], aggregations: {Sum: ['V', 'N'], Count: []}}")
        out: dict = {"info": js.call(f"window.__tw.rollup({config})")}
        js.call("window.__tw.tree.setViewport(0, 40)")

        def rows_when(pred, what):
            end = __import__("time").monotonic() + 60
            while True:
                st = js.call("window.__tw.treeState()")
                if st["rows"] is not None and pred(st):
                    return st
                if __import__("time").monotonic() > end:
                    raise AssertionError(f"{kind}: timed out waiting for {what}: {st}{page.diagnostics()}")
                __import__("time").sleep(0.1)

        out["default"] = rows_when(lambda s: s["size"] == 5 and len(s["rows"]) == 5, "the default rows")["rows"]
        y = next(i for i, r in enumerate(out["default"]) if r[2] == "y")
        js.call(f"window.__tw.tree.expand({y})")
        out["expanded"] = rows_when(lambda s: s["size"] == 8 and len(s["rows"]) == 8, "the expanded rows")["rows"]
        size = 8
        if constituents:  # the first row under y, to its three source rows
            js.call(f"window.__tw.tree.expand({y + 1})")
            size = 11
            out["constituents"] = rows_when(lambda s: s["size"] == size and len(s["rows"]) == size,
                                            "the source rows")["rows"]
        js.call("window.__tw.tree.applySort([window.__tw.tree.findColumn('V').sort().desc()])")
        out["sorted"] = rows_when(lambda s: s["size"] == size and s["rows"][1][4] == max(r[4] for r in s["rows"][1:]
                                                                                          if r[0] == 2),
                                  "the sorted rows")["rows"]
        if writer is not None and not constituents:  # tickwire's table is live: new rows reach the expanded view
            writer(pa.table({"A": pa.array(["y", "v"]), "B": pa.array([2, 0], pa.int32()), "V": [100.0, 1.0],
                             "N": pa.array([1, 2], pa.int64())}))
            out["ticked"] = rows_when(lambda s: s["size"] == 9 and s["rows"][0][6] == "32", "the new rows")["rows"]
        out["exceptions"] = page.exceptions()
        return out
    finally:
        page.close()
        stop()


@pytest.mark.slow
@pytest.mark.interop
def test_the_js_api_shows_the_same_rollup_on_both_servers(request):
    from tests.browser.cdp import launch_chromium
    from tests.interop.dh_server import deephaven_server_available

    why = deephaven_server_available()
    if why:
        pytest.skip(why)
    with launch_chromium() as browser:
        dh = _tree_rows(request, browser, "deephaven")
        tw = _tree_rows(request, browser, "tickwire")
    # what Deephaven shows: the total row expanded, one row per A (as the groups first appeared);
    # expanding A == "y" shows its three B rows; a sort orders every node's children
    assert [r[:3] for r in dh["default"]] == [[1, True, None], [2, False, "x"], [2, False, "y"], [2, False, None],
                                              [2, False, "w"]], dh["default"]
    assert [r[0] for r in dh["expanded"]] == [1, 2, 2, 3, 3, 3, 2, 2], dh["expanded"]
    assert tw["info"] == dh["info"]
    for step in ("default", "expanded", "sorted"):
        assert tw[step] == dh[step], (step, tw[step], dh[step])
    # the live table ticked: the new row of y sits under y, sorted by V; the new group v at its place
    want = [[1, True, None, None, 318.5, "155", "32"], [2, True, "y", None, 160.0, "49", "9"],
            [3, None, "y", 2, 125.5, "17", "4"], [3, None, "y", 1, 19.5, "20", "3"], [3, None, "y", 0, 15, "12", "2"],
            [2, False, "x", None, 56, "36", "8"], [2, False, "w", None, 52.5, "31", "7"],
            [2, False, None, None, 49, "37", "7"], [2, False, "v", None, 1.0, "2", "1"]]
    assert tw["ticked"] == want, tw["ticked"]
    assert not tw["exceptions"] and not dh["exceptions"]


@pytest.mark.slow
@pytest.mark.interop
def test_the_grids_default_rollup_with_constituents_is_the_same_on_both_servers(request):
    """The grid's "Rollup rows" asks for constituents and the first value of every other column."""
    from tests.browser.cdp import launch_chromium
    from tests.interop.dh_server import deephaven_server_available

    why = deephaven_server_available()
    if why:
        pytest.skip(why)
    with launch_chromium() as browser:
        dh = _tree_rows(request, browser, "deephaven", constituents=True)
        tw = _tree_rows(request, browser, "tickwire", constituents=True)
    # three source rows under y / 1, each with its own values; the sort orders them by V too
    assert [r[:4] for r in dh["constituents"][4:7]] == [[4, None, "y", 1]] * 3, dh["constituents"]
    assert [r[4] for r in dh["sorted"] if r[0] == 4] == sorted([r[4] for r in dh["sorted"] if r[0] == 4], reverse=True)
    assert tw["info"] == dh["info"]
    for step in ("default", "expanded", "constituents", "sorted"):
        assert tw[step] == dh[step], (step, tw[step], dh[step])
    assert not tw["exceptions"] and not dh["exceptions"]


@pytest.mark.parametrize("entries", [
    [(1, (), EXPAND_TO_DEPTH_BASE + 1)],                            # the total row and one level below
    [(1, (), EXPAND_ALL), (2, ("y",), CONTRACT)],                  # all but y's rows
    [(1, (), EXPAND_ALL), (2, ("x",), EXPAND)],                    # x expanded alone: nothing changes below
    [(1, (), CONTRACT), (2, ("x",), EXPAND)],                      # under a collapsed row: no effect
    [(2, ("nope",), EXPAND), (2, ("z",), EXPAND), (2, ("z",), CONTRACT)],  # unknown node; the last counts
    [(3, ("x", 1), EXPAND), (2, (None,), EXPAND)],                 # a leaf cannot expand; a null key can
])
def test_each_expansion_action(entries):
    with Services() as s:
        r = Rolled(s, 12)
        for _ in range(6):
            r.tick()
        vid = r.view(r.apply(r.rollup(), sorts=[("A", False), ("B", False)]), r.keys(entries))
        sub = r.client.subscribe(_ticket(vid))
        want = reference_rows(list(r.rows.values()), {(d, k): a for d, k, a in entries})
        assert s.wait_for(sub, lambda x: _as_tuples(x.table) == want, timeout=10), (_as_tuples(sub.table), want)
