"""Compress: keep the slices along ``axis`` (or elements of the flattened input) where the
boolean condition is true."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import normalize_axis
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["compress"]


@kernel("Compress", since=9)
def compress(x: np.ndarray, condition: np.ndarray, *, axis: int | None = None) -> np.ndarray:
    cond = np.asarray(condition, dtype=np.bool_).reshape(-1)
    data = x.reshape(-1) if axis is None else x
    ax = 0 if axis is None else normalize_axis(axis, x.ndim, "Compress")
    n = data.shape[ax]
    if cond.size > n:
        if cond[n:].any():
            raise ModelError(f"Compress: condition has a true entry past the axis length {n}")
        cond = cond[:n]
    return np.compress(cond, data, axis=ax)
