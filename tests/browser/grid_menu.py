"""What Deephaven's grid asks of the JS API from its menus, run in a page for tests.

`install(js)` adds `window.__menu` to a page of `jsapi.JsApiPage` (logged in). Each call opens the
named table afresh (`connection.getObject`), does what the grid does, closes what it opened and
returns JSON (values as `jsapi` reports them: Java longs as decimal strings), or `{error: message}`
when a promise of the API rejects or a table reports a failed request; none waits longer than the
`ms` it is given.

    totals(name, config, filterJs)     table.getTotalsTable(config) (and getGrandTotalsTable when a
                                       filter is applied first), its viewport read back
    distinct(name, columns)            table.selectDistinct(columns)
    freezeAsCsv(name, sortJs, filterJs) the CSV download: sort and filter, freeze(), setViewport(0, 0),
                                       then subscription.snapshot(all rows, columns) of the frozen table
    seek(name, cases)                  table.seekRow(start, column, valueType, value, insensitive,
                                       contains, backwards) for each case, as "go to row" asks
    stats(name, column)                table.getColumnStatistics(column): statistics, unique values
    filtered(name, column, makeJs)     applyFilter([makeJs(column, dh.FilterValue)]) and the viewport
    rollup(name, config, column, value) table.rollup(config), its rows, then expand(the first row
                                       whose `column` is `value`) and its rows again
    tickingTotals(name, config, n)     the first n updates of a totals table of a ticking table
    frozenWhileTicking(name)           freeze() of a ticking table read before and after its source grows

The methods used are Deephaven 42.x's JS API (web/client-api): getTotalsTable, getGrandTotalsTable,
TotalsTable.setViewport/getViewportData/close, selectDistinct, freeze, applySort, applyFilter,
setViewport(...).snapshot, RangeSet.ofRange, seekRow, ValueType, getColumnStatistics
(statisticsMap, uniqueValues, getType), Column.filter() and FilterValue, Table.EVENT_*,
rollup, TreeTable.expand/EVENT_UPDATED and TreeRow.depth/hasChildren/isExpanded. The grid's own
calls were read from its bundle (iris-grid's IrisGridTableModel, TableCsvExporter, TableSaver and
jsapi-utils' TableUtils.makeQuickTextFilter).
"""
from __future__ import annotations

import json
from typing import Any

from .jsapi import JsApiPage

