"""Deephaven's JavaScript API (dh-core.js, 42.x) run in a page, for tests.

`JsApiPage` loads a page of the server's origin, imports `/jsapi/dh-core.js` from the server and
installs `window.__tw`, a small driver the test calls step by step and polls:

    js = JsApiPage(browser.new_page(), "http://127.0.0.1:10000")
    js.login()                       # {type: 'anonymous'}; js.login(psk="k") for a pre-shared key
    js.open("ticking_keyed")         # connection.getObject({type: 'Table', name})
    js.upload(["A"], ["int"], [[1, 2]])  # connection.newTable(names, types, columns, 'UTC'): a DoPut
    js.viewport(0, 99)               # table.setViewport(first, last); listens to dh.Table.EVENT_UPDATED
    js.wait_rows(lambda s: ...)      # polls the rows of the latest update
    js.rows()                        # {'offset', 'columns', 'rows', 'updates', 'size'}
    js.sort_viewport("Price", True, 0, 49)   # applySort + setViewport, as the grid sorts; waits for sorted rows
    js.settle("window.__tw.table.rollup({groupingColumns: ['Sym']})")  # how a promise of the API settles

Values come back as JSON: numbers as numbers, strings as strings, booleans as booleans, and the
API's LongWrapper / DateWrapper (Java long, Instant) as the decimal string of the long (nanoseconds
for instants), which is what their valueOf() returns. `normalize_arrow` turns DoGet results into
the same form so rows can be compared as sets of tuples.

The names used (CoreClient, login, getAsIdeConnection, getObject, setViewport, getViewportData,
newTable, Table.EVENT_UPDATED, Table.EVENT_SORTCHANGED, Table.EVENT_REQUEST_FAILED, findColumn,
Column.sort().asc()/desc(), applySort, ViewportData.rows/offset, Row.get(column), close,
disconnect) are the public JS API of Deephaven 42.x (web/client-api in deephaven-core).
"""
from __future__ import annotations

import json
from typing import Any, Callable, Optional

import pyarrow as pa

from .cdp import Page

PSK_TYPE = "io.deephaven.authentication.psk.PskAuthenticationHandler"

