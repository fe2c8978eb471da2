"""ArgMax and ArgMin: int64 indices of the extreme along one axis (first or last on ties)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import normalize_axis
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import STANDARD_NUMERIC_TYPES

__all__ = ["arg_max", "arg_min", "ARG_TYPES"]

ARG_TYPES = STANDARD_NUMERIC_TYPES


def _arg(
    fn: object, x: np.ndarray, axis: int, keepdims: int, select_last_index: int, op: str
) -> np.ndarray:
    if x.dtype.kind not in "iuf" or x.dtype.type is np.longdouble:
        x = x.astype(np.float32)  # bfloat16: order-preserving widening
    axis = normalize_axis(axis, x.ndim, op)
    if select_last_index:
        n = x.shape[axis]
        idx = n - 1 - fn(np.flip(x, axis=axis), axis=axis)
    else:
        idx = fn(x, axis=axis)
    idx = np.asarray(idx, dtype=np.int64)
    return np.expand_dims(idx, axis) if keepdims else idx


@kernel("ArgMax", since=1, dtypes=ARG_TYPES)
def arg_max(
    x: np.ndarray, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
) -> np.ndarray:
    return _arg(np.argmax, x, axis, keepdims, select_last_index, "ArgMax")


@kernel("ArgMin", since=1, dtypes=ARG_TYPES)
def arg_min(
    x: np.ndarray, *, axis: int = 0, keepdims: int = 1, select_last_index: int = 0
) -> np.ndarray:
    return _arg(np.argmin, x, axis, keepdims, select_last_index, "ArgMin")