MENU_JS = r"""
(() => {
  if (window.__menu) return 'already';
  const tw = window.__tw;
  const m = window.__menu = {};
  const norm = (v) => {
    if (v === null || v === undefined) return null;
    if (typeof v === 'object') return String(v.valueOf());  // LongWrapper, DateWrapper
    return v;
  };
  const message = (e) => String(e && e.message !== undefined ? e.message
                                 : (e && e.detail !== undefined ? e.detail : e));
  const within = (p, ms, what) => {
    let timer;
    return Promise.race([p, new Promise((_, rej) => {
      timer = setTimeout(() => rej(new Error(what + ' did not settle within ' + ms + ' ms')), ms);
    })]).finally(() => clearTimeout(timer));
  };
  const closing = [];
  const keep = (x) => { closing.push(x); return x; };
  // runs fn, closes what it opened, turns a rejection into {error}
  const guarded = async (fn) => {
    closing.length = 0;
    try { return await fn(); } catch (e) { return {error: message(e)}; } finally {
      for (const x of closing.splice(0)) { try { x.close(); } catch (e) { /* already closed */ } }
    }
  };
  const open = async (name, ms) => keep(await within(tw.cn.getObject({type: 'Table', name}), ms, 'getObject ' + name));
  const columns = (t) => t.columns.map(c => c.name + ':' + c.type);
  const rowsOf = (t, data) => data.rows.map(r => t.columns.map(c => norm(r.get(c))));
  // the viewport first..last of t (a Table or TotalsTable), once the server has sent it
  const read = async (t, first, last, ms) => {
    t.setViewport(first, last);
    const data = await within(t.getViewportData(), ms, 'getViewportData');
    return {columns: columns(t), size: t.size, offset: data.offset, rows: rowsOf(t, data)};
  };
  // applies a sort and/or filters as the grid does and settles once the server has applied them
  // (EVENT_SORTCHANGED / EVENT_FILTERCHANGED), or rejects with the failed request's message
  const apply = (t, sort, filters, ms) => new Promise((resolve, reject) => {
    const D = tw.dh.Table;
    const want = new Set([...(sort ? [D.EVENT_SORTCHANGED] : []), ...(filters ? [D.EVENT_FILTERCHANGED] : [])]);
    const handlers = new Map([...want].map(type => [type, () => {
      want.delete(type);
      if (want.size === 0) done(null);
    }]));
    const failed = (ev) => done(new Error('request failed: ' + message(ev.detail)));
    const timer = setTimeout(() => done(new Error('the sort/filter was not applied within ' + ms + ' ms')), ms);
    const done = (err) => {
      clearTimeout(timer);
      for (const [type, on] of handlers) t.removeEventListener(type, on);
      t.removeEventListener(D.EVENT_REQUEST_FAILED, failed);
      if (err) reject(err); else resolve(true);
    };
    for (const [type, on] of handlers) t.addEventListener(type, on);
    t.addEventListener(D.EVENT_REQUEST_FAILED, failed);
    if (want.size === 0) { done(null); return; }
    try {
      if (sort) t.applySort(sort(t));
      if (filters) t.applyFilter(filters(t, tw.dh.FilterValue));
      t.setViewport(0, 0);
    } catch (e) { done(e); }
  });
  // resolves with the first event of `type` on `target` for which `ok(event)` holds
  const nextEvent = (target, type, ok, ms, what) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      target.removeEventListener(type, on);
      reject(new Error(what + ' within ' + ms + ' ms'));
    }, ms);
    const on = (ev) => {
      let hit = false;
      try { hit = ok(ev); } catch (e) { hit = false; }
      if (hit) { clearTimeout(timer); target.removeEventListener(type, on); resolve(ev); }
    };
    target.addEventListener(type, on);
  });

  m.totals = (name, config, filters, ms) => guarded(async () => {
    const t = await open(name, ms);
    if (filters) await apply(t, null, filters, ms);
    const totals = keep(await within(t.getTotalsTable(config), ms, 'getTotalsTable'));
    const out = {totals: await read(totals, 0, 99, ms)};
    if (filters) {
      const grand = keep(await within(t.getGrandTotalsTable(config), ms, 'getGrandTotalsTable'));
      out.grand = await read(grand, 0, 99, ms);
    }
    return out;
  });
  m.distinct = (name, cols, ms) => guarded(async () => {
    const t = await open(name, ms);
    const d = keep(await within(t.selectDistinct(t.findColumns(cols)), ms, 'selectDistinct'));
    return read(d, 0, 999, ms);
  });
  m.freezeAsCsv = (name, sort, filters, ms) => guarded(async () => {
    const t = await open(name, ms);
    await apply(t, sort, filters, ms);
    const frozen = keep(await within(t.freeze(), ms, 'freeze'));
    const sub = keep(frozen.setViewport(0, 0));
    await within(sub.getViewportData(), ms, 'the frozen viewport');
    const size = frozen.size;
    const snap = await within(sub.snapshot(tw.dh.RangeSet.ofRange(0, size - 1), frozen.columns), ms, 'snapshot');
    return {columns: columns(frozen), size, rows: rowsOf(frozen, snap)};
  });
  m.seek = (name, cases, ms) => guarded(async () => {
    const t = await open(name, ms);
    const out = [];
    for (const [start, column, valueType, value, insensitive, contains, backwards] of cases) {
      try {
        out.push(await within(t.seekRow(start, t.findColumn(column), tw.dh.ValueType[valueType], value,
                                        insensitive, contains, backwards), ms, 'seekRow'));
      } catch (e) { out.push({error: message(e)}); }
    }
    return out;
  });
  m.stats = (name, column, ms) => guarded(async () => {
    const t = await open(name, ms);
    const s = await within(t.getColumnStatistics(t.findColumn(column)), ms, 'getColumnStatistics');
    const stats = {}, types = {}, unique = {};
    for (const [k, v] of s.statisticsMap) { stats[k] = norm(v); types[k] = s.getType(k); }
    for (const [k, v] of s.uniqueValues) unique[k] = v;
    return {stats, types, unique};
  });
  m.filtered = (name, column, make, ms) => guarded(async () => {
    const t = await open(name, ms);
    await apply(t, null, (tt, F) => [make(tt.findColumn(column), F)], ms);
    return read(t, 0, 999, ms);
  });
  const treeRows = (rt, data) => data.rows.map(r => [r.depth, r.hasChildren, r.isExpanded,
                                                     ...rt.columns.map(c => norm(r.get(c)))]);
  m.rollup = (name, config, column, value, ms) => guarded(async () => {
    const t = await open(name, ms);
    const rt = keep(await within(t.rollup(config), ms, 'rollup'));
    rt.setViewport(0, 999);
    const before = await within(rt.getViewportData(), ms, 'the rollup viewport');
    const rows = treeRows(rt, before);
    const at = rt.columns.findIndex(c => c.name === column);
    const index = rows.findIndex(r => r[1] && !r[2] && r[3 + at] === value);
    if (index < 0) {
      return {columns: columns(rt), size: rt.size, rows, error: 'no collapsed row with ' + column + ' = ' + value};
    }
    const sizeBefore = rt.size;
    const grown = nextEvent(rt, tw.dh.TreeTable.EVENT_UPDATED, () => rt.size > sizeBefore, ms,
                            'the rollup did not grow after expand(' + index + ')');
    rt.expand(index);
    await grown;
    const after = await within(rt.getViewportData(), ms, 'the expanded rollup viewport');
    return {columns: columns(rt), grouped: rt.groupedColumns.map(c => c.name),
            aggregated: rt.aggregatedColumns.map(c => c.name), size: sizeBefore, rows,
            expanded: index, expandedSize: rt.size, expandedRows: treeRows(rt, after)};
  });
  m.tickingTotals = (name, config, n, ms) => guarded(async () => {
    const t = await open(name, ms);
    const totals = keep(await within(t.getTotalsTable(config), ms, 'getTotalsTable'));
    const seen = [];
    const enough = nextEvent(totals, tw.dh.Table.EVENT_UPDATED, (ev) => {
      const rows = rowsOf(totals, ev.detail);
      const key = JSON.stringify(rows);
      if (seen.length === 0 || seen[seen.length - 1].key !== key) seen.push({key, rows});
      return seen.length >= n;
    }, ms, 'fewer than ' + n + ' different totals');
    totals.setViewport(0, 0);
    await enough;
    return {columns: columns(totals), updates: seen.map(s => s.rows)};
  });
  m.frozenWhileTicking = (name, ms) => guarded(async () => {
    const t = await open(name, ms);
    const frozen = keep(await within(t.freeze(), ms, 'freeze'));
    const first = await read(frozen, 0, 99999, ms);
    // the source grows past what was frozen (its viewport's updates carry its size)
    const grew = nextEvent(t, tw.dh.Table.EVENT_UPDATED, () => t.size > first.size, ms,
                           'the source did not grow past ' + first.size + ' rows');
    t.setViewport(0, 0);
    await grew;
    const sourceSize = t.size;
    const again = await read(frozen, 0, 99999, ms);
    return {first, again, sourceSize};
  });
  return 'installed';
})()
"""


