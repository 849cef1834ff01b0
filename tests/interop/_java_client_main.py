"""Subprocess entry point: Deephaven's Java Barrage client (io.deephaven.client.impl.BarrageSession)
driven through jpy inside an embedded Deephaven JVM, against any Barrage server.

Usage: python _java_client_main.py CONFIG.json

CONFIG holds `target` ("host:port"), `tables`, `modes` (of "full", "viewport", "snapshot"),
`seconds`, `viewport` ([first, last] row positions, inclusive), `reverse_viewport`, `auth`
(None = Anonymous, else a pre-shared key), `use_deephaven_nulls`, `update_interval_ms` (None =
defaults; else the client update graph's cycle and the subscriptions' minUpdateIntervalMs),
`future_timeout`, `heap`,
`out_dir` and `work_dir`; optionally `specs`, a list of {"name", "table", "where": [filters],
"sort": [columns], "tail": rows or null}: each is built as one multi-step `TableSpec`
(`TableSpec.ticket(s/<table>).where(...).sort(...).tail(...)`), run with the client session's
`execute(spec)` (one Batch whose intermediate steps are not exported) and the resulting handle
is snapshotted; its result is reported as (name, "spec").

All subscriptions (full and viewport, every table) are opened together; `seconds` after all of
them have completed and have their update listeners attached (and, for a full subscription of a
table that the server reports as ticking, once it has seen at least one update, waiting at most
FIRST_UPDATE_CAP_S from then) each one's table is copied (a consistent snapshot inside the
client's update graph) and written to `out_dir` as an Arrow IPC file; then the Barrage snapshots
are taken. Per (table, mode) metadata goes to `out_dir/results.json`, rewritten (atomically)
after each phase so that a run killed later still reports what finished; the process exits with
status 0 after the last write.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback

from _dh_server_main import _exit_when_parent_goes, _jvm_args

PSK_HANDLER = "io.deephaven.authentication.psk.PskAuthenticationHandler"


#: how long (from the start of the observation window) a full subscription of a ticking table
#: may wait for its first update
FIRST_UPDATE_CAP_S = 30.0


def _server_says_ticking(session, spec) -> bool:
    """Whether the server reports the table `spec` as refreshing (its ExportedTableCreationResponse
    is not static); False when that cannot be found out."""
    handle = None
    try:
        handle = session.j_session.execute(spec)
        if not handle.isSuccessful():
            return False
        return not bool(handle.response().getIsStatic())
    except BaseException:  # noqa: BLE001 - only decides whether to wait longer
        return False
    finally:
        if handle is not None:
            try:
                handle.close()
            except BaseException:  # noqa: BLE001
                pass


def _error_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-8000:]


class _Job:
    """One (table, mode) request and what became of it."""

    def __init__(self, table: str, mode: str):
        self.table = table
        self.mode = mode
        self.error: str | None = None
        self.future = None
        self.j_table = None
        self.listener = None
        self.updates = 0
        self.last_update_wall: float | None = None
        self.request_wall: float | None = None
        self.complete_s: float | None = None
        self.read_wall: float | None = None
        self.size: int | None = None
        self.refreshing: bool | None = None
        self.columns: list[str] | None = None
        self.file: str | None = None

    def on_update(self, update, is_replay) -> None:
        self.updates += 1
        self.last_update_wall = time.time()

    def meta(self) -> dict:
        return {
            "table": self.table,
            "mode": self.mode,
            "error": self.error,
            "file": self.file,
            "size": self.size,
            "refreshing": self.refreshing,
            "columns": self.columns,
            "request_wall": self.request_wall,
            "complete_s": self.complete_s,
            "read_wall": self.read_wall,
            "updates": self.updates,
            "last_update_wall": self.last_update_wall,
        }


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    threading.Thread(target=_exit_when_parent_goes, name="parent-watch", daemon=True).start()
    out_dir = cfg["out_dir"]

    from deephaven_server import Server

    interval = cfg.get("update_interval_ms")
    jvm_cfg = {"work_dir": cfg["work_dir"], "heap": cfg.get("heap", "1g"), "extra_jvm_args": []}
    if interval is not None:
        jvm_cfg["extra_jvm_args"].append(f"-DPeriodicUpdateGraph.targetCycleDurationMillis={int(interval)}")
    local = Server(host="127.0.0.1", port=0, jvm_args=_jvm_args(jvm_cfg))
    local.start()

    import jpy
    import pyarrow as pa
    from deephaven.arrow import to_arrow
    from deephaven.barrage import barrage_session
    from deephaven.table import Table
    from deephaven.table_listener import listen

    j_table_spec = jpy.get_type("io.deephaven.qst.table.TableSpec")
    j_sub_options = jpy.get_type("io.deephaven.extensions.barrage.BarrageSubscriptionOptions")
    j_snap_options = jpy.get_type("io.deephaven.extensions.barrage.BarrageSnapshotOptions")
    j_rowset_factory = jpy.get_type("io.deephaven.engine.rowset.RowSetFactory")
    j_time_unit = jpy.get_type("java.util.concurrent.TimeUnit")

    dh_nulls = bool(cfg.get("use_deephaven_nulls", True))
    sub_builder = j_sub_options.builder().useDeephavenNulls(dh_nulls)
    if interval is not None:
        sub_builder = sub_builder.minUpdateIntervalMs(int(interval))
    sub_options = sub_builder.build()
    snap_options = j_snap_options.builder().useDeephavenNulls(dh_nulls).build()
    future_timeout = float(cfg.get("future_timeout", 60.0))
    first, last = (int(v) for v in cfg["viewport"])
    reverse = bool(cfg.get("reverse_viewport", False))

    jobs = [_Job(t, m) for t in cfg["tables"] for m in cfg["modes"]]
    specs = list(cfg.get("specs") or [])
    spec_jobs = [_Job(spec["name"], "spec") for spec in specs]
    jobs.extend(spec_jobs)
    results: dict = {"jobs": [], "session_error": None}

    def finish() -> None:
        results["jobs"] = [job.meta() for job in jobs]
        tmp = os.path.join(out_dir, "results.json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(results, f)
        os.replace(tmp, os.path.join(out_dir, "results.json"))

    host, _, port = cfg["target"].rpartition(":")
    t0 = time.monotonic()
    try:
        if cfg.get("auth"):
            session = barrage_session(host=host, port=int(port), auth_type=PSK_HANDLER, auth_token=cfg["auth"])
        else:
            session = barrage_session(host=host, port=int(port), auth_type="Anonymous")
    except BaseException as exc:  # the whole run fails with the session
        results["session_error"] = _error_text(exc)
        for job in jobs:
            job.error = "no Barrage session: " + results["session_error"]
        finish()
        return
    results["session_s"] = time.monotonic() - t0
    finish()
    j_session = session.j_barrage_session

    def ticket(name: str):
        return j_table_spec.ticket(b"s/" + name.encode("utf-8"))

    def wait(job: _Job, started: float) -> None:
        job.j_table = job.future.get(int(future_timeout * 1000), j_time_unit.MILLISECONDS)
        job.complete_s = time.monotonic() - started

    def read(job: _Job) -> None:
        table = Table(j_table=job.j_table)
        job.refreshing = bool(table.is_refreshing)
        job.columns = [c.name for c in table.columns]
        static = table.snapshot() if table.is_refreshing else table
        job.read_wall = time.time()
        data = to_arrow(static)
        job.size = data.num_rows
        job.file = f"{len(os.listdir(out_dir))}_{job.table}_{job.mode}.arrow"
        with pa.OSFile(os.path.join(out_dir, job.file), "wb") as sink:
            with pa.ipc.new_file(sink, data.schema) as writer:
                writer.write_table(data)

    # Subscriptions, all opened together.
    subs = [j for j in jobs if j.mode in ("full", "viewport")]
    opened = time.monotonic()
    for job in subs:
        try:
            job.request_wall = time.time()
            sub = j_session.subscribe(ticket(job.table), sub_options)
            if job.mode == "full":
                job.future = sub.entireTable()
            else:
                job.future = sub.partialTable(j_rowset_factory.fromRange(first, last), None, reverse)
        except BaseException as exc:
            job.error = _error_text(exc)
    for job in subs:
        if job.error is None:
            try:
                wait(job, opened)
                if job.j_table.isRefreshing():
                    job.listener = listen(Table(j_table=job.j_table), job.on_update)
            except BaseException as exc:
                job.error = _error_text(exc)
    # The observation window starts once every listener is attached (a cold JVM can take longer
    # than `seconds` to get there). Then a full subscription of a table the server says is
    # ticking that has not seen an update yet is given more time (at most FIRST_UPDATE_CAP_S
    # from the window's start): a server that never sends deltas still ends with updates == 0.
    window_start = time.monotonic()
    time.sleep(max(0.0, float(cfg["seconds"])))
    cap = window_start + max(float(cfg["seconds"]), min(FIRST_UPDATE_CAP_S, future_timeout))
    waiting = [job for job in subs if job.mode == "full" and job.error is None and job.listener is not None
               and job.updates == 0 and _server_says_ticking(session, ticket(job.table))]
    while any(job.updates == 0 for job in waiting) and time.monotonic() < cap:
        time.sleep(0.1)
    for job in subs:
        if job.error is None:
            try:
                read(job)
            except BaseException as exc:
                job.error = _error_text(exc)

    finish()

    # Snapshots.
    for job in jobs:
        if job.mode != "snapshot":
            continue
        try:
            started = time.monotonic()
            job.request_wall = time.time()
            job.future = j_session.snapshot(ticket(job.table), snap_options).entireTable()
            wait(job, started)
            read(job)
        except BaseException as exc:
            job.error = _error_text(exc)

    # Multi-step TableSpecs through Session.execute (a Batch with unexported steps).
    def strings(values):
        return jpy.array("java.lang.String", [str(v) for v in values])

    for spec, job in zip(specs, spec_jobs):
        handle = None
        try:
            started = time.monotonic()
            job.request_wall = time.time()
            built = ticket(spec["table"])
            if spec.get("where"):
                built = built.where(strings(spec["where"]))
            if spec.get("sort"):
                built = built.sort(strings(spec["sort"]))
            if spec.get("tail") is not None:
                built = built.tail(int(spec["tail"]))
            handle = session.j_session.execute(built)
            job.future = j_session.snapshot(handle, snap_options).entireTable()
            wait(job, started)
            read(job)
        except BaseException as exc:
            job.error = _error_text(exc)
        finally:
            if handle is not None:
                try:
                    handle.close()
                except BaseException:
                    pass

    for job in jobs:
        if job.mode not in ("full", "viewport", "snapshot", "spec"):
            job.error = f"unknown mode {job.mode!r}"
    finish()


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        sys.__stderr__.write("JAVA_CLIENT_MAIN_FAILED\n" + traceback.format_exc())
        sys.__stderr__.flush()
        os._exit(2)
    sys.__stdout__.flush()
    sys.__stderr__.flush()
    # The JVM's shutdown can take long or hang on client threads; the results are on disk.
    os._exit(0)
