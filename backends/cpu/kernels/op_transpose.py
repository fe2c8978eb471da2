"""Transpose: permute axes (default: reverse them). The result is made contiguous so the
ops after it read memory in order."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["transpose"]


@kernel("Transpose", since=1)
def transpose(
    data: np.ndarray, *, perm: list[int] | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """``data`` with axes permuted by ``perm``."""
    if perm is not None and sorted(perm) != list(range(data.ndim)):
        raise KernelError(
            f"Transpose: perm {perm} is not a permutation of the {data.ndim} axes of the input"
        )
    view = np.transpose(data, perm)
    if fits(out, view.shape, data.dtype):
        np.copyto(out, view)
        return out
    return np.ascontiguousarray(view)
