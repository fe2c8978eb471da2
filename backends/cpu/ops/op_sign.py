"""Sign: -1, 0 or 1 per element, in the input's type (NaN stays NaN)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.ops._tail_util import unary_float
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import DType

__all__ = ["sign"]

_TYPES = frozenset(
    {
        DType.FLOAT16,
        DType.FLOAT,
        DType.DOUBLE,
        DType.BFLOAT16,
        DType.INT8,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.UINT8,
        DType.UINT16,
        DType.UINT32,
        DType.UINT64,
    }
)


@kernel("Sign", since=9, dtypes=_TYPES)
def sign(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        return np.sign(x)
    return unary_float(np.sign, x)
