"""Flatten: reshape to 2-D, rows from the dims before ``axis``, columns from the rest."""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["flatten"]


@kernel("Flatten", since=1, alias=True)
def flatten(x: np.ndarray, *, axis: int = 1) -> np.ndarray:
    """``x`` as (prod(shape[:axis]), prod(shape[axis:])); ``axis`` may equal the rank."""
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a <= x.ndim:
        raise KernelError(f"Flatten: axis {axis} is out of range for rank {x.ndim}")
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))
