"""Einsum: numpy's einsum on the equation (implicit and explicit output forms)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["einsum"]


@kernel("Einsum", since=12)
def einsum(*inputs: np.ndarray, equation: str) -> np.ndarray:
    out_dtype = inputs[0].dtype
    work = [x if x.dtype.kind in "iub" else x.astype(compute_dtype(x.dtype)) for x in inputs]
    try:
        out = np.einsum(equation.replace(" ", ""), *work)
    except ValueError as e:
        shapes = ", ".join(str(x.shape) for x in inputs)
        raise ModelError(
            f"Einsum: equation {equation!r} does not fit inputs {shapes}: {e}"
        ) from None
    return np.asarray(out).astype(out_dtype, copy=False)
