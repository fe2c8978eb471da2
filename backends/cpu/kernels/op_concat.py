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
    # numpy checks ranks and the other dimensions (a Python loop over 92 inputs of
    # PolynomialFeatures cost more than the copy); its refusal is reworded below.
    try:
        if out is not None:
            first = arrays[0]
            shape = first.shape[:a] + (sum(x.shape[a] for x in arrays),) + first.shape[a + 1 :]
            if fits(out, shape, first.dtype):
                try:
                    return np.concatenate(arrays, axis=a, out=out, casting="no")
                except TypeError:
                    pass  # mixed dtypes: numpy's promotion, in a fresh array
        return np.concatenate(arrays, axis=a)
    except (ValueError, IndexError) as e:  # IndexError: an input of lower rank
        raise KernelError(
            f"Concat: input shapes {[t.shape for t in arrays]} differ outside axis {a} ({e})"
        ) from e
