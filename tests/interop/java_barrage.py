"""Deephaven's real Java Barrage client against any Barrage server (tickwire or Deephaven).

    results = run_java_client("127.0.0.1:10000", ["static_mixed", "ticking_keyed"])
    results[("static_mixed", "full")].table   # pyarrow.Table the client held at the end

The client runs in a subprocess (`_java_client_main.py`): an embedded Deephaven JVM (PyPI
`deephaven-server`, which bundles the Java client jars) drives `io.deephaven.client.impl.
BarrageSession` through jpy. Modes:

- "full": `subscribe(...).entireTable()`; the table is the whole subscribed table.
- "viewport": `subscribe(...).partialTable(rows first..last, all columns)`; the viewport rows.
- "snapshot": `snapshot(...).entireTable()` (a BarrageSnapshotRequest); the snapshot.

`specs` (optional) are multi-step table specs, each {"name", "table", "where": [filters], "sort":
[columns], "tail": rows or None}: the client's `Session.execute(TableSpec.ticket(...).where(...)
.sort(...).tail(...))` (one Batch, intermediate steps unexported), then a snapshot of the handle;
reported as results[(name, "spec")].

Subscriptions are all opened at once and read `seconds` after the last of them is open (a ticking
table's full subscription with no update by then waits for its first, up to 30 s); snapshots are
taken after that.
Tables travel back as Arrow IPC files, the rest as JSON.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from .dh_server import HERE, deephaven_server_available, kill_process_tree, tail

CLIENT_MAIN = HERE / "_java_client_main.py"
MODES = ("full", "viewport", "snapshot")


@dataclass
class JavaResult:
    """What the Java client ended with for one (table, mode).

    `table` is None when `error` is set. Times: `request_wall`/`read_wall`/`last_update_wall`
    are time.time() values (when the request was sent, when the client's table was copied, when
    its last update after the initial snapshot was seen); `complete_s` is seconds from the request
    until the subscription/snapshot future completed (the initial snapshot arrived)."""

    table_name: str
    mode: str
    table: pa.Table | None = None
    error: str | None = None
    refreshing: bool | None = None
    columns: list[str] | None = None
    request_wall: float | None = None
    complete_s: float | None = None
    read_wall: float | None = None
    updates: int = 0
    last_update_wall: float | None = None
    extra: dict = field(default_factory=dict)

    @property
    def size(self) -> int | None:
        return None if self.table is None else self.table.num_rows

    @property
    def ok(self) -> bool:
        return self.error is None and self.table is not None


class JavaClientUnavailable(RuntimeError):
    """java or the deephaven_server package is missing."""


def java_client_available() -> str | None:
    """None when the Java client can run here, else why not."""
    return deephaven_server_available()


def run_java_client(
    target: str,
    tables: list[str],
    modes=MODES,
    seconds: float = 3.0,
    viewport=(0, 9),
    auth: str | None = None,
    timeout: float = 180,
    *,
    reverse_viewport: bool = False,
    use_deephaven_nulls: bool = True,
    update_interval_ms: int | None = None,
    heap: str = "1g",
    specs: list[dict] | None = None,
) -> dict[tuple[str, str], JavaResult]:
    """Runs the Java Barrage client against `target` ("host:port") for every table x mode.

    `auth` None = Anonymous; a string = the pre-shared key (sent as
    `io.deephaven.authentication.psk.PskAuthenticationHandler <key>`). `viewport` is (first, last)
    row positions, inclusive. By default the client's update graph cycles every 1000 ms and the
    server's default minimum update interval applies, so a ticking table's state lags the server
    by up to about two seconds; `update_interval_ms` sets both the client cycle
    (PeriodicUpdateGraph.targetCycleDurationMillis) and the subscriptions' minUpdateIntervalMs.
    The subprocess is killed after `timeout` seconds; failures are
    reported per result in `.error` (with the subprocess's output tail), never raised, except
    JavaClientUnavailable when the client cannot run at all."""
    why = java_client_available()
    if why:
        raise JavaClientUnavailable(why)
    modes = tuple(modes)
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown modes {bad}; expected some of {MODES}")
    specs = list(specs or [])
    if not tables and not specs:
        return {}
    first, last = (int(v) for v in viewport)
    if first < 0 or last < first:
        raise ValueError(f"bad viewport {viewport!r}: need 0 <= first <= last")

    work = Path(tempfile.mkdtemp(prefix="java_barrage_"))
    out_dir = work / "out"
    out_dir.mkdir()
    cfg = {
        "target": target,
        "tables": list(tables),
        "modes": list(modes),
        "seconds": float(seconds),
        "viewport": [first, last],
        "reverse_viewport": bool(reverse_viewport),
        "auth": auth,
        "use_deephaven_nulls": bool(use_deephaven_nulls),
        "update_interval_ms": None if update_interval_ms is None else int(update_interval_ms),
        "future_timeout": max(5.0, min(60.0, timeout / 2)),
        "heap": heap,
        "specs": specs,
        "out_dir": str(out_dir),
        "work_dir": str(work / "jvm"),
    }
    cfg_path = work / "config.json"
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    log_path = work / "client.log"
    failure = None
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, str(CLIENT_MAIN), str(cfg_path)],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=work,
                start_new_session=True,
            )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            failure = f"Java client timed out after {timeout:.0f} s"
        finally:
            if proc.stdin:
                proc.stdin.close()
            kill_process_tree(proc, grace=2.0)
        if failure is None and proc.returncode != 0:
            failure = f"Java client exited with code {proc.returncode}"
        elapsed = time.monotonic() - started
        return _collect(tables, modes, out_dir, log_path, failure, elapsed, [s["name"] for s in specs])
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _collect(tables, modes, out_dir: Path, log_path: Path, failure: str | None, elapsed: float,
             spec_names=()):
    results_path = out_dir / "results.json"
    log = tail(log_path)
    if results_path.exists():
        doc = json.loads(results_path.read_text(encoding="utf-8"))
    else:
        doc = {"jobs": [], "session_error": None}
        failure = failure or "Java client wrote no results"
    by_key = {(j["table"], j["mode"]): j for j in doc["jobs"]}
    out: dict[tuple[str, str], JavaResult] = {}
    keys = [(name, mode) for name in tables for mode in modes] + [(name, "spec") for name in spec_names]
    for name, mode in keys:
        meta = by_key.get((name, mode))
        res = JavaResult(table_name=name, mode=mode)
        res.extra = {"elapsed_s": elapsed, "session_s": doc.get("session_s"), "log": log}
        if meta is None:
            res.error = f"{failure or 'no result'}\n--- client output ---\n{log}"
            out[(name, mode)] = res
            continue
        for key in ("refreshing", "columns", "request_wall", "complete_s", "read_wall",
                    "last_update_wall"):
            setattr(res, key, meta.get(key))
        res.updates = int(meta.get("updates") or 0)
        if meta.get("error"):
            res.error = f"{meta['error']}\n--- client output ---\n{log}"
        elif meta.get("file"):
            data = (out_dir / meta["file"]).read_bytes()
            res.table = pa.ipc.open_file(pa.BufferReader(data)).read_all()
        else:
            res.error = f"{failure or 'no table written'}\n--- client output ---\n{log}"
        out[(name, mode)] = res
    return out
