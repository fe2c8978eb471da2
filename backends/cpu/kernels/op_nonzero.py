"""NonZero: the int64 indices of the non-zero elements, one row per dimension."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel

__all__ = ["non_zero"]


@kernel("NonZero", since=9)
def non_zero(x: np.ndarray) -> np.ndarray:
    if x.ndim == 0:
        # A scalar has no dimensions to index: the result is [0, count].
        return np.zeros((0, int(bool(x))), dtype=np.int64)
    mask = x != 0 if x.dtype.kind != "V" else x.astype(np.float32) != 0
    return np.asarray(np.nonzero(mask), dtype=np.int64).reshape(x.ndim, -1)
