"""Arithmetic element-wise kernels: Add, Sub, Mul, Div, Pow, Sum, Mean, Max, Min and unary math.

Binary ops broadcast numpy-style from opset 7; opsets 1-6 broadcast only when ``broadcast=1``,
aligning ``B`` with ``A`` from ``axis`` (the legacy rule). Results keep the input dtype: float32
stays float32, integer division truncates toward zero like C, integer Pow stays integer.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits_broadcast, unary_into
from anychip.backends.cpu.table import kernel
from anychip.core.plugin.reference.erf import erf_array
from anychip.errors import KernelError
from anychip.ir.dtypes import FLOAT_TYPES, INT_TYPES, NUMERIC_TYPES, DType

__all__ = [
    "add",
    "sub",
    "mul",
    "div",
    "pow_",
    "sum_",
    "mean",
    "max_",
    "min_",
    "neg",
    "abs_",
    "sqrt",
    "exp",
    "log",
    "reciprocal",
    "floor",
    "ceil",
    "erf",
    "erf_array",
    "legacy_broadcast",
]

_SIGNED = FLOAT_TYPES | {DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.INT4}


def legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis: int | None) -> np.ndarray:
    """Reshape ``b`` for the opset 1-6 broadcast rule (``b`` aligned with ``a`` at ``axis``)."""
    if not broadcast or axis is None or b.ndim == 0:
        return b
    axis = axis + a.ndim if axis < 0 else axis
    trailing = a.ndim - axis - b.ndim
    if trailing < 0:
        raise KernelError(
            f"legacy broadcast: B of shape {b.shape} does not fit A of shape {a.shape} at axis "
            f"{axis}; fix the 'axis' attribute or upgrade the model to opset 7+"
        )
    return b.reshape(b.shape + (1,) * trailing)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer division truncating toward zero (C semantics), not numpy's floor division."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor_divide(a, b)
        if a.dtype.kind == "u":
            return q
        r = np.remainder(a, b)
    fix = (r != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "iu":
        return _int_div(a, b)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.divide(a, b)


def ieee_power(x: np.ndarray, y: np.ndarray | np.generic) -> np.ndarray:
    """``np.power`` with C's ``pow`` at the two points numpy's shortcut changes: a size-1
    exponent of 0.5 is taken as ``sqrt``, which gives NaN for -inf and -0 for -0, where C99's
    ``pow`` (onnxruntime's Pow, the fused kernel's C, the XPU and OpenCL) gives +inf and +0."""
    r = np.power(x, y)
    if np.size(y) == 1 and r.dtype.kind == "f" and float(np.ravel(y)[0]) == 0.5:
        r = np.asarray(r)
        np.copyto(r, np.inf, where=np.isneginf(x))
        r += 0.0  # -0 + 0 is +0 when rounding to nearest; every other value stays
    return r


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x ** y`` with the dtype of ``x`` (ONNX Pow's output type is the base's)."""
    if x.dtype.kind in "iu":
        if y.dtype.kind in "iu" and not (y < 0).any():
            return np.power(x, y.astype(x.dtype, copy=False))
        with np.errstate(all="ignore"):
            return np.power(x.astype(np.float64), y.astype(np.float64)).astype(x.dtype)
    with np.errstate(all="ignore"):
        if y.size == 1 and y.ndim <= x.ndim and x.dtype.kind == "f" and y.item() == 3.0:
            # x * x * x, as onnxruntime's Pow and the fused kernel's C (codegen/onnx_ops.py)
            return x * x * x
        return ieee_power(x, y.astype(x.dtype, copy=False))


def _binary(name: str, fn, dtypes, ufunc=None, kinds: str = "biufc") -> None:
    """Register the opset-1/6 (legacy broadcast) and opset-7 (numpy broadcast) kernels.

    ``ufunc`` computes ``fn`` straight into a planned ``out`` for inputs of the dtype kinds
    ``kinds`` (the out protocol, ``_out.py``); other inputs get a fresh array from ``fn``.
    """

    @kernel(name, since=1, dtypes=dtypes, inplace=True)
    def legacy(a, b, *, broadcast=0, axis=None, consumed_inputs=None):
        return np.asarray(fn(a, legacy_broadcast(a, b, broadcast, axis)))

    if ufunc is None:

        @kernel(name, since=7, dtypes=dtypes, inplace=True)
        def modern(a, b):
            return np.asarray(fn(a, b))

    else:
        quiet = name == "Div"  # the others warn as their fresh-array path does

        @kernel(name, since=7, dtypes=dtypes, inplace=True)
        def modern(a, b, *, out=None):
            if a.dtype.kind in kinds and fits_broadcast(out, a, b):
                if not quiet:
                    return ufunc(a, b, out=out)  # np.errstate costs ~1.7 us a call
                with np.errstate(divide="ignore", invalid="ignore"):
                    return ufunc(a, b, out=out)
            return np.asarray(fn(a, b))

    legacy.__name__ = f"{name.lower()}_legacy"
    modern.__name__ = name.lower()


