"""LRN: local response normalisation across channels (AlexNet, GoogLeNet)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["lrn"]


@kernel("LRN", since=1, dtypes={DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})
def lrn(
    x: np.ndarray,
    *,
    alpha: float = 1e-4,
    beta: float = 0.75,
    bias: float = 1.0,
    size: int | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``x / (bias + alpha / size * sum of x^2 over a channel window) ** beta``."""
    if size is None or size < 1:
        raise KernelError(f"LRN: attribute 'size' must be a positive odd int, got {size}")
    if x.ndim < 3:
        raise KernelError(f"LRN needs an input (N, C, ...) of rank >= 3, got shape {x.shape}")
    c = x.shape[1]
    before = (size - 1) // 2
    after = size - 1 - before
    sq = np.square(x)
    padded = np.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2))
    acc = np.zeros_like(x)
    for i in range(size):
        acc += padded[:, i : i + c]
    dt = x.dtype
    scale = np.asarray(bias, dt) + np.asarray(alpha / size, dt) * acc
    np.power(scale, np.asarray(beta, dt), out=scale)
    if fits(out, x.shape, dt):
        return np.divide(x, scale, out=out)
    return x / scale
