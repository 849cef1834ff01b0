"""Python's cyclic garbage collector in a server process: fewer young collections, and the objects
of startup kept out of the full ones.

Why: a full collection walks every tracked object with the interpreter lock held, so every
thread of the server (the cycle, publishing, gRPC) stops for its length. With 100 full and 1,000
viewport subscribers at a 100 ms cycle (bench/bench_fanout.py) Python's default thresholds
(700, 10, 10) ran a young collection every 7 ms and a full one every 1.5 s, of 67-136 ms each:
the messages of every 15th cycle arrived that much later, which was the whole of the fan-out's
p99 (223-247 ms through the shared port, 190-210 on gRPC's own, against a median of 63-93).
Almost every object a cycle allocates (messages, their buffers' wrappers, futures) dies by its
reference count before any collection sees it; collections mostly walk objects that live on.
With a young threshold of 20,000 the same run had seven young collections in 15 s and no full
one: p99 147-163 ms over four runs, the server at 51% of a core instead of 64%. At a 10 ms
cycle with 50 subscribers the server's CPU per row fell by a quarter and its p99 from 20.6 to
16.0 ms.

`tickwire serve` and `tickwire demo` set the young threshold (`--gc-young`) before serving and,
once the server has started, collect and *freeze* what exists (`gc.freeze`: modules, functions,
the tables loaded at startup), so that later full collections walk only what came after. A
server embedded in another program leaves the collector to that program, which may call these
itself.

Touches no engine state: process-wide collector settings only.
"""
from __future__ import annotations

import gc
import logging

__all__ = ["YOUNG", "tune_gc", "freeze_startup"]

log = logging.getLogger(__name__)

#: allocations (net, of container objects) between young collections in a server process
YOUNG = 20_000


def tune_gc(young: int = YOUNG) -> tuple[int, int, int]:
    """Sets the young generation's threshold to `young` (the older two keep theirs); returns the
    thresholds before."""
    if young <= 0:
        raise ValueError(f"gc young threshold {young}: want a positive number")
    before = gc.get_threshold()
    gc.set_threshold(young, *before[1:])
    log.debug("gc thresholds %s -> %s", before, gc.get_threshold())
    return before


def freeze_startup() -> int:
    """Collects once, then moves every object that survived into the permanent generation, which
    later collections do not walk; returns how many objects that froze. Call it once startup has
    built what lives for the whole run."""
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("gc: %d objects of startup frozen", frozen)
    return frozen
