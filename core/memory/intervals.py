"""Time-interval queries of the memory planner, in O(n log n) rather than O(n^2).

The planner places *groups* (tensors sharing one offset) that live over step intervals. Three
of its questions only concern groups that overlap in time, which on real graphs are few per
group; answering them by scanning every group made loading a 4,000-node chain take seconds:

* ``TimeIndex``: which already-placed groups overlap ``[first, last]`` (time buckets);
* ``breadth_order``: groups of the step with the most live bytes first, largest first within a
  step (a sweep for the live bytes at each step, a sparse table for range-argmax);
* ``chain_overlap``: whether two in-place chains overlap anywhere but the hinted pair (chains
  are in time order, so only their ends can meet).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["TimeIndex", "breadth_order", "chain_overlap"]


class TimeIndex:
    """Placed groups by the time buckets their ``[first, last]`` covers."""

    def __init__(self, horizon: int, n: int) -> None:
        self.width = max(1, (horizon + 1) // max(1, n) or 1)
        self.buckets: dict[int, list[Any]] = {}

    def add(self, g: Any) -> None:
        for b in range(g.first // self.width, g.last // self.width + 1):
            self.buckets.setdefault(b, []).append(g)

    def overlapping(self, first: int, last: int) -> Iterable[Any]:
        """The added groups whose interval meets ``[first, last]``, each once."""
        seen: set[int] = set()
        for b in range(first // self.width, last // self.width + 1):
            for g in self.buckets.get(b, ()):
                if id(g) not in seen and g.first <= last and first <= g.last:
                    seen.add(id(g))
                    yield g


def chain_overlap(head: Any, tail: Any, src: Any, out: Any, overlap: Callable) -> bool:
    """Whether any member of ``head`` overlaps any of ``tail`` in time, except ``src`` with
    ``out``. Members of a chain are in time order (each starts where the previous ends), so
    only head members ending at or after ``tail`` starts, and tail members starting at or
    before ``head`` ends, can meet."""
    for a in reversed(head.members):
        if a.last_use_step < tail.first:
            break
        for b in tail.members:
            if b.first_use_step > a.last_use_step:
                break
            if not (a is src and b is out) and overlap(a, b):
                return True
    return False


def breadth_order(groups: list[Any], rectangles: Callable[[Any], Iterable]) -> list[Any]:
    """Groups of the step with the most live bytes first (ties: the earlier step), largest
    first within a step, each group at the first such step it is live at; groups that are
    never live (zero size) last. ``rectangles(g)`` yields ``(first, last, size)``."""
    points = sorted({g.first for g in groups})
    rects = {id(g): list(rectangles(g)) for g in groups}
    totals = _live_at(points, (r for rs in rects.values() for r in rs))
    table = _SparseArgmax(totals)
    best: dict[int, int] = {}  # group -> index of its best point
    for g in groups:
        for first, last, _size in rects[id(g)]:
            lo, hi = bisect_left(points, first), bisect_right(points, last)
            if lo >= hi:
                continue
            i = table.argmax(lo, hi - 1)
            j = best.get(id(g))
            if j is None or (totals[i], -i) > (totals[j], -j):
                best[id(g)] = i
    rank = {i: r for r, i in enumerate(sorted(range(len(points)), key=lambda i: (-totals[i], i)))}
    live = [(rank[best[id(g)]], -g.size, k, g) for k, g in enumerate(groups) if id(g) in best]
    live.sort(key=lambda t: t[:3])
    return [t[3] for t in live] + [g for g in groups if id(g) not in best]


def _live_at(points: list[int], rects: Iterable[tuple[int, int, int]]) -> list[int]:
    """Bytes live at each point, from ``(first, last, size)`` rectangles (a sweep)."""
    events: list[tuple[int, int]] = []
    for first, last, size in rects:
        events.append((first, size))
        events.append((last + 1, -size))
    events.sort()
    totals, live, i = [], 0, 0
    for p in points:
        while i < len(events) and events[i][0] <= p:
            live += events[i][1]
            i += 1
        totals.append(live)
    return totals


class _SparseArgmax:
    """Range argmax over a fixed list (the smallest index among equal maxima)."""

    def __init__(self, values: list[int]) -> None:
        self.values = values
        self.levels = [list(range(len(values)))]
        k = 1
        while 2 * k <= len(values):
            prev = self.levels[-1]
            self.levels.append(
                [self._better(prev[i], prev[i + k]) for i in range(len(values) - 2 * k + 1)]
            )
            k *= 2

    def _better(self, i: int, j: int) -> int:
        return i if self.values[i] >= self.values[j] else j

    def argmax(self, lo: int, hi: int) -> int:
        level = (hi - lo + 1).bit_length() - 1
        row = self.levels[level]
        return self._better(row[lo], row[hi - (1 << level) + 1])
