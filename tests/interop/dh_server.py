"""A real Deephaven server (PyPI `deephaven-server`) in a subprocess, for interop tests.

    with start_dh_server() as dh:
        ...  # dh.target == "127.0.0.1:PORT"; tables of DEFAULT_TABLES are in the global scope

The server runs `_dh_server_main.py` with the current interpreter; the tables are defined by a
Python script executed in the server's global scope (names become `s/<name>` tickets).
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Iterator

HERE = Path(__file__).resolve().parent
SERVER_MAIN = HERE / "_dh_server_main.py"

#: the update-graph cycle of the servers the suite shares (tests/conftest.py; Deephaven's default is 1000 ms)
DH_CYCLE_MS = 100
#: the key of the suite's shared pre-shared-key server
DH_PSK = "tickwire-interop-psk"

#: Tables like the golden captures' ones (see shared/golden/README.md).
#: static_mixed: 1000 rows, row 0 all null, column k null where i % P_k == 0.
DEFAULT_TABLES = r'''
from deephaven import empty_table, time_table

static_mixed = empty_table(1000).update([
    "I8 = i % 17 == 0 ? NULL_BYTE : (byte) (i % 100 - 50)",
    "I16 = i % 19 == 0 ? NULL_SHORT : (short) (i * 7 - 3000)",
    "I32 = i % 23 == 0 ? NULL_INT : i * 1000003",
    "I64 = i % 29 == 0 ? NULL_LONG : ii * 10000000019L",
    "F32 = i % 31 == 0 ? NULL_FLOAT : (float) (i * 0.125)",
    "F64 = i % 37 == 0 ? NULL_DOUBLE : i * 1.25 - 100.0",
    "Bool = i % 13 == 0 ? null : (Boolean) (i % 2 == 0)",
    "Str = i % 11 == 0 ? null : `s` + i",
    "Ts = i % 41 == 0 ? null : '2024-01-01T00:00:00Z' + i * SECOND",
    "Ch = i % 43 == 0 ? NULL_CHAR : (char) (65 + i % 26)",
])

ticking_append = time_table("PT0.1S").update([
    "Seq = ii",
    "Sym = Seq % 4 == 0 ? `AAPL` : Seq % 4 == 1 ? `MSFT` : Seq % 4 == 2 ? `GOOG` : `AMZN`",
    "Px = 100.0 + Seq * 0.5",
    "Qty = Seq * 100",
])

ticking_keyed = time_table("PT0.05S").update([
    "Key = (int) (ii % 20)",
    "Val = Math.round(randomDouble(0.0, 100.0) * 100.0) / 100.0",
    "Cnt = ii",
]).last_by("Key")

ticking_sorted = time_table("PT0.1S").update([
    "Key = (int) (ii % 50)",
    "SortVal = randomInt(0, 100)",
    "Label = `k` + Key",
]).last_by("Key").sort("SortVal")

blink = time_table("PT0.2S", blink_table=True).update([
    "Seq = ii",
    "V = (double) randomInt(0, 100)",
])
'''


def deephaven_server_available() -> str | None:
    """None when `java` and the `deephaven_server` package are present, else why not."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "java not found (no `java` on PATH and no JAVA_HOME)"
    if importlib.util.find_spec("deephaven_server") is None:
        return "Python package deephaven_server (PyPI deephaven-server) is not installed"
    return None


