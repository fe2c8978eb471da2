"""Activation kernels: Tanh, Sigmoid, Relu, LeakyRelu, Elu, Selu, Clip, Gelu, HardSigmoid,
HardSwish, Softplus; and the less common Celu, Mish, Shrink, Softsign, ThresholdedRelu, Swish,
SwiGLU, PRelu, whose float math runs in float32 for bfloat16 and float8 inputs.

Scalar attributes (alpha, beta, gamma) are cast to the input dtype before use so float32
activations never upcast to float64.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype, unary_float
from anychip.backends.cpu.kernels._out import fits, unary_into
from anychip.backends.cpu.table import kernel
from anychip.core.plugin.reference.erf import erf_array
from anychip.errors import KernelError, ModelError
from anychip.ir.dtypes import FLOAT_TYPES, NUMERIC_TYPES, DType

__all__ = [
    "tanh",
    "sigmoid",
    "relu",
    "leaky_relu",
    "elu",
    "selu",
    "clip_attrs",
    "clip",
    "gelu",
    "hard_sigmoid",
    "hard_swish",
    "softplus",
    "celu",
    "mish",
    "shrink",
    "softsign",
    "thresholded_relu",
    "swish",
    "swiglu",
    "prelu",
]


def _c(value: float, x: np.ndarray) -> np.ndarray:
    """A 0-d constant in the dtype of ``x``."""
    return np.asarray(value, dtype=x.dtype)


@kernel("Tanh", since=1, dtypes=FLOAT_TYPES, inplace=True)
def tanh(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Hyperbolic tangent."""
    return unary_into(np.tanh, x, out)


