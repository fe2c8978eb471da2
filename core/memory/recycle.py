"""Output arrays handed to the caller and taken again once the caller has dropped them.

A partition's outputs leave the arena (the caller keeps them), so each run made them anew:
``np.empty`` of a few MiB, which glibc serves with fresh pages once it has given the last
ones back to the system (its heap top is trimmed past ``M_TRIM_THRESHOLD``, larger blocks are
``mmap``-ed). A fresh page costs a fault on first touch: a convolution with a 3 MiB output
(64 x 111 x 111) ran 3.5 ms a run alone in a process, 1,508 faults a run, against 0.58 ms for
the same kernel into memory already touched; onnxruntime, whose outputs come from its own
arena, read 0.54 ms and 2 faults in a process of its own. In a process where another engine
had raised glibc's thresholds (the bench's interleaved runs) the faults were gone, so the
table never showed it.

So a partition keeps the arrays it handed out (``Outputs``). At the next run an output whose
array nobody else references is handed to its kernel as the ``out`` view (the executor's out
protocol), or the replay copies its result there. "Nobody else" is Python's own count: the
caller's array, any view of it (a view's ``base`` is the array that owns the memory), a
``memoryview``, a DLPack capsule or a cffi buffer all hold a reference, and so make the array
the caller's; only when the count is down to the partition's own is the memory reused. The
count an array alone has is measured once at import (it differs between Python versions),
through the same code that reads it at run time. Arrays under ``MIN_BYTES`` are not kept:
glibc hands those out of its heap without new pages.

Like onnxruntime's arena and PyTorch's caching allocator, this holds the outputs' memory
between runs: about the bytes of one run's outputs a partition.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

__all__ = ["Outputs", "MIN_BYTES"]

#: Outputs smaller than this are made anew each run (glibc's heap serves them warm).
MIN_BYTES = 1 << 16


def _pop(kept: dict[int, np.ndarray], i: int) -> tuple[np.ndarray | None, int]:
    """``kept.pop(i)`` and the references its array then has (0 where there was none).
    The pop is one call, so two threads running the same partition never take one array."""
    a = kept.pop(i, None)
    return a, (sys.getrefcount(a) if a is not None else 0)


#: References of an array held by nothing but the local that ``_pop`` returns it to.
_ALONE = _pop({0: np.empty(1)}, 0)[1]


class Outputs:
    """The output arrays of one partition's last runs, by output index.

    ``take(i, shape, dtype)`` gives output ``i``'s kept array when it has that shape and
    dtype and nobody else holds it, else None; ``copy(i, a)`` is ``a``'s copy in that array
    (or a new one); ``keep(outs)`` keeps a run's outputs that own their memory for the next
    run. ``reused`` counts the arrays handed out again.
    """

    __slots__ = ("_kept", "reused")

    def __init__(self) -> None:
        self._kept: dict[int, np.ndarray] = {}
        self.reused = 0

    def take(self, i: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
        a, refs = _pop(self._kept, i)
        if a is None or refs > _ALONE or a.shape != shape or a.dtype != dtype:
            return None  # the caller's now (or another shape): made anew, kept after the run
        self.reused += 1
        return a

    def copy(self, i: int, a: np.ndarray) -> np.ndarray:
        """``a``'s values in output ``i``'s kept array, or in a new one."""
        if a.nbytes >= MIN_BYTES:
            mine = self.take(i, a.shape, a.dtype)
            if mine is not None:
                np.copyto(mine, a)
                return mine
        return a.copy()

    def keep(self, outs: list[Any]) -> None:
        """Keep the arrays of ``outs`` that own at least ``MIN_BYTES``, by index."""
        kept = self._kept
        for i, o in enumerate(outs):
            if type(o) is np.ndarray and o.base is None and o.nbytes >= MIN_BYTES:
                kept[i] = o
