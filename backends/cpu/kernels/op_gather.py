"""Gather: take slices along ``axis`` at the given (possibly negative) indices."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import norm_axis
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["gather"]


@kernel("Gather", since=1)
def gather(data: np.ndarray, indices: np.ndarray, *, axis: int = 0) -> np.ndarray:
    """``output`` has shape ``data.shape[:axis] + indices.shape + data.shape[axis + 1:]``."""
    a = norm_axis(axis, data.ndim, "Gather")
    dim = data.shape[a]
    idx = indices.astype(np.int64, copy=False)
    try:  # np.take checks [-dim, dim) itself, as ONNX asks (no min and max passes: 5 us)
        return np.take(data, idx, axis=a)
    except IndexError:
        raise KernelError(
            f"Gather: indices must lie in [{-dim}, {dim - 1}] for axis {axis} "
            f"of size {dim}; got min {idx.min()}, max {idx.max()}"
        ) from None