@kernel("Sigmoid", since=1, dtypes=FLOAT_TYPES, inplace=True)
def sigmoid(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``1 / (1 + exp(-x))``; exp overflow for very negative x correctly gives 0."""
    one = _c(1.0, x)
    with np.errstate(over="ignore"):
        if not fits(out, x.shape, x.dtype):
            return one / (one + np.exp(-x))
        np.negative(x, out=out)
        np.exp(out, out=out)
        np.add(one, out, out=out)
        return np.divide(one, out, out=out)


@kernel("Relu", since=1, dtypes=NUMERIC_TYPES, inplace=True)
def relu(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``max(x, 0)``; integer types are allowed from opset 14."""
    return unary_into(np.maximum, x, out, _c(0, x))


@kernel("LeakyRelu", since=1, dtypes=FLOAT_TYPES, inplace=True)
def leaky_relu(x: np.ndarray, *, alpha: float = 0.01, consumed_inputs=None, out=None) -> np.ndarray:
    """``x`` where positive, ``alpha * x`` elsewhere."""
    if not fits(out, x.shape, x.dtype):
        return np.where(x >= 0, x, x * _c(alpha, x))
    np.copyto(out, x)
    return np.multiply(out, _c(alpha, x), out=out, where=out < 0)


@kernel("Elu", since=1, dtypes=FLOAT_TYPES, inplace=True)
def elu(x: np.ndarray, *, alpha: float = 1.0, consumed_inputs=None) -> np.ndarray:
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""
    with np.errstate(over="ignore"):
        neg = _c(alpha, x) * np.expm1(np.minimum(x, _c(0, x)))
    return np.where(x > 0, x, neg)


@kernel("Selu", since=1, dtypes=FLOAT_TYPES, inplace=True)
def selu(
    x: np.ndarray,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
    consumed_inputs=None,
) -> np.ndarray:
    """``gamma * x`` where positive, ``gamma * alpha * (exp(x) - 1)`` elsewhere."""
    neg = _c(alpha, x) * np.expm1(np.minimum(x, _c(0, x)))
    return _c(gamma, x) * np.where(x > 0, x, neg)


def _clip(x: np.ndarray, lo, hi, into: np.ndarray | None = None) -> np.ndarray:
    if fits(into, x.shape, x.dtype):
        np.copyto(into, x)
        if lo is not None:
            np.maximum(into, np.asarray(lo, dtype=x.dtype), out=into)
        if hi is not None:
            np.minimum(into, np.asarray(hi, dtype=x.dtype), out=into)
        return into
    out = x
    if lo is not None:
        out = np.maximum(out, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        out = np.minimum(out, np.asarray(hi, dtype=x.dtype))
    # min > max clips everything to max, which this order already gives.
    # Never alias the input; numpy returns scalars for 0-d operands, hence asarray.
    return np.array(out, copy=True) if out is x else np.asarray(out)


@kernel("Clip", since=1, dtypes=FLOAT_TYPES, inplace=True)
def clip_attrs(
    x: np.ndarray,
    *,
    min: float | None = None,
    max: float | None = None,
    consumed_inputs=None,
    out=None,
) -> np.ndarray:
    """Opsets 1-10: bounds are attributes (unset means unbounded)."""
    return _clip(x, min, max, out)


@kernel("Clip", since=11, dtypes=NUMERIC_TYPES, inplace=True)
def clip(
    x: np.ndarray,
    min: np.ndarray | None = None,
    max: np.ndarray | None = None,
    *,
    out=None,
) -> np.ndarray:
    """Opset 11+: bounds are optional scalar inputs."""
    for name, bound in (("min", min), ("max", max)):
        if bound is not None and bound.size != 1:
            raise KernelError(f"Clip: input '{name}' must be a scalar, got shape {bound.shape}")
    return _clip(
        x,
        None if min is None else min.reshape(()),
        None if max is None else max.reshape(()),
        out,
    )


@kernel("Gelu", since=20, dtypes=FLOAT_TYPES)
def gelu(x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """``x * Phi(x)``; ``approximate='tanh'`` uses the tanh formula."""
    half = _c(0.5, x)
    one = _c(1.0, x)
    if approximate == "tanh":
        inner = _c(np.sqrt(2.0 / np.pi), x) * (x + _c(0.044715, x) * x * x * x)
        return half * x * (one + np.tanh(inner))
    if approximate != "none":
        raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return half * x * (one + erf_array(x * _c(1.0 / np.sqrt(2.0), x)))


@kernel("HardSigmoid", since=1, dtypes=FLOAT_TYPES, inplace=True)
def hard_sigmoid(
    x: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5, consumed_inputs=None, out=None
) -> np.ndarray:
    """``max(0, min(1, alpha * x + beta))``."""
    if not fits(out, x.shape, x.dtype):
        return np.clip(x * _c(alpha, x) + _c(beta, x), _c(0, x), _c(1, x))
    np.multiply(x, _c(alpha, x), out=out)
    np.add(out, _c(beta, x), out=out)
    return np.clip(out, _c(0, x), _c(1, x), out=out)


@kernel("HardSwish", since=14, dtypes=FLOAT_TYPES, inplace=True)
def hard_swish(x: np.ndarray) -> np.ndarray:
    """``x * max(0, min(1, x / 6 + 1 / 2))``."""
    return x * np.clip(x * _c(1.0 / 6.0, x) + _c(0.5, x), _c(0, x), _c(1, x))


@kernel("Softplus", since=1, dtypes=FLOAT_TYPES, inplace=True)
def softplus(x: np.ndarray, *, out=None) -> np.ndarray:
    """``log(exp(x) + 1)``, computed without overflow for large x."""
    if fits(out, x.shape, x.dtype):
        return np.logaddexp(_c(0, x), x, out=out)
    return np.logaddexp(_c(0, x), x)


# -- less common activations ----------------------------------------------------------------------
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


@kernel("PRelu", since=1, dtypes=FLOAT_WITH_BF16 | _INTS, inplace=True)
def prelu_v1(
    x: np.ndarray, slope: np.ndarray, *, consumed_inputs: list[int] | None = None
) -> np.ndarray:
    """Before opset 7 a slope that is not a single value holds one value per channel (axis 1)."""
    if slope.size > 1 and slope.ndim == 1 and x.ndim > 2 and slope.size == x.shape[1]:
        slope = slope.reshape((-1,) + (1,) * (x.ndim - 2))
    return prelu(x, slope)


@kernel("PRelu", since=7, dtypes=FLOAT_WITH_BF16 | _INTS, inplace=True)
def prelu(
    x: np.ndarray, slope: np.ndarray, *, consumed_inputs: list[int] | None = None
) -> np.ndarray:
    """Unidirectional (numpy) broadcasting of ``slope`` against ``x``."""
    if x.dtype.kind in "iu":
        return np.where(x < 0, x * slope, x).astype(x.dtype)
    work = compute_dtype(x.dtype)
    xw = x.astype(work)
    return np.where(xw < 0, xw * slope.astype(work), xw).astype(x.dtype)
