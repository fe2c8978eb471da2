"""``anychip::MatMulAdd`` (``passes/fuse_gemm.py``): ``A @ B + C`` for an N-D activation, a
2-D weight and a bias along the last axis; the unfused MatMul's and Add's steps, in place in
the planned output: one dispatch and one pass over memory fewer per linear layer. Float32
through ``cpu/native/linear.py`` (the same sgemm, the bias added in C: the same results)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native.linear import linear
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["matmul_add", "add_bias"]


def add_bias(y: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``y + c``, in ``y`` when the sum keeps ``y``'s shape and dtype."""
    if c.ndim <= y.ndim and c.dtype == y.dtype and c.shape[-1:] in ((y.shape[-1],), (1,)):
        return np.add(y, c, out=y)
    return y + c


@kernel("MatMulAdd", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE))
def matmul_add(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, *, out: np.ndarray | None = None
) -> np.ndarray:
    """``a @ b + c`` (``b`` 2-D)."""
    if b.ndim != 2 or a.ndim < 1 or a.shape[-1] != b.shape[0]:
        raise KernelError(
            f"MatMulAdd needs A [..., K] and a 2-D B [K, N], got {a.shape} and {b.shape}"
        )
    y = linear(a, b, c, out)  # float32: sgemm and the bias in one C call
    if y is not None:
        return y
    shape = a.shape[:-1] + b.shape[1:]
    if a.dtype == b.dtype and fits(out, shape, a.dtype):
        y = np.matmul(a, b, out=out)
    else:
        y = np.matmul(a, b)
    return add_bias(y, c)
