"""How often this machine's CPU stalls under the benchmark: a probe for reading a p99.

A thread does a fixed unit of Python work (about 0.2-0.6 ms here) every 20 ms and records the
CPU time the unit took, by its own thread clock. The guest's scheduler cannot make that clock
run while the thread is not running, so a unit that takes several times its median was slowed
while it ran: on a virtual machine whose host takes the virtual CPU away without the guest
accounting it as steal time, the guest charges the lost time to whatever thread was running.

Seen on the 2-core KVM guest these benchmarks were developed on, with nothing else running:
about 3 % of units took 3-10x their median (5-30 ms instead of 0.6), in bursts of 100-300 ms
about every 1.5 s; a numpy sum over memory showed the same bursts. A p99 at a 10 ms cycle measures
those bursts as much as the server: every thread of the server, and of the client, runs at a
tenth of its speed for their length.

The streaming benchmarks run the probe in their driver process (which otherwise waits) over the
measured seconds and print its figures beside their latencies.

    python bench/machine_stalls.py --seconds 15
"""
from __future__ import annotations

import argparse
import threading
import time

import numpy as np

__all__ = ["StallProbe"]


class StallProbe:
    """Runs the probe's thread from `start()` to `stop()`; `summary()` says what it saw."""

    def __init__(self, period_s: float = 0.02, unit: int = 3000, slow: float = 3.0):
        self.period_s, self.unit, self.slow = period_s, unit, slow
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.cpu_us: list[float] = []
        self.at: list[float] = []

    def _work(self) -> float:
        s = 0.0
        for i in range(self.unit):
            s += i * 0.5
        return s

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            c0 = time.thread_time_ns()
            self._work()
            self.cpu_us.append((time.thread_time_ns() - c0) / 1e3)
            self.at.append(time.monotonic())

    def start(self) -> "StallProbe":
        self._thread = threading.Thread(target=self._run, name="stall-probe", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> "StallProbe":
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self

    def summary(self) -> dict:
        """units: probes run; period_ms: the time between them; median_us: a unit's median CPU
        time; slow: the factor over the median that makes a unit slow; slow_share: the share of
        units that took `slow` times the median or more; worst_ms: the slowest unit; bursts: runs
        of slow units less than 0.5 s apart."""
        c = np.asarray(self.cpu_us)
        if c.size == 0:
            return {"units": 0}
        med = float(np.median(c))
        slow = c >= self.slow * med
        at = np.asarray(self.at)[slow]
        bursts = int(at.size and 1 + np.count_nonzero(np.diff(at) > 0.5))
        return {"units": int(c.size), "period_ms": self.period_s * 1e3, "median_us": med, "slow": self.slow,
                "slow_share": float(slow.mean()), "worst_ms": float(c.max() / 1e3), "bursts": bursts}

    @staticmethod
    def describe(s: dict, seconds: float) -> str:
        if not s.get("units"):
            return "machine stalls: no probe ran"
        return (f"machine stalls (CPU time of a {s['median_us']:.0f} us unit of work every {s['period_ms']:g} ms): "
                f"{s['slow_share'] * 100:.1f}% of {s['units']} units took >= {s['slow']:g}x it, the worst "
                f"{s['worst_ms']:.1f} ms, in {s['bursts']} bursts over {seconds:g} s")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    probe = StallProbe().start()
    time.sleep(args.seconds)
    print(StallProbe.describe(probe.stop().summary(), args.seconds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