def add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b`` with broadcasting; integer overflow wraps like C."""
    return np.add(a, b)


def sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a - b`` with broadcasting."""
    return np.subtract(a, b)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` with broadcasting."""
    return np.multiply(a, b)


def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a / b``; integers truncate toward zero."""
    return _div(a, b)


def pow_(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``x ** y`` in the dtype of ``x``."""
    return _pow(x, y)


_binary("Add", add, NUMERIC_TYPES, np.add)
_binary("Sub", sub, NUMERIC_TYPES, np.subtract)
_binary("Mul", mul, NUMERIC_TYPES, np.multiply)
_binary("Div", div, NUMERIC_TYPES, np.divide, kinds="fc")  # integers truncate: fresh array
_binary("Pow", pow_, NUMERIC_TYPES)


def _variadic(fn, arrays: tuple[np.ndarray, ...], out: np.ndarray | None = None) -> np.ndarray:
    """Fold ``fn`` over ``arrays``, into ``out`` when it fits (the first step may read the
    first input from the memory it writes: in-place)."""
    if not arrays:
        raise KernelError("variadic op got no inputs; it needs at least one")
    if fits_broadcast(out, *arrays) and not any(np.may_share_memory(out, a) for a in arrays[2:]):
        if len(arrays) == 1:
            np.copyto(out, arrays[0])
            return out
        fn(arrays[0], arrays[1], out=out)
        for a in arrays[2:]:
            fn(out, a, out=out)
        return out
    out = arrays[0]
    for a in arrays[1:]:
        out = fn(out, a)
    # One input: return a copy so the output never aliases a graph input. Several: numpy
    # returns a scalar for 0-d operands, which asarray turns back into an array.
    return np.array(out, copy=True) if len(arrays) == 1 else np.asarray(out)


@kernel("Sum", since=1, dtypes=NUMERIC_TYPES, inplace=True)
def sum_(*data: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Element-wise sum of all inputs (numpy broadcasting from opset 8)."""
    return _variadic(np.add, data, out)


@kernel("Mean", since=1, dtypes=FLOAT_TYPES, inplace=True)
def mean(*data: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Element-wise mean of all inputs."""
    total = _variadic(np.add, data, out)
    if total is out:
        return np.divide(out, np.asarray(len(data), dtype=out.dtype), out=out)
    return np.asarray(total / np.asarray(len(data), dtype=total.dtype))


@kernel("Max", since=1, dtypes=NUMERIC_TYPES, inplace=True)
def max_(*data: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Element-wise maximum; NaN propagates."""
    return _variadic(np.maximum, data, out)


@kernel("Min", since=1, dtypes=NUMERIC_TYPES, inplace=True)
def min_(*data: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Element-wise minimum; NaN propagates."""
    return _variadic(np.minimum, data, out)


@kernel("Neg", since=1, dtypes=_SIGNED | {DType.COMPLEX64, DType.COMPLEX128}, inplace=True)
def neg(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``-x``."""
    return unary_into(np.negative, x, out)


@kernel("Abs", since=1, dtypes=NUMERIC_TYPES, inplace=True)
def abs_(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``|x|`` in the input dtype."""
    return unary_into(np.abs, x, out)


@kernel("Sqrt", since=1, dtypes=FLOAT_TYPES, inplace=True)
def sqrt(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Square root; negative inputs give NaN."""
    with np.errstate(invalid="ignore"):
        return unary_into(np.sqrt, x, out)


@kernel("Exp", since=1, dtypes=FLOAT_TYPES, inplace=True)
def exp(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``e ** x``."""
    with np.errstate(over="ignore"):
        return unary_into(np.exp, x, out)


@kernel("Log", since=1, dtypes=FLOAT_TYPES, inplace=True)
def log(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Natural logarithm; 0 gives -inf, negatives NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return unary_into(np.log, x, out)


@kernel("Reciprocal", since=1, dtypes=FLOAT_TYPES, inplace=True)
def reciprocal(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """``1 / x``."""
    with np.errstate(divide="ignore"):
        return unary_into(np.reciprocal, x, out)


@kernel("Floor", since=1, dtypes=FLOAT_TYPES, inplace=True)
def floor(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Round toward -inf."""
    return unary_into(np.floor, x, out)


@kernel("Ceil", since=1, dtypes=FLOAT_TYPES, inplace=True)
def ceil(x: np.ndarray, consumed_inputs=None, out=None) -> np.ndarray:
    """Round toward +inf."""
    return unary_into(np.ceil, x, out)


@kernel("Erf", since=9, dtypes=FLOAT_TYPES | INT_TYPES, inplace=True)
def erf(x: np.ndarray) -> np.ndarray:
    """The Gauss error function; integer inputs are evaluated in float64 and cast back."""
    if x.dtype.kind in "iu":
        return np.rint(erf_array(x.astype(np.float64))).astype(x.dtype)
    return erf_array(x)
