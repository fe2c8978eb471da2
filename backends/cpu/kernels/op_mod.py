"""Mod: remainder with the divisor's sign (``fmod=0``) or the dividend's sign (``fmod=1``)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import STANDARD_NUMERIC_TYPES

__all__ = ["mod"]

_TYPES = STANDARD_NUMERIC_TYPES


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
