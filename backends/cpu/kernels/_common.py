"""Helpers shared by the long-tail CPU kernels (not an op module: ``load_all`` skips it)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anychip.errors import ModelError
from anychip.ir.dtypes import DType

__all__ = [
    "FLOAT_BASIC",
    "FLOAT_WITH_BF16",
    "NATIVE_FLOATS",
    "compute_dtype",
    "unary_float",
    "normalize_axis",
]

# Opset <= 21 float ops take f16/f32/f64; later versions add bfloat16.
FLOAT_BASIC = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE})
FLOAT_WITH_BF16 = FLOAT_BASIC | {DType.BFLOAT16}
NATIVE_FLOATS = (np.float16, np.float32, np.float64)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype numpy computes ``dtype`` in: itself for native floats, else float32.

    bfloat16 and the float8 types from ml_dtypes lack most ufunc loops and lose precision in
    intermediate results, so kernels compute in float32 and cast the result back.
    """
    if dtype.type in NATIVE_FLOATS:
        return dtype
    return np.dtype(np.float32)


def unary_float(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Apply a numpy float function, computing in float32 for types numpy lacks loops for."""
    work = compute_dtype(x.dtype)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore", under="ignore"):
        out = fn(x.astype(work, copy=False))
    return np.asarray(out).astype(x.dtype, copy=False)


def normalize_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` in ``[-rank, rank)`` made non-negative, or a ModelError naming the op."""
    if not -rank <= axis < max(rank, 1):
        raise ModelError(
            f"{op}: axis {axis} is out of range for a rank-{rank} input "
            f"(allowed [{-rank}, {rank - 1}])"
        )
    return axis + rank if axis < 0 else axis