def kill_process_tree(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """Ends `proc` and its process group (it must have been started with start_new_session=True):
    SIGTERM, then SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        _killpg(proc.pid, signal.SIGKILL)  # leftovers of the group, if any
        return
    _killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    _killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:  # pragma: no cover - unkillable process
        pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, limit: int = 6000) -> str:
    """The last `limit` characters of a text file ('' if it does not exist)."""
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode("utf-8", "replace")


class DhServerError(RuntimeError):
    """The Deephaven server subprocess failed to start or died."""


class DhServer:
    """A running Deephaven server subprocess; use as a context manager or call stop()."""

    def __init__(self, proc: subprocess.Popen, port: int, work_dir: Path, log_path: Path, psk: str | None,
                 log_offset: int = 0):
        self.proc = proc
        self.port = port
        self.work_dir = work_dir
        self.log_path = log_path
        self.psk = psk
        self._log_offset = log_offset  # where the log was read up to
        self._partial = b""
        self._script_lock = threading.Lock()
        self._scripts = 0

    def _new_lines(self) -> list[bytes]:
        with open(self.log_path, "rb") as f:
            f.seek(self._log_offset)
            chunk = f.read()
        self._log_offset += len(chunk)
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        return lines

    def run_script(self, script: str, timeout: float = 120) -> None:
        """Runs Python `script` in the server's global scope (as the start-up tables script ran),
        returning once it is done; raises DhServerError with its traceback if it fails."""
        with self._script_lock:
            self._scripts += 1
            ident = self._scripts
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"id": ident, "script": script}).encode() + b"\n")
            self.proc.stdin.flush()
            marker = f"SCRIPT {ident} ".encode()
            deadline = time.monotonic() + timeout
            while True:
                for line in self._new_lines():
                    at = line.find(marker)
                    if at < 0:
                        continue
                    outcome = line[at + len(marker):]
                    if outcome.strip() == b"ok":
                        return
                    detail = outcome.partition(b" ")[2]
                    try:
                        detail = json.loads(detail)
                    except ValueError:
                        pass
                    raise DhServerError(f"script failed in the Deephaven server:\n{detail}")
                if not self.alive():
                    raise DhServerError(f"Deephaven server exited with code {self.proc.returncode}:\n{self.log()}")
                if time.monotonic() > deadline:
                    raise DhServerError(f"script not done after {timeout:.0f} s:\n{self.log()}")
                time.sleep(0.05)

    @contextlib.contextmanager
    def tables(self, script: str) -> Iterator["DhServer"]:
        """Runs `script` (defining tables) in the server and, on exit, removes the names its top
        level assigned, so that modules sharing one server leave no tables ticking behind them."""
        self.run_script(script)
        try:
            yield self
        finally:
            self.forget(assigned_names(script))

    def forget(self, names) -> None:
        """Removes `names` from the server's global scope (tables a test defined through a
        client's run_script, for example)."""
        names = sorted(names)
        if names and self.alive():
            self.run_script(f"for _n in {names!r}:\n    globals().pop(_n, None)\n")

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def auth_header(self) -> tuple[bytes, bytes]:
        """The Flight `authorization` header value that this server accepts."""
        if self.psk:
            return (b"authorization", f"io.deephaven.authentication.psk.PskAuthenticationHandler {self.psk}".encode())
        return (b"authorization", b"Anonymous")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """The tail of the server's combined stdout/stderr."""
        return tail(self.log_path)

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        kill_process_tree(self.proc)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> "DhServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def assigned_names(script: str) -> set[str]:
    """The names a script's top level assigns (`x = ...`, `a, b = ...`, `def f`, imports aside)."""
    names: set[str] = set()
    for node in ast.parse(script).body:
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        for target in targets:
            names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def start_dh_server(
    port: int = 0,
    tables_script: str = DEFAULT_TABLES,
    timeout: float = 120,
    *,
    psk: str | None = None,
    heap: str = "1g",
    extra_jvm_args: list[str] | tuple[str, ...] = (),
) -> DhServer:
    """Starts a Deephaven server on 127.0.0.1:`port` (0 = a free port chosen by the server) with
    anonymous auth (or pre-shared-key auth when `psk` is given), runs `tables_script` in its
    global scope and returns once the tables exist. Raises DhServerError (with the server log)
    if that does not happen within `timeout` seconds."""
    why = deephaven_server_available()
    if why:
        raise DhServerError(why)
    work_dir = Path(tempfile.mkdtemp(prefix="dh_server_"))
    cfg = {
        "host": "127.0.0.1",
        "port": int(port),
        "heap": heap,
        "psk": psk,
        "work_dir": str(work_dir),
        "tables_script": tables_script,
        "extra_jvm_args": list(extra_jvm_args),
    }
    cfg_path = work_dir / "config.json"
    cfg_path.write_text(json.dumps(cfg), encoding="utf-8")
    log_path = work_dir / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER_MAIN), str(cfg_path)],
            stdin=subprocess.PIPE,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=work_dir,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    # The log is read from where the last look stopped, and only whole lines are parsed: the JVM
    # may log a lot right after READY, which a look at the log's tail alone could miss, and a
    # line still being written could give a truncated port.
    offset, pending = 0, b""
    try:
        while True:
            with open(log_path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                if line.startswith(b"READY "):
                    # no script ran yet: nothing read so far answers one
                    server = DhServer(proc, int(line.split()[1]), work_dir, log_path, psk, offset)
                    server._partial = pending
                    return server
            if proc.poll() is not None:
                raise DhServerError(f"Deephaven server exited with code {proc.returncode}:\n{tail(log_path)}")
            if time.monotonic() > deadline:
                raise DhServerError(f"Deephaven server not ready after {timeout:.0f} s:\n{tail(log_path)}")
            time.sleep(0.1)
    except BaseException:
        if proc.stdin:
            proc.stdin.close()
        kill_process_tree(proc)
        shutil.rmtree(work_dir, ignore_errors=True)
        raise
