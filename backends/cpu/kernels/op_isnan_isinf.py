"""IsNaN and IsInf: boolean masks of a float tensor (float8 types included)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import FLOAT_TYPES

__all__ = ["is_nan", "is_inf"]


def _as_float(x: np.ndarray) -> np.ndarray:
    # float32 holds every NaN/Inf of the narrower types, and numpy's tests work on it.
    return x if x.dtype.type in (np.float16, np.float32, np.float64) else x.astype(np.float32)


@kernel("IsNaN", since=9, dtypes=FLOAT_TYPES)
def is_nan(x: np.ndarray) -> np.ndarray:
    return np.isnan(_as_float(x))


@kernel("IsInf", since=10, dtypes=FLOAT_TYPES)
def is_inf(x: np.ndarray, *, detect_negative: int = 1, detect_positive: int = 1) -> np.ndarray:
    f = _as_float(x)
    out = np.zeros(f.shape, dtype=np.bool_)
    if detect_positive:
        out |= np.isposinf(f)
    if detect_negative:
        out |= np.isneginf(f)
    return out
