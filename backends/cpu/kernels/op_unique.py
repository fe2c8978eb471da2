"""Unique: distinct values or slices, with first-occurrence indices, inverse map and counts.

``sorted=1`` returns ascending values; ``sorted=0`` keeps the order of first occurrence.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import normalize_axis
from anychip.backends.cpu.table import kernel

__all__ = ["unique"]


@kernel("Unique", since=11, context=True)
def unique(
    ctx: object, x: np.ndarray, *, axis: int | None = None, sorted: int = 1
) -> tuple[np.ndarray, ...]:
    keys = x if x.dtype.kind in "iufbUSO" else x.astype(np.float32)
    if axis is None:
        _, first, inverse, counts = np.unique(
            keys.reshape(-1), return_index=True, return_inverse=True, return_counts=True
        )
        ax = 0
        source = x.reshape(-1)
    else:
        ax = normalize_axis(axis, x.ndim, "Unique")
        _, first, inverse, counts = np.unique(
            keys, return_index=True, return_inverse=True, return_counts=True, axis=ax
        )
        source = x
    inverse = inverse.reshape(-1)
    if not sorted:
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    y = np.take(source, first, axis=ax)
    outs = (y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64))
    return outs[: max(getattr(ctx, "num_outputs", 4), 1)]
