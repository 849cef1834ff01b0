"""How long the random runs run: `make test` runs each a short while, `make soak` (TICKWIRE_SOAK, a
positive integer) runs every seed for TICKWIRE_SOAK times the steps. TICKWIRE_SEED replays one seed.
"""
from __future__ import annotations

import os
from typing import Sequence


def soak_factor() -> int:
    """The step multiplier from TICKWIRE_SOAK (default 1)."""
    raw = os.environ.get("TICKWIRE_SOAK", "1").strip() or "1"
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"TICKWIRE_SOAK must be a positive integer, got {raw!r}") from None
    if n < 1:
        raise ValueError(f"TICKWIRE_SOAK must be a positive integer, got {raw!r}")
    return n


def scaled(steps: int) -> int:
    return int(steps) * soak_factor()


def seeds(every: Sequence[int], in_make_test: int) -> list[int]:
    """TICKWIRE_SEED alone when set; else every seed under `make soak` and the first
    `in_make_test` of them in `make test`."""
    if "TICKWIRE_SEED" in os.environ:
        return [int(os.environ["TICKWIRE_SEED"])]
    return list(every) if soak_factor() > 1 else list(every[:in_make_test])
