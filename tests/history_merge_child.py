"""The process tests/test_history.py kills in the middle of a merge:

    python -m tests.history_merge_child DATASET DATA_DIR STEP

A running engine with a data directory serves DATASET as history table "trades", takes 30 rows of
2026-11-21 and 5 of 2026-11-22 (acknowledged: on disk), prints "WRITTEN", then merges
2026-11-21 and SIGKILLs itself when the merge reaches STEP (after printing "AT STEP")."""
from __future__ import annotations

import os
import signal
import sys

import pyarrow as pa

from tests.test_history import day
from tickwire.server.engine import Durability, Engine, EngineConfig


def main() -> None:
    dataset, data_dir, at = sys.argv[1:4]
    engine = Engine(EngineConfig(interval_ms=20, data_dir=data_dir, durability=Durability()))
    table = engine.history("trades", dataset)
    engine.start()
    for first, n, date in ((0, 30, "2026-11-21"), (30, 5, "2026-11-22")):
        engine.write(table, day(3).slice(first, n).append_column("Date", pa.array([date] * n)))
    print("WRITTEN", flush=True)

    def step(name: str) -> None:
        if name == at:
            print("AT", name, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    engine.merge("trades", "2026-11-21", on_step=step)
    print("MERGED", flush=True)
    engine.stop()


if __name__ == "__main__":
    main()
