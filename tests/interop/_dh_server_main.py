"""Subprocess entry point: an embedded Deephaven server (PyPI package `deephaven-server`).

Usage: python _dh_server_main.py CONFIG.json

CONFIG holds `port` (0 = any free port), `host`, `heap`, `psk` (None = anonymous auth),
`work_dir` (data/cache/config directories for the JVM), `tables_script` (Python source run in
the server's global scope after start-up) and `extra_jvm_args`.

Prints `READY <port>` once the tables exist, then runs until killed or until its stdin closes
(so it never outlives the process that started it).
"""
from __future__ import annotations

import json
import os
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
    """Ends the process as soon as stdin reaches EOF (the parent closed it or died)."""
    try:
        while sys.stdin.buffer.read(4096):
            pass
    finally:
        os._exit(0)


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    threading.Thread(target=_exit_when_parent_goes, name="parent-watch", daemon=True).start()

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
    threading.Event().wait()


if __name__ == "__main__":
    main()
