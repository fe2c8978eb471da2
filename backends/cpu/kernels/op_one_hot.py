"""OneHot: expand indices into a one-hot tensor with ``values = [off, on]`` along ``axis``."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["one_hot"]


@kernel("OneHot", since=9)
def one_hot(
    indices: np.ndarray, depth: np.ndarray, values: np.ndarray, *, axis: int = -1
) -> np.ndarray:
    d = int(np.asarray(depth).reshape(-1)[0])
    if d <= 0:
        raise ModelError(f"OneHot: depth must be positive, got {d}")
    rank = indices.ndim + 1
    if not -rank <= axis < rank:
        raise ModelError(f"OneHot: axis {axis} out of range for output rank {rank}")
    axis = axis + rank if axis < 0 else axis
    idx = np.asarray(indices).astype(np.int64)
    idx = np.where(idx < 0, idx + d, idx)  # negative indices count from the end
    shape = [1] * rank
    shape[axis] = d
    classes = np.arange(d).reshape(shape)
    hot = np.expand_dims(idx, axis) == classes
    off, on = values.reshape(-1)[0], values.reshape(-1)[1]
    return np.where(hot, on, off).astype(values.dtype)
