"""CPU time of other processes, as the benchmarks measure a server beside its clients.

`cpu_seconds(pid)` is the user + system CPU of process `pid` and all its threads so far, from
/proc/PID/stat (Linux), in seconds. The benchmarks read it before and after their measured
seconds; a process's children are not in it (bench_vs_deephaven adds a JVM under its launcher
itself).
"""
from __future__ import annotations

import os

__all__ = ["cpu_seconds"]

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        # after the command name (in parentheses, and free to hold spaces): field 14 is utime, 15 stime
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS
