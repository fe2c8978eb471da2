"""Expand: broadcast the input to a shape (bidirectionally, like numpy)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["expand"]


@kernel("Expand", since=8)
def expand(x: np.ndarray, shape: np.ndarray) -> np.ndarray:
    """``x`` broadcast against ``shape``; the result is a real array, not a 0-stride view."""
    target = tuple(int_list(shape))
    try:
        out_shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise KernelError(f"Expand: input shape {x.shape} cannot broadcast to {target}") from None
    return np.array(np.broadcast_to(x, out_shape))
