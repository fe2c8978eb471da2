"""The cyclic garbage collector paused while a model loads.

A load makes IR objects by the hundred thousand (values, nodes, their copies for the
compiler, plan entries), all alive until the load returns. Each of those allocations counts
towards the collector's thresholds, and each full collection walks every live object, so a
large graph's load spent a growing share of its time in collections that free nothing: a
20,000-node chain loaded 40% faster with the collector off (``bench/load_scale.py``).
CPython's own advice for such phases is to pause the collector; reference counting still
frees everything acyclic as usual.

The pause is process-wide, so it is counted: the collector is enabled again when the last
concurrent load leaves, and only if it was enabled when the first one came in.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["gc_paused"]

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector for the ``with`` body (nested and threaded uses counted)."""
    global _depth, _was_enabled
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
