"""TopK: the k largest (or smallest) values along an axis and their int64 indices.

Equal values keep the lower index first, as the spec asks; ``sorted=0`` still returns a
sorted result (any order is allowed then).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import normalize_axis
from anychip.backends.cpu.kernels.op_argmax_argmin import ARG_TYPES
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["top_k_1", "top_k"]


def _top_k(x: np.ndarray, k: int, axis: int, largest: int) -> tuple[np.ndarray, np.ndarray]:
    axis = normalize_axis(axis, x.ndim, "TopK")
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ModelError(f"TopK: k={k} must lie in [0, {n}] (the size of axis {axis})")
    keys = x if x.dtype.kind in "iuf" else x.astype(np.float32)
    if largest:
        # Stable descending order with ties by ascending index: sort the flipped array
        # ascending (stable), reverse, and map positions back.
        order = np.flip(np.argsort(np.flip(keys, axis=axis), axis=axis, kind="stable"), axis=axis)
        order = n - 1 - order
    else:
        order = np.argsort(keys, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return np.take_along_axis(x, idx, axis=axis), idx


@kernel("TopK", since=1, until=9, dtypes=ARG_TYPES)
def top_k_1(x: np.ndarray, *, k: int, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    return _top_k(x, int(k), axis, 1)


@kernel("TopK", since=10, dtypes=ARG_TYPES)
def top_k(
    x: np.ndarray, k: np.ndarray, *, axis: int = -1, largest: int = 1, sorted: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    return _top_k(x, int(np.asarray(k).reshape(-1)[0]), axis, largest)
