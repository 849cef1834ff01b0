"""Client-side apply rate of tickwire's Python Barrage client.

A tickwire server (in this process) serves a keyed table of --rows rows; each cycle upserts
--change rows (half of them modifications of existing keys, half new keys, so every update has
adds and modifies). A raw DoExchange subscriber records the server's FlightData for --updates
cycles; the recording is then replayed into the client's decoding and state-keeping path
(`StreamDecoder.feed` + the subscription state's `apply`, what each subscription's reader thread
does per message), timed alone, so the figure is the client's own cost.

The initial snapshot (several messages for a large table) is recorded whole and applied before
the timing starts. Printed: rows/s and updates/s applied to the --rows subscription (the fastest
of --runs replays), and the same for a 10k-row table with the same change size measured in the
same run, with the ratio of their per-update costs (cost follows the change when it is close to
1; the issue's goal is at most 1.2 for 10,000,000 rows and 1,000-row changes).
"""
from __future__ import annotations

import argparse
import queue
import time

import grpc
import numpy as np
import pyarrow as pa

from tickwire.clients.client import FLIGHT
from tickwire.clients.state import NaturalTableState
from tickwire.protocol import barrage
from tickwire.protocol.flight import FlightDescriptor, encode_flight_data
from tickwire.protocol.update import StreamDecoder
from tickwire.server.app import TickwireServer
from tickwire.server.engine import Engine, TableSpec

SCHEMA = pa.schema([("Key", pa.int64()), ("Px", pa.float64()), ("Qty", pa.int64()), ("Sym", pa.string())])


def _rows(keys: np.ndarray, rng) -> pa.Table:
    n = keys.size
    return pa.table({"Key": keys, "Px": rng.random(n), "Qty": rng.integers(0, 1000, n),
                     "Sym": pa.array(np.char.add("S", (keys % 500).astype(str)).astype(object))}, schema=SCHEMA)


def record(rows: int, change: int, updates: int, seed: int = 1) -> list[bytes]:
    """The FlightData a full subscriber receives: schema, snapshot, then `updates` deltas."""
    rng = np.random.default_rng(seed)
    engine = Engine()  # stepped here with run_cycle()
    table = engine.create(TableSpec("t", "keyed", SCHEMA, keys=("Key",)))
    for start in range(0, rows, 1_000_000):
        engine.write(table, _rows(np.arange(start, min(rows, start + 1_000_000), dtype=np.int64), rng), wait=False)
        engine.run_cycle()
    server = TickwireServer(engine, port=0, start_engine=False).start()
    got: list[bytes] = []
    recorded_snapshot = [0]
    try:
        with grpc.insecure_channel(server.target, options=[("grpc.max_receive_message_length", -1)]) as ch:
            q: queue.Queue = queue.Queue()
            req = barrage.wrap(barrage.SubscriptionRequest(ticket=b"s/t", options=barrage.SubscriptionOptions()))
            q.put(encode_flight_data(b"", None, descriptor=FlightDescriptor.for_command(b"dphn")))
            q.put(encode_flight_data(b"", req))
            call = ch.stream_stream(FLIGHT + "DoExchange")(iter(q.get, None),
                                                           metadata=(("authorization", "Anonymous"),))
            dec = StreamDecoder()
            it = iter(call)
            seen = 0
            next_key = rows
            held: list[NaturalTableState] = []

            def read_until(count):
                nonlocal seen
                while seen < count:
                    raw = next(it)
                    got.append(raw)
                    u = dec.feed(raw)
                    if not held and dec.schema is not None:
                        held.append(NaturalTableState(dec.schema, viewport=False))
                    if u is not None:
                        held[0].apply(u)
                        seen += 1

            # the initial snapshot: a large one comes as several messages (pieces), which the
            # replay leaves out of the timing
            read_until(1)
            while len(held[0]) < rows:  # the next piece goes out with the next cycle
                engine.run_cycle()
                read_until(seen + 1)
            recorded_snapshot[0] = seen
            for _ in range(updates):
                old = rng.choice(rows, change // 2, replace=False).astype(np.int64)
                new = np.arange(next_key, next_key + change - change // 2, dtype=np.int64)
                next_key += new.size
                engine.write(table, _rows(np.concatenate([old, new]), rng), wait=False)
                engine.run_cycle()
                read_until(seen + 1)
            call.cancel()
    finally:
        server.stop()
    return got, recorded_snapshot[0]


def replay(payloads: list[bytes], skip: int) -> tuple[float, int, int]:
    """Feeds the recording through decode + apply; returns (seconds for the deltas after the
    first `skip` messages, which hold the initial snapshot, deltas, rows)."""
    dec = StreamDecoder()
    state = None
    applied = 0
    rows = 0
    messages = 0
    t0 = None
    for raw in payloads:
        if messages == skip and t0 is None:
            t0 = time.perf_counter()
        u = dec.feed(raw)
        if state is None and dec.schema is not None:
            state = NaturalTableState(dec.schema, viewport=False)
        if u is None:
            continue
        messages += 1
        state.apply(u)
        if messages <= skip:
            continue
        md = u.metadata
        if md.is_snapshot:
            raise RuntimeError("a snapshot message after the initial snapshot")
        applied += 1
        rows += max((len(a) for a in u.added), default=0) + max((len(a) for a in u.modified if a is not None),
                                                              default=0)
    return time.perf_counter() - t0, applied, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--change", type=int, default=10_000)
    ap.add_argument("--updates", type=int, default=40)
    ap.add_argument("--runs", type=int, default=7, help="replays of each recording (the fastest counts)")
    ap.add_argument("--quick", action="store_true", help="100k rows, 20 updates")
    args = ap.parse_args()
    if args.quick:
        args.rows, args.updates = 100_000, 20
    results = {}
    for rows in (10_000, args.rows):
        payloads, snapshot_messages = record(rows, args.change, args.updates)
        runs = [replay(payloads, snapshot_messages) for _ in range(args.runs)]
        secs = min(r[0] for r in runs)  # the least disturbed run: the figure is the client's own cost
        _, n, nrows = runs[0]
        results[rows] = secs / n
        print(f"{rows:>9,}-row subscription, {args.change:,}-row updates: {n / secs:,.0f} updates/s, "
              f"{nrows / secs / 1e6:.2f} M rows/s applied ({secs / n * 1e3:.2f} ms per update)")
    print(f"per-update cost ratio, {args.rows:,} rows / 10,000 rows: {results[args.rows] / results[10_000]:.2f}")


if __name__ == "__main__":
    main()
