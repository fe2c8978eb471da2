"""Hardmax: 1 at the first maximum along an axis, 0 elsewhere.

Opsets 1 and 11 flatten the input to 2-D at ``axis`` ([prod(d[:axis]), prod(d[axis:])]) and
take the maximum per row; opset 13 works along the single axis.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, normalize_axis
from anychip.backends.cpu.table import kernel

__all__ = ["hardmax_1", "hardmax"]


def _one_hot_max(x: np.ndarray, axis: int) -> np.ndarray:
    keys = x if x.dtype.kind == "f" else x.astype(np.float32)
    idx = np.expand_dims(np.argmax(keys, axis=axis), axis)
    out = np.zeros(x.shape, dtype=x.dtype)
    np.put_along_axis(out, idx, x.dtype.type(1), axis=axis)
    return out


@kernel("Hardmax", since=1, until=12, dtypes=FLOAT_WITH_BF16)
def hardmax_1(x: np.ndarray, *, axis: int = 1) -> np.ndarray:
    axis = normalize_axis(axis, x.ndim, "Hardmax")
    rows = int(np.prod(x.shape[:axis], dtype=np.int64))
    return _one_hot_max(x.reshape(rows, -1), 1).reshape(x.shape)


@kernel("Hardmax", since=13, dtypes=FLOAT_WITH_BF16)
def hardmax(x: np.ndarray, *, axis: int = -1) -> np.ndarray:
    return _one_hot_max(x, normalize_axis(axis, x.ndim, "Hardmax"))
