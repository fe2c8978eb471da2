"""EyeLike: a 2-D tensor of the input's shape with ones on the k-th diagonal."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError
from anychip.ir.dtypes import DType

__all__ = ["eye_like"]


@kernel("EyeLike", since=9)
def eye_like(x: np.ndarray, *, dtype: int | None = None, k: int = 0) -> np.ndarray:
    if x.ndim != 2:
        raise ModelError(f"EyeLike: input must be 2-D, got shape {x.shape}")
    out = DType(dtype).numpy if dtype is not None else x.dtype
    return np.eye(x.shape[0], x.shape[1], k=k, dtype=np.float32).astype(out)
