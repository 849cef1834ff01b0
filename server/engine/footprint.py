"""What an object holds in memory: the bytes of the arrays, Arrow data, row sets and Python objects
reachable from it, for finding out which table (or publisher, or session) a long-running
server's memory grows in.

    reachable_bytes(table, stop=lambda o: isinstance(o, Table))

walks from `table` through attributes, slots and containers, and adds up numpy arrays (each
buffer once, views counted as their base), Arrow arrays, tables and buffers, roaring bitmaps and
the Python objects on the way. It does not go into anything `stop` names (other than the root),
nor into functions, bound methods, classes, modules, threads and locks: a table's listeners lead
to its subscribers, which are counted where they live. Data two roots share (a join's
redirection into its inputs' columns) is counted under each.

A diagnosis aid: it visits every object reachable from the root, so its cost follows the
number of Python objects (not rows held in arrays). Callers read tables at a cycle boundary
(`Engine.memory_by_table`). Touches no engine state itself.
"""
from __future__ import annotations

import collections
import sys
import threading
import types
from typing import Any, Callable

import numpy as np
import pyarrow as pa

__all__ = ["reachable_bytes"]

_LEAVES = (str, bytes, bytearray, int, float, complex, bool, type(None), memoryview)
_OPAQUE = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.ModuleType, type,
           types.CodeType, types.FrameType, types.GeneratorType, threading.Thread,
           type(threading.Lock()), type(threading.RLock()), threading.Condition, threading.Event)
_ARROW = (pa.Array, pa.ChunkedArray, pa.RecordBatch, pa.Table)

try:  # row sets
    from pyroaring import BitMap, BitMap64

    _ROARING: tuple[type, ...] = (BitMap, BitMap64)
except ImportError:  # pragma: no cover - pyroaring is a core dependency
    _ROARING = ()


def _roaring_bytes(bm: Any) -> int:
    try:
        return int(bm.get_serialized_size_in_bytes())
    except Exception:  # noqa: BLE001 - older pyroaring: its cardinality as 32-bit values
        return 4 * len(bm)


def reachable_bytes(root: object, *, stop: Callable[[object], bool] = lambda o: False,
                    max_objects: int = 5_000_000, attempts: int = 3) -> int:
    """Bytes held by what is reachable from `root` (see the module's docstring). A container
    another thread changes while it is read makes the walk start again, `attempts` times at
    most (then the RuntimeError is raised)."""
    for attempt in range(attempts):
        try:
            return _walk(root, stop, max_objects)
        except RuntimeError:
            if attempt == attempts - 1:
                raise
    return 0


def _walk(root: object, stop: Callable[[object], bool], max_objects: int) -> int:
    seen: set[int] = set()
    buffers: set[int] = set()
    total = 0
    todo: list[object] = [root]
    visited = 0
    while todo and visited < max_objects:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        visited += 1
        if isinstance(o, np.ndarray):
            base = o
            while isinstance(base.base, np.ndarray):
                base = base.base
            total += sys.getsizeof(o) - (o.nbytes if o.flags.owndata else 0)
            if id(base) not in buffers:
                buffers.add(id(base))
                total += base.nbytes
            if o.dtype == object:
                todo.extend(o.ravel().tolist())
            continue
        if isinstance(o, _LEAVES):
            total += sys.getsizeof(o)
            continue
        if isinstance(o, _ARROW):
            total += o.get_total_buffer_size()
            continue
        if isinstance(o, pa.Buffer):
            total += o.size
            continue
        if _ROARING and isinstance(o, _ROARING):
            total += _roaring_bytes(o)
            continue
        if isinstance(o, _OPAQUE) or (o is not root and stop(o)):
            continue
        try:
            total += sys.getsizeof(o)
        except TypeError:
            pass
        if isinstance(o, dict):
            todo.extend(o.keys())
            todo.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset, collections.deque)):
            todo.extend(o)
        else:
            d = getattr(o, "__dict__", None)
            if isinstance(d, dict):
                todo.append(d)
            for cls in type(o).__mro__:
                slots = getattr(cls, "__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if name not in ("__dict__", "__weakref__"):
                        v = getattr(o, name, None)
                        if v is not None:
                            todo.append(v)
    return total