DRIVER_JS = r"""
(() => {
  if (window.__tw) return 'already';
  const tw = window.__tw = {
    state: 'new', error: null, updates: 0, offset: null, columns: null, rows: null, size: null,
    log: [], dh: null, client: null, cn: null, table: null,
  };
  const norm = (v) => {
    if (v === null || v === undefined) return null;
    if (typeof v === 'object') return String(v.valueOf());  // LongWrapper, DateWrapper, BigDecimal...
    return v;
  };
  const fail = (where, e) => {
    tw.error = where + ': ' + (e && (e.stack || e.message) ? (e.stack || e.message) : String(e));
    tw.log.push(tw.error);
    throw e;
  };
  const withTimeout = (p, ms, what) => Promise.race([
    p, new Promise((_, rej) => setTimeout(() => rej(new Error(what + ' timed out after ' + ms + ' ms')), ms))]);

  tw.load = async () => {
    try {
      tw.dh = (await import('/jsapi/dh-core.js')).default;
      tw.state = 'loaded';
      return Object.keys(tw.dh).length;
    } catch (e) { fail('import /jsapi/dh-core.js', e); }
  };
  tw.login = async (creds, ms) => {
    try {
      tw.client = new tw.dh.CoreClient(window.location.protocol + '//' + window.location.host);
      await withTimeout(tw.client.login(creds), ms || 30000, 'login');
      tw.state = 'logged-in';
      tw.cn = await withTimeout(tw.client.getAsIdeConnection(), ms || 30000, 'getAsIdeConnection');
      tw.state = 'connected';
      return true;
    } catch (e) { tw.state = 'login-failed'; fail('login', e); }
  };
  tw.capture = (data) => {
    const cols = tw.table.columns;
    tw.offset = data.offset;
    tw.columns = cols.map(c => c.name);
    tw.rows = data.rows.map(r => cols.map(c => norm(r.get(c))));
    tw.size = tw.table.size;
    tw.updates += 1;
  };
  tw.open = async (name) => {
    try {
      tw.table = await tw.cn.getObject({type: 'Table', name});
      tw.table.addEventListener(tw.dh.Table.EVENT_UPDATED, (ev) => {
        try { tw.capture(ev.detail); } catch (e) { tw.log.push('update: ' + (e.stack || e)); }
      });
      tw.state = 'open';
      return {columns: tw.table.columns.map(c => c.name + ':' + c.type), size: tw.table.size};
    } catch (e) { fail('open ' + name, e); }
  };
  tw.upload = async (names, types, data) => {  // connection.newTable: an upload (DoPut) from the page
    try {
      tw.table = await tw.cn.newTable(names, types, data, 'UTC');
      tw.table.addEventListener(tw.dh.Table.EVENT_UPDATED, (ev) => {
        try { tw.capture(ev.detail); } catch (e) { tw.log.push('update: ' + (e.stack || e)); }
      });
      tw.state = 'open';
      return {columns: tw.table.columns.map(c => c.name + ':' + c.type), size: tw.table.size};
    } catch (e) { fail('newTable', e); }
  };
  tw.viewport = (first, last) => {
    try { tw.table.setViewport(first, last); return true; } catch (e) { fail('setViewport', e); }
  };
  tw.refresh = async () => {  // the viewport data now, by getViewportData()
    try { tw.capture(await tw.table.getViewportData()); return tw.updates; } catch (e) { fail('getViewportData', e); }
  };
  tw.settle = async (thunk, ms) => {  // how the promise `thunk()` returns settles, within ms
    const t0 = performance.now();
    const late = {};
    try {
      const value = await Promise.race([thunk(), new Promise((res) => setTimeout(() => res(late), ms))]);
      if (value === late) return {state: 'pending', ms: ms};
      return {state: 'resolved', ms: Math.round(performance.now() - t0)};
    } catch (e) {
      return {state: 'rejected', message: String(e && e.message !== undefined ? e.message : e),
              ms: Math.round(performance.now() - t0)};
    }
  };
  const ordered = (values, asc) => values.every((v, i) => i === 0 || (() => {
    const a = values[i - 1] === null ? -Infinity : Number(values[i - 1]);
    const b = v === null ? -Infinity : Number(v);
    return asc ? a <= b : a >= b;
  })());
  // As the grid sorts: applySort, then setViewport; settles once the sort is applied on the server
  // (EVENT_SORTCHANGED) and an update of the viewport holds rows sorted that way. Never throws:
  // {state: 'sorted', values, size} or {state: 'failed' | 'timeout', message}.
  tw.sortViewport = (column, asc, first, last, ms) => new Promise((resolve) => {
    const t = tw.table;
    const col = t.findColumn(column);
    let applied = false;
    const done = (out) => {
      clearTimeout(timer);
      t.removeEventListener(tw.dh.Table.EVENT_SORTCHANGED, onSort);
      t.removeEventListener(tw.dh.Table.EVENT_UPDATED, onUpdate);
      t.removeEventListener(tw.dh.Table.EVENT_REQUEST_FAILED, onFail);
      resolve(out);
    };
    const timer = setTimeout(() => done({state: 'timeout', message: (applied ? 'sorted, but no sorted rows'
                                                                              : 'the sort was never applied')
                                                                     + ' within ' + ms + ' ms'}), ms);
    const onSort = () => { applied = true; };
    const onUpdate = (ev) => {
      const rows = ev.detail.rows;
      const values = rows.map(r => norm(r.get(col)));
      if (applied && rows.length > 0 && ordered(values, asc)) done({state: 'sorted', values, size: t.size});
    };
    const onFail = (ev) => done({state: 'failed', message: String(ev.detail)});
    t.addEventListener(tw.dh.Table.EVENT_SORTCHANGED, onSort);
    t.addEventListener(tw.dh.Table.EVENT_UPDATED, onUpdate);
    t.addEventListener(tw.dh.Table.EVENT_REQUEST_FAILED, onFail);
    try {
      t.applySort([asc ? col.sort().asc() : col.sort().desc()]);
      t.setViewport(first, last);
    } catch (e) { done({state: 'failed', message: String(e && e.stack || e)}); }
  });
  tw.snapshot = () => ({offset: tw.offset, columns: tw.columns, rows: tw.rows, updates: tw.updates,
                        size: tw.size, state: tw.state, error: tw.error});
  tw.closeTable = () => { if (tw.table) { tw.table.close(); tw.table = null; } return true; };
  tw.disconnect = () => { if (tw.client) { tw.client.disconnect(); tw.client = null; } return true; };
  return 'installed';
})()
"""


