"""Mod: remainder with the divisor's sign (``fmod=0``) or the dividend's sign (``fmod=1``)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.ops._tail_util import compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import DType

__all__ = ["mod"]

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


@kernel("Mod", since=10, dtypes=_TYPES)
def mod(a: np.ndarray, b: np.ndarray, *, fmod: int = 0) -> np.ndarray:
    out_dtype = np.result_type(a, b)
    if out_dtype.kind in "iu":
        # Integer division by zero is undefined in the spec; numpy yields 0 without a trap.
        with np.errstate(divide="ignore", invalid="ignore"):
            return (np.fmod(a, b) if fmod else np.mod(a, b)).astype(out_dtype, copy=False)
    work = compute_dtype(out_dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        a32 = a.astype(work, copy=False)
        b32 = b.astype(work, copy=False)
        out = np.fmod(a32, b32) if fmod else np.mod(a32, b32)
    return out.astype(out_dtype, copy=False)
