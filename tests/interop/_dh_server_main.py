"""Subprocess entry point: an embedded Deephaven server (PyPI package `deephaven-server`).

Usage: python _dh_server_main.py CONFIG.json

CONFIG holds `port` (0 = any free port), `host`, `heap`, `psk` (None = anonymous auth),
`work_dir` (data/cache/config directories for the JVM), `tables_script` (Python source run in
the server's global scope after start-up) and `extra_jvm_args`.

Prints `READY <port>` once the tables exist, then runs until killed or until its stdin closes
(so it never outlives the process that started it). Each line its stdin brings is a JSON object
`{"id": N, "script": SOURCE}`: the script runs in the same global scope, and the server prints
`SCRIPT N ok` or `SCRIPT N failed <the traceback as JSON>` (one line) when it is done. Tests of
several modules share one server this way, each adding its own tables.
"""
from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback


def _jvm_args(cfg: dict) -> list[str]:
    work = cfg["work_dir"]
    args = [
        f"-Xmx{cfg.get('heap', '1g')}",
        f"-Ddeephaven.dataDir={os.path.join(work, 'data')}",
        f"-Ddeephaven.cacheDir={os.path.join(work, 'cache')}",
        f"-Ddeephaven.configDir={os.path.join(work, 'config')}",
        "-Dprocess.info.system-info.enabled=false",
        "-Ddeephaven.console.type=python",
        # the client compiler only: these JVMs live for one test or one run of the suite, serving
        # small tables; C2's compiler threads would spend more of a 2-core machine than its faster
        # code saves (a Deephaven start costs about 40% less CPU)
        "-XX:TieredStopAtLevel=1",
    ]
    if cfg.get("psk"):
        args += [
            "-DAuthHandlers=io.deephaven.authentication.psk.PskAuthenticationHandler",
            f"-Dauthentication.psk={cfg['psk']}",
        ]
    else:
        args.append("-DAuthHandlers=io.deephaven.auth.AnonymousAuthenticationHandler")
    return args + list(cfg.get("extra_jvm_args") or [])


def _exit_when_parent_goes() -> None:
    """Ends the process as soon as stdin reaches EOF (the parent closed it or died); for
    processes that take no commands (the Java client's)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def _read_commands(commands: "queue.Queue[bytes]") -> None:
    """Queues each line of stdin; ends the process as soon as stdin reaches EOF (the parent
    closed it or died)."""
    try:
        for line in sys.stdin.buffer:
            commands.put(line)
    finally:
        os._exit(0)


def _run_commands(commands: "queue.Queue[bytes]", scope: dict) -> None:
    while True:
        line = commands.get()
        try:
            command = json.loads(line)
        except ValueError:
            continue
        ident = int(command.get("id", 0))
        try:
            exec(compile(command.get("script") or "", f"<script {ident}>", "exec"), scope)
        except BaseException:
            sys.__stdout__.write(f"SCRIPT {ident} failed {json.dumps(traceback.format_exc())}\n")
        else:
            sys.__stdout__.write(f"SCRIPT {ident} ok\n")
        sys.__stdout__.flush()


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    commands: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=_read_commands, args=(commands,), name="parent-watch", daemon=True).start()

    from deephaven_server import Server

    server = Server(host=cfg.get("host", "127.0.0.1"), port=int(cfg.get("port", 0)), jvm_args=_jvm_args(cfg))
    server.start()
    port = server.port

    # The embedded Python session publishes the globals of `__main__` as its query scope.
    scope = sys.modules["__main__"].__dict__
    try:
        exec(compile(cfg.get("tables_script") or "", "<tables_script>", "exec"), scope)
    except BaseException:
        sys.__stderr__.write("TABLES_SCRIPT_FAILED\n" + traceback.format_exc())
        sys.__stderr__.flush()
        os._exit(3)

    sys.__stdout__.write(f"READY {port}\n")
    sys.__stdout__.flush()
    _run_commands(commands, scope)


if __name__ == "__main__":
    main()