class JsApiPage:
    """A page of `origin` running Deephaven's JS API through `window.__tw`."""

    def __init__(self, page: Page, origin: str, *, path: str = "/js-plugins/manifest.json"):
        self.page = page
        self.origin = origin.rstrip("/")
        page.navigate(self.origin + path)
        page.evaluate(DRIVER_JS)
        page.evaluate("window.__tw.load()", timeout=60)

    def call(self, js: str, timeout: float = 60.0) -> Any:
        return self.page.evaluate(js, timeout=timeout)

    def login(self, psk: Optional[str] = None, timeout_ms: int = 30000) -> None:
        creds = {"type": "anonymous"} if psk is None else {"type": PSK_TYPE, "token": psk}
        self.call(f"window.__tw.login({json.dumps(creds)}, {int(timeout_ms)})", timeout=timeout_ms / 1000 + 30)

    def open(self, name: str) -> dict:
        return self.call(f"window.__tw.open({json.dumps(name)})")

    def upload(self, names: list[str], types: list[str], columns: list[list]) -> dict:
        return self.call(f"window.__tw.upload({json.dumps(names)}, {json.dumps(types)}, {json.dumps(columns)})")

    def viewport(self, first: int, last: int) -> None:
        self.call(f"window.__tw.viewport({int(first)}, {int(last)})")

    def rows(self) -> dict:
        return self.call("window.__tw.snapshot()")

    def sort_viewport(self, column: str, ascending: bool, first: int, last: int, timeout_ms: int = 30000) -> dict:
        """Sorts the open table by `column` and sets the viewport, as the grid does on a click on a
        column's header; returns once the viewport's rows come sorted: {'state': 'sorted',
        'values' (the column in the viewport), 'size'}, else {'state': 'failed' | 'timeout', 'message'}."""
        return self.call(f"window.__tw.sortViewport({json.dumps(column)}, {json.dumps(bool(ascending))}, "
                         f"{int(first)}, {int(last)}, {int(timeout_ms)})", timeout=timeout_ms / 1000 + 30)

    def settle(self, promise_js: str, timeout_ms: int = 30000) -> dict:
        """How the promise of `promise_js` (an expression of the page) settles within `timeout_ms`:
        {'state': 'resolved' | 'rejected' | 'pending', 'message' (rejected), 'ms'}."""
        return self.call(f"window.__tw.settle(() => ({promise_js}), {int(timeout_ms)})", timeout=timeout_ms / 1000 + 30)

    def wait_rows(self, ok: Callable[[dict], bool], *, timeout: float = 30.0, what: str = "viewport rows",
                  interval: float = 0.1) -> dict:
        """Polls the latest update until `ok(snapshot)`; AssertionError with diagnostics on timeout."""
        import time

        end = time.monotonic() + timeout
        while True:
            snap = self.rows()
            if snap.get("rows") is not None and ok(snap):
                return snap
            if time.monotonic() > end:
                brief = {k: (v if k != "rows" else (None if v is None else f"{len(v)} rows")) for k, v in snap.items()}
                raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last {brief}"
                                     f"{self.page.diagnostics()}")
            time.sleep(interval)


def _norm_column(col: pa.ChunkedArray) -> list:
    t = col.type
    if pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_time64(t) or pa.types.is_duration(t):
        return [None if v is None else str(v) for v in col.cast(pa.int64()).to_pylist()]
    if pa.types.is_int64(t) or pa.types.is_uint64(t):
        return [None if v is None else str(v) for v in col.to_pylist()]
    return col.to_pylist()


def normalize_arrow(table: pa.Table, columns: Optional[list[str]] = None) -> list[tuple]:
    """The rows of `table` (in `columns` order) as tuples of the values the JS driver reports."""
    names = columns or table.column_names
    cols = [_norm_column(table.column(n)) for n in names]
    return list(zip(*cols)) if cols else []


def normalize_js(rows: list[list]) -> list[tuple]:
    return [tuple(r) for r in rows]
