"""Matrix products: MatMul (numpy ``matmul`` semantics, batched) and Gemm.

Both stay in the input dtype: float32 products run through BLAS in float32.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["matmul", "gemm"]

_MATMUL_TYPES = frozenset(
    {
        DType.FLOAT,
        DType.DOUBLE,
        DType.FLOAT16,
        DType.BFLOAT16,
        DType.INT32,
        DType.INT64,
        DType.UINT32,
        DType.UINT64,
    }
)


@kernel("MatMul", since=1, dtypes=_MATMUL_TYPES)
def matmul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """``a @ b`` with numpy's rules for 1-D operands and broadcast batch dimensions."""
    if a.ndim == 0 or b.ndim == 0:
        raise KernelError(f"MatMul needs operands of rank >= 1, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise KernelError(
            f"MatMul shapes {a.shape} and {b.shape} do not match: the last "
            "dimension of A must equal the second-to-last of B"
        )
    if a.dtype.itemsize < 4:
        # float16/bfloat16: accumulate in float32 and round once.
        return np.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
    if out is not None and a.dtype == b.dtype and fits(out, _matmul_shape(a, b), a.dtype):
        return np.matmul(a, b, out=out)
    return np.asarray(np.matmul(a, b))


def _matmul_shape(a: np.ndarray, b: np.ndarray) -> tuple[int, ...]:
    """The shape of ``a @ b`` (operands already checked to match)."""
    if a.ndim == 2 and b.ndim == 2:
        return (a.shape[0], b.shape[1])  # without np.broadcast_shapes' few microseconds
    if a.ndim == 1 and b.ndim == 1:
        return ()
    if a.ndim == 1:
        return b.shape[:-2] + b.shape[-1:]
    if b.ndim == 1:
        return a.shape[:-1]
    if b.ndim == 2:
        return a.shape[:-1] + b.shape[1:]  # activations times a weight: no broadcast to work out
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        return ()  # numpy names the mismatch on the fresh path
    return batch + (a.shape[-2], b.shape[-1])


@kernel("Gemm", since=1, dtypes=_MATMUL_TYPES)
def gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    broadcast: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``alpha * A' @ B' + beta * C`` with ``C`` broadcast to (M, N)."""
    if a.ndim != 2 or b.ndim != 2:
        raise KernelError(f"Gemm needs 2-D A and B, got shapes {a.shape} and {b.shape}")
    a = a.T if transA else a
    b = b.T if transB else b
    if a.shape[1] != b.shape[0]:
        raise KernelError(
            f"Gemm inner dimensions differ: A' is {a.shape}, B' is {b.shape}; check transA/transB"
        )
    out_dtype = a.dtype
    if a.dtype.itemsize < 4:
        a, b = a.astype(np.float32), b.astype(np.float32)
    if a.dtype == b.dtype == out_dtype and fits(out, (a.shape[0], b.shape[1]), out_dtype):
        y = np.dot(a, b, out=out)
    else:
        y = np.dot(a, b)
    if alpha != 1.0:
        y *= np.asarray(alpha, dtype=y.dtype)
    if c is not None and beta != 0.0:
        c = c if beta == 1.0 else c * np.asarray(beta, dtype=c.dtype)
        y += c.astype(y.dtype, copy=False)
    return y.astype(out_dtype, copy=False)