class GridMenu:
    """`window.__menu` in a logged-in JsApiPage; each method returns what the page returned."""

    def __init__(self, js: JsApiPage, timeout_ms: int = 30000):
        self.js = js
        self.ms = int(timeout_ms)
        js.call(MENU_JS)

    def _run(self, method: str, *args: Any, js: tuple[str, ...] = ()) -> Any:
        """`window.__menu[method](args..., js..., ms)`: `args` go in as JSON, `js` as JavaScript
        source (functions that build a sort or filters)."""
        parts = [json.dumps(a) for a in args] + list(js)
        return self.js.call(f"window.__menu.{method}({', '.join(parts)}, {self.ms})", timeout=self.ms / 1000 * 4 + 30)

    def totals(self, name: str, config: dict, filters_js: str = "null") -> dict:
        return self._run("totals", name, config, js=(filters_js,))

    def distinct(self, name: str, columns: list[str]) -> dict:
        return self._run("distinct", name, columns)

    def freeze_as_csv(self, name: str, sort_js: str = "null", filters_js: str = "null") -> dict:
        return self._run("freezeAsCsv", name, js=(sort_js, filters_js))

    def seek(self, name: str, cases: list[list]) -> Any:
        return self._run("seek", name, cases)

    def stats(self, name: str, column: str) -> dict:
        return self._run("stats", name, column)

    def filtered(self, name: str, column: str, make_js: str) -> dict:
        return self._run("filtered", name, column, js=(make_js,))

    def rollup(self, name: str, config: dict, column: str, value: Any) -> dict:
        return self._run("rollup", name, config, column, value)

    def ticking_totals(self, name: str, config: dict, updates: int) -> dict:
        return self._run("tickingTotals", name, config, updates)

    def frozen_while_ticking(self, name: str) -> dict:
        return self._run("frozenWhileTicking", name)
