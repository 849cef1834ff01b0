"""The demo tables and the Python ticker that feeds them (`tickwire.demo` runs them with a server
and the Spark pipeline).

Tables (names kept stable for the server and its clients):
- static_mixed: 1,000 deterministic rows covering the supported types, with nulls;
- ticking_append: an append-only table of trades (its last N rows, a ring table, with
  `append_rows`);
- ticking_keyed: the latest trade per symbol (upserts over 20 keys);
- blink: each cycle's trades only;
- ticking_ring: the last 1,000 trades;
- big_static (when served): 1,000,000 rows x 5 numeric columns.
"""
from __future__ import annotations

import logging
import threading
from typing import Optional

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec

TRADES = pa.schema([("Timestamp", pa.timestamp("ns", "UTC")), ("Sym", pa.string()), ("Price", pa.float64()),
                    ("Size", pa.int32()), ("Seq", pa.int64())])
SYMBOLS = [f"SYM{i:02d}" for i in range(20)]

log = logging.getLogger(__name__)


def static_mixed(n: int = 1000) -> pa.Table:
    """n deterministic rows of every basic type; column k is null where i % P_k == 0 (row 0 is all
    null). The same values as the golden captures' static_mixed table from Deephaven."""
    i = np.arange(n)
    base = np.datetime64("2024-01-01T00:00:00", "ns").astype(np.int64)

    def col(values, t, p):
        return pa.array(values, t, mask=i % p == 0)

    return pa.table({
        "I8": col((i % 100 - 50).astype(np.int8), pa.int8(), 17),
        "I16": col((i * 7 - 3000).astype(np.int16), pa.int16(), 19),
        "I32": col((i * 1000003).astype(np.int32), pa.int32(), 23),
        "I64": col(i.astype(np.int64) * 10000000019, pa.int64(), 29),
        "F32": col((i * 0.125).astype(np.float32), pa.float32(), 31),
        "F64": col(i * 1.25 - 100.0, pa.float64(), 37),
        "Bool": col(i % 2 == 0, pa.bool_(), 13),
        "Str": col(np.array([f"s{x}" for x in i.tolist()], dtype=object), pa.string(), 11),
        "Ts": col(base + i.astype(np.int64) * 1_000_000_000, pa.timestamp("ns", "UTC"), 41),
        "Ch": col((65 + i % 26).astype(np.uint16), pa.uint16(), 43),
    })


class DemoTicker:
    """Feeds the ticking demo tables of `engine`, from a background thread (`start`) or one tick at
    a time (`tick`); times come from the engine's clock."""

    def __init__(self, engine: Engine, rows_per_tick: int = 5, interval_s: float = 0.1, seed: int = 7,
                 append_rows: Optional[int] = None):
        self.rows = rows_per_tick
        self.interval = interval_s
        self.rng = np.random.default_rng(seed)
        self.seq = 0
        self.engine = engine
        engine.get_or_create(TableSpec("static_mixed", "static", data=static_mixed()))
        # append_rows: the last rows only (a ring table), for a demo that runs for days
        self.append, _ = engine.get_or_create(TableSpec("ticking_append", "append", TRADES) if append_rows is None
                                              else TableSpec("ticking_append", "ring", TRADES, capacity=append_rows))
        self.keyed, _ = engine.get_or_create(TableSpec("ticking_keyed", "keyed", TRADES, keys=("Sym",)))
        self.blink, _ = engine.get_or_create(TableSpec("blink", "blink", TRADES))
        self.ring, _ = engine.get_or_create(TableSpec("ticking_ring", "ring", TRADES, capacity=1000))
        # the latest trade per symbol, sorted on its (changing) price: a derived table whose rows
        # move, with tight row-key gaps so that moves show up as shifts as well as removes/adds
        latest = self.append.last_by(["Sym"], name="__ticking_latest_by_sym")
        self.sorted = latest.sort("Price", name="ticking_sorted", spacing=2)
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def tick(self) -> pa.Table:
        n = self.rows
        now = self.engine.clock.now_ns()
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        t = pa.table({
            "Timestamp": pa.array(np.full(n, now, dtype=np.int64)).view(pa.timestamp("ns", "UTC")),
            "Sym": pa.array(np.array(SYMBOLS, dtype=object)[self.rng.integers(0, len(SYMBOLS), n)]),
            "Price": pa.array(np.round(100 + self.rng.normal(0, 5, n), 2)),
            "Size": pa.array(self.rng.integers(1, 1000, n).astype(np.int32)),
            "Seq": pa.array(seq),
        }, schema=TRADES)
        with self.engine.writes(wait=False) as writes:  # one cycle applies the tick to every table
            for table in (self.append, self.keyed, self.blink, self.ring):
                writes.write(table, t)
        return t

    def start(self) -> "DemoTicker":
        self._thread = threading.Thread(target=self._run, name="tickwire-demo-ticker", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self.engine.clock.wait(self._stop, self.interval):
            self.tick()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def big_static(n: int = 1_000_000) -> pa.Table:
    """n deterministic rows x 5 numeric columns (the DoGet throughput table)."""
    i = np.arange(n, dtype=np.int64)
    return pa.table({
        "Id": i,
        "X": i * 0.5,
        "Bucket": (i % 1000).astype(np.int32),
        "Y": np.sin(i.astype(np.float64) / 1000.0),
        "Z": i * 7 % 1_000_003,
    })


def publish_demo_tables(engine: Engine, *, interval_ms: float = 100.0, big: bool = True,
                        append_rows: Optional[int] = None) -> DemoTicker:
    """Adds the demo tables (and big_static) to `engine`; returns the (not yet started) ticker.
    `append_rows`: ticking_append keeps its last `append_rows` rows (a ring table)."""
    ticker = DemoTicker(engine, interval_s=interval_ms / 1000.0, append_rows=append_rows)
    if big:
        engine.get_or_create(TableSpec("big_static", "static", data=big_static()))
    return ticker


