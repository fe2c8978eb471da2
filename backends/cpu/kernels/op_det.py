"""Det: determinants of square matrices in the last two dimensions."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["det"]


@kernel("Det", since=11, dtypes=FLOAT_WITH_BF16)
def det(x: np.ndarray) -> np.ndarray:
    if x.ndim < 2 or x.shape[-1] != x.shape[-2]:
        raise ModelError(f"Det: input must be [..., M, M], got shape {x.shape}")
    work = compute_dtype(x.dtype)
    if work == np.float16:
        work = np.dtype(np.float32)  # LAPACK has no half precision
    return np.asarray(np.linalg.det(x.astype(work))).astype(x.dtype)
