"""Range: ``start + i * delta`` for ``i < max(ceil((limit - start) / delta), 0)``."""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["range_"]

_TYPES = frozenset(
    {
        DType.FLOAT,
        DType.DOUBLE,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.FLOAT16,
        DType.BFLOAT16,
    }
)


@kernel("Range", since=11, dtypes=_TYPES)
def range_(
    start: np.ndarray, limit: np.ndarray, delta: np.ndarray, *, stash_type: int = 1
) -> np.ndarray:
    """Integers are exact; float16/bfloat16 are computed in float32 (opset 27's stash_type
    default, and no less exact for opset 11) and cast back."""
    dt = start.dtype
    s, lim, d = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if d == 0:
        raise KernelError("Range: delta must not be 0")
    if dt.kind in "iu":
        si, li, di = int(s), int(lim), int(d)
        n = max(-((si - li) // di), 0)
        return (si + np.arange(n, dtype=np.int64) * di).astype(dt)
    work = np.float64 if dt == np.float64 else np.float32
    if dt.itemsize < 4 and stash_type != 1:
        work = dt
    sw, lw, dw = (np.asarray(v, dtype=work) for v in (s, lim, d))
    n = max(math.ceil(float((lw - sw) / dw)), 0)
    return (sw + np.arange(n, dtype=work) * dw).astype(dt)
