"""`tickwire serve` as a child process, for tests of what its command line reaches."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator, Optional


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
