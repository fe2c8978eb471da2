"""Shape (with opset-15 ``start``/``end`` slicing) and Size; both return int64."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel

__all__ = ["shape", "size"]


@kernel("Shape", since=1)
def shape(data: np.ndarray, *, start: int = 0, end: int | None = None) -> np.ndarray:
    """The dims of ``data`` from ``start`` to ``end`` (clamped, negatives from the back)."""
    dims = np.array(data.shape, dtype=np.int64)
    return dims[start:end].copy()


@kernel("Size", since=1)
def size(data: np.ndarray) -> np.ndarray:
    """The number of elements of ``data`` as an int64 scalar."""
    return np.array(data.size, dtype=np.int64)
