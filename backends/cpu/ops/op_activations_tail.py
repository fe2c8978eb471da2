"""Less common activations: Celu, Mish, Shrink, Softsign, ThresholdedRelu, Swish, SwiGLU,
PRelu. Float math runs in float32 for bfloat16 and float8 inputs and is cast back."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.ops._tail_util import FLOAT_WITH_BF16, compute_dtype, unary_float
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError
from anychip.ir.dtypes import DType

__all__ = ["celu", "mish", "shrink", "softsign", "thresholded_relu", "swish", "swiglu", "prelu"]

_INTS = frozenset(
    {
        DType.INT8,
        DType.INT16,
        DType.INT32,
        DType.INT64,
        DType.UINT8,
        DType.UINT16,
        DType.UINT32,
        DType.UINT64,
    }
)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


@kernel("Celu", since=12, dtypes=FLOAT_WITH_BF16)
def celu(x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    def f(v: np.ndarray) -> np.ndarray:
        a = v.dtype.type(alpha)
        return np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a))

    return unary_float(f, x)


@kernel("Mish", since=18, dtypes=FLOAT_WITH_BF16)
def mish(x: np.ndarray) -> np.ndarray:
    return unary_float(lambda v: v * np.tanh(np.logaddexp(v.dtype.type(0), v)), x)


@kernel("Shrink", since=9, dtypes=FLOAT_WITH_BF16 | _INTS)
def shrink(x: np.ndarray, *, bias: float = 0.0, lambd: float = 0.5) -> np.ndarray:
    work = x.astype(np.float64) if x.dtype.kind in "iu" else x.astype(compute_dtype(x.dtype))
    out = np.where(work < -lambd, work + bias, np.where(work > lambd, work - bias, 0))
    return out.astype(x.dtype)


@kernel("Softsign", since=1, dtypes=FLOAT_WITH_BF16)
def softsign(x: np.ndarray) -> np.ndarray:
    return unary_float(lambda v: v / (1 + np.abs(v)), x)


@kernel("ThresholdedRelu", since=10, dtypes=FLOAT_WITH_BF16)
def thresholded_relu(x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return unary_float(lambda v: np.where(v > alpha, v, v.dtype.type(0)), x)


@kernel("Swish", since=24, dtypes=FLOAT_WITH_BF16)
def swish(x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    return unary_float(lambda v: v * _sigmoid(v.dtype.type(alpha) * v), x)


@kernel("SwiGLU", since=28, dtypes=FLOAT_WITH_BF16)
def swiglu(a: np.ndarray, b: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    if a.shape != b.shape:
        raise ModelError(
            f"SwiGLU: gate A {a.shape} and value B {b.shape} must have the same "
            "shape (the operator does not broadcast)"
        )
    work = compute_dtype(a.dtype)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        g = a.astype(work)
        out = g * _sigmoid(work.type(alpha) * g) * b.astype(work)
    return out.astype(a.dtype)


@kernel("PRelu", since=1, dtypes=FLOAT_WITH_BF16 | _INTS)
def prelu_v1(
    x: np.ndarray, slope: np.ndarray, *, consumed_inputs: list[int] | None = None
) -> np.ndarray:
    """Before opset 7 a slope that is not a single value holds one value per channel (axis 1)."""
    if slope.size > 1 and slope.ndim == 1 and x.ndim > 2 and slope.size == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return prelu(x, slope)


@kernel("PRelu", since=7, dtypes=FLOAT_WITH_BF16 | _INTS)
def prelu(
    x: np.ndarray, slope: np.ndarray, *, consumed_inputs: list[int] | None = None
) -> np.ndarray:
    """Unidirectional (numpy) broadcasting of ``slope`` against ``x``."""
    if x.dtype.kind in "iu":
        return np.where(x < 0, x * slope, x).astype(x.dtype)
    work = compute_dtype(x.dtype)
    xw = x.astype(work)
    return np.where(xw < 0, xw * slope.astype(work), xw).astype(x.dtype)
