"""Slot lifetimes, shared by the two interpreters over numbered slots: the session's step
runner (``core/run/steps.py``) and the executor's ``Program`` (``core/run/program.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["free_after_last_use", "release_quietly"]


def free_after_last_use(
    touches: Sequence[Iterable[int]], keep: Iterable[int] = ()
) -> list[tuple[int, ...]]:
    """For each step, the slots to free after it: those it is the last to touch.

    Args:
        touches: per step, the slots it reads or writes (negative slots are ignored).
        keep: slots never freed (outputs, inputs, constants).

    Example:
        >>> free_after_last_use([(0, 1), (1, 2), (2, 3)], keep=[3])
        [(0,), (1,), (2,)]
    """
    last: dict[int, int] = {}
    for i, slots in enumerate(touches):
        for s in slots:
            if s >= 0:
                last[s] = i
    kept = set(keep)
    frees: list[list[int]] = [[] for _ in touches]
    for s, i in last.items():
        if s not in kept:
            frees[i].append(s)
    return [tuple(f) for f in frees]


def release_quietly(release: Any, tensors: Sequence[Any]) -> None:
    """Release every tensor, ignoring failures: used on error paths (the run's own error is the
    one to report) and at teardown (the driver may already be gone)."""
    for t in tensors:
        try:
            release(t)
        except Exception:
            pass
