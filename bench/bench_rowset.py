"""Row-set codec throughput: ranges/s for 10k- and 1M-range sets.

Reference measured in the same run: pyroaring's BitMap64 serialize/deserialize of the same set
(a C codec), so the printed ratio says how the vectorized Python codec compares with native code.
Usage: python bench/bench_rowset.py [--quick]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from pyroaring import BitMap64

from tickwire.protocol.rowset import decode_rowset, encode_rowset


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def make_ranges(n: int, rng: np.random.Generator, shape: str) -> np.ndarray:
    if shape == "dense":  # small gaps and lengths: byte/short arrays
        gaps = rng.integers(2, 100, n)
        lens = rng.integers(0, 50, n)
    else:  # large gaps: one OFFSET command per delta (the decoder's worst case)
        gaps = rng.integers(40_000, 10_000_000, n)
        lens = rng.integers(0, 100_000, n)
    starts = np.cumsum(gaps + np.concatenate(([0], lens[:-1])))
    return np.stack((starts, starts + lens), axis=1).astype(np.int64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rng = np.random.default_rng(1)
    sizes = [10_000, 100_000] if args.quick else [10_000, 1_000_000]
    print(f"{'ranges':>9} {'shape':>6} {'bytes':>10} {'encode r/s':>12} {'decode r/s':>12} "
          f"{'roaring ser r/s':>16} {'roaring de r/s':>15} {'enc ratio':>9} {'dec ratio':>9}")
    for n in sizes:
        for shape in ("dense", "sparse"):
            r = make_ranges(n, rng, shape)
            repeat = 5 if n <= 100_000 else 2
            data = encode_rowset(r)
            assert np.array_equal(decode_rowset(data), r)
            t_enc = best_of(lambda r=r: encode_rowset(r), repeat)
            t_dec = best_of(lambda data=data: decode_rowset(data), repeat)
            bm = BitMap64()
            for s, e in r.tolist():
                bm.add_range(s, e + 1)
            blob = bm.serialize()
            t_rser = best_of(bm.serialize, repeat)
            t_rde = best_of(lambda blob=blob: BitMap64.deserialize(blob), repeat)
            print(f"{n:>9} {shape:>6} {len(data):>10} {n / t_enc:>12.3g} {n / t_dec:>12.3g} "
                  f"{n / t_rser:>16.3g} {n / t_rde:>15.3g} {t_rser / t_enc:>9.2f} {t_rde / t_dec:>9.2f}")
    print("ratio = roaring time / tickwire time (>= 1.0: tickwire's codec is at least as fast as roaring's)")


if __name__ == "__main__":
    main()
