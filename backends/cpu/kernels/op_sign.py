"""Sign: -1, 0 or 1 per element, in the input's type (NaN stays NaN)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import unary_float
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import STANDARD_NUMERIC_TYPES

__all__ = ["sign"]

_TYPES = STANDARD_NUMERIC_TYPES


@kernel("Sign", since=9, dtypes=_TYPES)
def sign(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "iu":
        return np.sign(x)
    return unary_float(np.sign, x)
