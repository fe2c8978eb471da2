"""Timing shared by the benchmarks: best of ``repeat`` wall-clock runs after one warm-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TypeVar

__all__ = ["best_of", "progress", "bars"]

T = TypeVar("T")


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` calls of ``fn`` in seconds, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def progress(items: Iterable[T], what: str, total: int | None = None) -> Iterator[T]:
    """``items``, reported as a ``core.progress`` task (a rich bar on stderr in a terminal,
    inside ``bars()``; nothing otherwise)."""
    from anychip.core.progress import task

    items = list(items) if total is None and not hasattr(items, "__len__") else items
    with task(what, total if total is not None else len(items)) as advance:  # type: ignore[arg-type]
        for item in items:
            yield item
            advance(1)


def bars() -> AbstractContextManager[None]:
    """A benchmark's progress bars: rich's on stderr when it is a terminal and rich is
    installed (the ``viz`` extra), so piped output and the printed tables stay as they are."""
    from anychip.viz.terminal import progress_bars

    return progress_bars()
