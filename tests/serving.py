"""`tickwire serve` as a child process, for tests of what its command line reaches, and a server
started again on the port a stopped one listened on."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, TypeVar

T = TypeVar("T")


def port_held(said: str) -> bool:
    """Whether a server's failure to start says its port is held (tickwire: "in use"; grpcio:
    "Failed to bind to address")."""
    return "in use" in said or "Failed to bind" in said


def start_again(start: Callable[[], T], timeout: float = 10.0) -> T:
    """`start()`, a server on the port a stopped one listened on, tried again while that port is
    still held (another process may hold it a moment); any other failure, or a port still held
    after `timeout` seconds, is raised."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return start()
        except (OSError, RuntimeError) as exc:
            if not port_held(str(exc)) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


@contextmanager
def serve_process(*args: str, env: Optional[dict] = None, duration: float = 20) -> Iterator[int]:
    """Runs `python -m tickwire serve --port 0 ARGS --duration D` and yields the port its banner names;
    stops it on leaving."""
    proc = subprocess.Popen([sys.executable, "-m", "tickwire", "serve", "--port", "0", *args,
                             "--duration", str(duration)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **(env or {})})
    try:
        seen = []
        for line in proc.stdout:
            seen.append(line)
            m = re.search(r"serving on [\w.:\[\]]+:(\d+)", line)
            if m:
                break
        else:
            raise AssertionError("tickwire serve printed no banner:\n" + "".join(seen))
        yield int(m.group(1))
    finally:
        proc.terminate()
        proc.wait(20)
        proc.stdout.close()
