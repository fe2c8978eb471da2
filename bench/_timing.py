"""Timing shared by the benchmarks: best of ``repeat`` wall-clock runs after one warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["best_of"]


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn`` in seconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)
