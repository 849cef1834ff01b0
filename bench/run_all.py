"""Runs every benchmark in bench/ in turn (each prints its own ratios against a reference it measures):
bench_*.py, bench_web.py (the splitter and the browsers' websocket) among them. Arguments (e.g. --quick)
are passed to each."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"== {script.name}", flush=True)
        rc = subprocess.call([sys.executable, str(script), *sys.argv[1:]])
        failed += rc != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
