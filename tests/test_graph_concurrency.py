"""Producers on several threads while readers take snapshots: every read is a cycle boundary."""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa

from tickwire.server.engine import Engine, TableSpec


def test_concurrent_producers_and_snapshot_readers_see_cycle_boundaries():
    engine = Engine(interval_ms=5).start()
    s = pa.schema([("producer", pa.int32()), ("batch", pa.int64()), ("i", pa.int32())])
    t = engine.create(TableSpec("t", "append", s))
    keyed = engine.create(TableSpec("kt", "keyed", pa.schema([("producer", pa.int32()), ("n", pa.int64())]),
                                    keys=["producer"]))
    batch_rows = 17
    stop = threading.Event()
    errors = []

    def producer(pid):
        n = 0
        while not stop.is_set() and n < 300:
            engine.write(t, pa.table({"producer": pa.array([pid] * batch_rows, pa.int32()),
                                      "batch": pa.array([n] * batch_rows, pa.int64()),
                                      "i": pa.array(range(batch_rows), pa.int32())}, schema=s), wait=False)
            engine.write(keyed, pa.table({"producer": pa.array([pid], pa.int32()), "n": pa.array([n], pa.int64())}),
                         wait=False)
            n += 1

    def reader():
        seen_sizes: dict[int, int] = {}
        while not stop.is_set():
            with engine.reading():
                step = engine.step
                snap = t.gather()
                counts = keyed.gather()
            sizes = snap.group_by(["producer", "batch"]).aggregate([("i", "count")])
            if sizes.num_rows and set(sizes["i_count"].to_pylist()) != {batch_rows}:
                errors.append(f"half-applied batch at step {step}")
            if step in seen_sizes and seen_sizes[step] != snap.num_rows:
                errors.append(f"two sizes for step {step}")
            seen_sizes[step] = snap.num_rows
            # per producer, every row batch up to the keyed counter's value... is present in order
            for pid, n in zip(counts["producer"].to_pylist(), counts["n"].to_pylist()):
                got = snap.filter(pa.compute.equal(snap["producer"], pid))["batch"]
                if len(got) and pa.compute.max(got).as_py() < n:
                    errors.append(f"keyed table ahead of the append table at step {step}")
            time.sleep(0.001)

    producers = [threading.Thread(target=producer, args=(p,)) for p in range(3)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for th in producers + readers:
        th.start()
    for th in producers:
        th.join(30)
    time.sleep(0.1)
    stop.set()
    for th in readers:
        th.join(10)
    engine.stop()
    assert not errors, errors[:5]
    engine.run_cycle()
    assert t.size == 3 * 300 * batch_rows
    assert keyed.to_arrow()["n"].to_pylist() == [299, 299, 299]


def test_snapshots_match_the_state_recorded_at_their_step():
    """A listener records the table at the end of every cycle; each snapshot taken by reader threads
    while the graph runs on its own thread must equal the record for its step."""
    engine = Engine(interval_ms=2)
    s = pa.schema([("k", pa.int64()), ("v", pa.int64())])
    keyed = engine.create(TableSpec("k", "keyed", s, keys=["k"]))
    ring = engine.create(TableSpec("r", "ring", s, capacity=50))
    states: dict[int, tuple[list, list]] = {}
    engine.add_cycle_listener(lambda step: states.__setitem__(step, (keyed.gather().to_pylist(),
                                                                     ring.gather().to_pylist())))
    engine.start()
    stop = threading.Event()
    snaps = []

    def producer(seed):
        rng = np.random.default_rng(seed)
        while not stop.is_set():
            k = rng.integers(0, 40, 8)
            t = pa.table({"k": k, "v": rng.integers(0, 1000, 8)}, schema=s)
            engine.write(keyed, t, wait=False)
            engine.write(ring, t, wait=False)
            if rng.random() < 0.3:
                engine.write(keyed, delete=pa.table({"k": rng.integers(0, 40, 3)}), wait=False)
            time.sleep(0.0005)

    def reader():
        while not stop.is_set():
            with engine.reading():
                step = engine.step
                snaps.append((step, keyed.gather().to_pylist(), engine.snapshot(ring)[1].to_pylist()))
            time.sleep(0.0005)

    threads = [threading.Thread(target=producer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=reader) for _ in range(2)]
    for th in threads:
        th.start()
    # at least 1.5 s, and on until several cycle boundaries were read (a slow machine needs longer)
    start = time.monotonic()
    while time.monotonic() - start < 60:
        time.sleep(0.1)
        read_steps = {step for step, _, _ in list(snaps)} & set(states)
        if time.monotonic() - start >= 1.5 and len(read_steps) >= 5:
            break
    stop.set()
    for th in threads:
        th.join(10)
    engine.stop()
    assert not engine.errors
    checked = [(step, k, r) for step, k, r in snaps if step in states]
    assert len({step for step, _, _ in checked}) >= 5  # several distinct cycle boundaries were read
    for step, k, r in checked:
        assert (k, r) == states[step], f"snapshot at step {step} is not that cycle's state"
