"""Concat: join inputs along ``axis`` (opset 1 defaults it to 1; negative from opset 11)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import norm_axis
from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["concat"]


@kernel("Concat", since=1)
def concat(
    *inputs: np.ndarray, axis: int | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """All inputs share every dimension except ``axis``."""
    arrays = [x for x in inputs if x is not None]
    if not arrays:
        raise KernelError("Concat needs at least one input")
    a = norm_axis(1 if axis is None else axis, arrays[0].ndim, "Concat")
    for x in arrays[1:]:
        if x.ndim != arrays[0].ndim or any(
            d1 != d2 for i, (d1, d2) in enumerate(zip(x.shape, arrays[0].shape)) if i != a
        ):
            raise KernelError(
                f"Concat: input shapes {[t.shape for t in arrays]} differ outside axis {a}"
            )
    first = arrays[0]
    if out is not None and all(x.dtype == first.dtype for x in arrays):
        shape = first.shape[:a] + (sum(x.shape[a] for x in arrays),) + first.shape[a + 1 :]
        if fits(out, shape, first.dtype):
            return np.concatenate(arrays, axis=a, out=out)
    return np.concatenate(arrays, axis=a)
