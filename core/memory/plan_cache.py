"""A bounded LRU cache of memory plans keyed by the input shapes, for dynamic shapes.

A model with dynamic dimensions needs a new plan when its input shapes change. The cache keeps
the plans of the last ``maxsize`` shape signatures, so alternating between a few shapes (batch
1 and batch 8) plans each once::

    cache = PlanCache(maxsize=8)
    plan = cache.get_or_plan(shape_signature(feeds), lambda: plan_memory(lifetimes_for(feeds)))

Counters: ``hits`` (found), ``misses`` (not found: planned), ``replans`` (planned again for a
signature planned before and evicted since: the cache is too small for the shapes in use),
``evictions``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["PlanCache", "shape_signature"]

#: What a cache holds: a ``MemoryPlan``, or a caller's plans of several (``core/run/memory.py``).
P = TypeVar("P")


def shape_signature(inputs: Mapping[str, Any]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """A hashable key for a set of inputs: sorted ``(name, dtype, shape)``.

    Values may be arrays (anything with ``.shape``, and ``.dtype`` if known) or bare shapes.
    """
    items = []
    for name, value in inputs.items():
        shape = getattr(value, "shape", value)
        dtype = str(getattr(value, "dtype", ""))
        items.append((name, dtype, tuple(int(d) for d in shape)))
    return tuple(sorted(items))


class PlanCache(Generic[P]):
    """LRU of plans (``MemoryPlan``, or any plan object ``P``) by signature (see the module
    docstring). Thread-safe.

    Args:
        maxsize: Plans kept (>= 1).
    """

    def __init__(self, maxsize: int = 16) -> None:
        if maxsize < 1:
            raise ValueError(f"PlanCache maxsize must be >= 1, got {maxsize}")
        self.maxsize = maxsize
        self._plans: OrderedDict[Hashable, P] = OrderedDict()
        # Signatures evicted earlier, to tell a re-plan from a first plan; bounded too.
        self._evicted: OrderedDict[Hashable, None] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.replans = 0
        self.evictions = 0

    def get(self, signature: Hashable) -> P | None:
        """The cached plan for ``signature`` (now the most recently used), or None; counts a
        hit or a miss."""
        with self._lock:
            plan = self._plans.get(signature)
            if plan is None:
                self.misses += 1
                return None
            self._plans.move_to_end(signature)
            self.hits += 1
            return plan

    def put(self, signature: Hashable, plan: P) -> None:
        """Store ``plan``, evicting the least recently used one past ``maxsize``."""
        with self._lock:
            if self._evicted.pop(signature, False) is None:
                self.replans += 1
            self._plans[signature] = plan
            self._plans.move_to_end(signature)
            while len(self._plans) > self.maxsize:
                old, _ = self._plans.popitem(last=False)
                self.evictions += 1
                self._evicted[old] = None
                if len(self._evicted) > 4 * self.maxsize:
                    self._evicted.popitem(last=False)

    def get_or_plan(self, signature: Hashable, make_plan: Callable[[], P]) -> P:
        """The cached plan for ``signature``, or ``make_plan()`` stored under it.

        Two threads missing the same signature at once may both plan; the later plan wins,
        which is harmless because plans for one signature are interchangeable.
        """
        plan = self.get(signature)
        if plan is None:
            plan = make_plan()
            self.put(signature, plan)
        return plan

    def clear(self) -> None:
        """Drop every plan and zero the counters."""
        with self._lock:
            self._plans.clear()
            self._evicted.clear()
            self.hits = self.misses = self.replans = self.evictions = 0

    def __len__(self) -> int:
        return len(self._plans)

    def __contains__(self, signature: Hashable) -> bool:
        return signature in self._plans

    def __repr__(self) -> str:
        return (
            f"PlanCache({len(self)}/{self.maxsize} plans, hits={self.hits}, "
            f"misses={self.misses}, replans={self.replans}, evictions={self.evictions})"
        )
