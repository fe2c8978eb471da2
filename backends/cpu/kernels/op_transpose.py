"""Transpose: permute axes (default: reverse them). The result is made contiguous so the
ops after it read memory in order. ``anychip::TransposeView`` (``passes/view_transposes.py``)
is the same permutation as a view, for readers that take strided input as fast."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["transpose", "transpose_view"]


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


@kernel(
    "TransposeView", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE), alias=True
)
def transpose_view(data: np.ndarray, *, perm: list[int]) -> np.ndarray:
    """``data`` with axes permuted by ``perm``, a view of ``data`` (no copy)."""
    if sorted(perm) != list(range(data.ndim)):
        raise KernelError(
            f"TransposeView: perm {perm} is not a permutation of the {data.ndim} axes of the input"
        )
    return data.transpose(perm)
