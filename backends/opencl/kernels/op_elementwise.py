"""Element-wise ops: unary activations and math, binary arithmetic with numpy broadcasting,
the variadic Sum/Mean/Max/Min, and Clip.

Two programs per element type: ``unary`` (one kernel per op, an expression in ``v`` with the
op's float attributes as ``p0``/``p1``) and ``binary`` (per op a dense kernel for equal
shapes and a strided one that broadcasts through a shape/stride table). Transcendentals are
OpenCL's built-ins (correctly rounded to a few ulp on conformant drivers); the ``fma()``
built-in is never used (PoCL does not inline it: a 10x slowdown, see
docs/decisions/018-opencl-on-pocl.md).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.opencl.driver import ClTensor
from anychip.backends.opencl.kernels._common import (
    collapse,
    contiguous_strides,
    ctype,
    dev,
    launch1d,
    scalar,
)
from anychip.backends.opencl.kernels.table import F, kernel
from anychip.errors import KernelError

__all__ = ["unary", "binary", "UNARY", "BINARY"]

#: op -> OpenCL C expression of ``v`` (the element) and ``p0``, ``p1`` (float attributes)
UNARY = {
    "Relu": "v < (T)0 ? (T)0 : v",  # NaN propagates (v > 0 ? v : 0 made it 0)
    "Sigmoid": "(T)1 / ((T)1 + exp(-v))",
    "Tanh": "tanh(v)",
    "Exp": "exp(v)",
    "Log": "log(v)",
    "Sqrt": "sqrt(v)",
    "Neg": "-v",
    "Abs": "fabs(v)",
    "Reciprocal": "(T)1 / v",
    "Floor": "floor(v)",
    "Ceil": "ceil(v)",
    "Round": "rint(v)",
    "Sign": "v > (T)0 ? (T)1 : (v < (T)0 ? (T)-1 : (T)0)",
    "Erf": "erf(v)",
    "Sin": "sin(v)",
    "Cos": "cos(v)",
    "Tan": "tan(v)",
    "Asin": "asin(v)",
    "Acos": "acos(v)",
    "Atan": "atan(v)",
    "Sinh": "sinh(v)",
    "Cosh": "cosh(v)",
    "Asinh": "asinh(v)",
    "Acosh": "acosh(v)",
    "Atanh": "atanh(v)",
    "Softsign": "v / ((T)1 + fabs(v))",
    "Softplus": "v > (T)0 ? v + log1p(exp(-v)) : log1p(exp(v))",
    "LeakyRelu": "v < (T)0 ? (T)p0 * v : v",
    "Elu": "v < (T)0 ? (T)p0 * (exp(v) - (T)1) : v",
    "Selu": "v > (T)0 ? (T)p1 * v : (T)p1 * ((T)p0 * exp(v) - (T)p0)",
    "Celu": "fmax((T)0, v) + fmin((T)0, (T)p0 * (exp(v / (T)p0) - (T)1))",
    "HardSigmoid": "fmax((T)0, fmin((T)1, (T)p0 * v + (T)p1))",
    "HardSwish": "v * fmax((T)0, fmin((T)1, v / (T)6 + (T)0.5))",
    "ThresholdedRelu": "v > (T)p0 ? v : (T)0",
    "Mish": "v * tanh(v > (T)0 ? v + log1p(exp(-v)) : log1p(exp(v)))",
    "Gelu": "(T)0.5 * v * ((T)1 + erf(v * (T)0.70710678118654752440))",
    "GeluTanh": "(T)0.5 * v * ((T)1 + tanh((T)0.79788456080286535588 * "
    "(v + (T)0.044715 * v * v * v)))",
    "Scale": "v * (T)p0",
    "Clip": "isnan(v) ? v : fmin(fmax(v, (T)p0), (T)p1)",
}

#: op -> OpenCL C expression of ``a`` and ``b``
BINARY = {
    "Add": "a + b",
    "Sub": "a - b",
    "Mul": "a * b",
    "Div": "a / b",
    "Pow": "pow(a, b)",
    "Max": "(a > b || isnan(a)) ? a : b",
    "Min": "(a < b || isnan(a)) ? a : b",
    "PRelu": "a < (T)0 ? a * b : a",
}


def _unary_source() -> str:
    parts = []
    for op, expr in UNARY.items():
        parts.append(
            f"__kernel void k_{op}(__global const T* x, __global T* y, float p0, float p1, "
            f"int n) {{ int i = get_global_id(0); if (i < n) {{ T v = x[i]; y[i] = {expr}; }} }}"
        )
    return "\n".join(parts)


#: integer exponent types Pow casts first -> their OpenCL C type
_INTS = {"int64": "long", "int32": "int", "uint64": "ulong", "uint32": "uint"}


def _binary_source() -> str:
    parts = [
        f"__kernel void k_cast_{it}(__global const {it}* x, __global T* y, int n) {{"
        " int i = get_global_id(0); if (i < n) y[i] = (T)x[i]; }"
        for it in _INTS.values()
    ]
    for op, expr in BINARY.items():
        parts.append(
            f"__kernel void k_{op}_dense(__global const T* A, __global const T* B, "
            f"__global T* y, int n) {{ int i = get_global_id(0); "
            f"if (i < n) {{ T a = A[i]; T b = B[i]; y[i] = {expr}; }} }}"
        )
        parts.append(
            f"__kernel void k_{op}_strided(__global const T* A, __global const T* B, "
            f"__global T* y, __global const int* m, int n) {{ int i = get_global_id(0); "
            "if (i >= n) return; int nd = m[0]; int r = i; int oa = 0, ob = 0; "
            "for (int d = nd - 1; d >= 0; --d) { int s = m[1 + d]; int q = r % s; r /= s; "
            "oa += q * m[1 + nd + d]; ob += q * m[1 + 2 * nd + d]; } "
            f"T a = A[oa]; T b = B[ob]; y[i] = {expr}; }}"
        )
    return "\n".join(parts)


def unary(op: str, x: ClTensor, p0: float = 0.0, p1: float = 0.0) -> ClTensor:
    """``y = op(x)`` for an op of :data:`UNARY`."""
    d = dev(x)
    ct = ctype(x.dtype, op)
    y = d.empty(x.shape, x.dtype)
    args = [x.buffer, y.buffer, np.float32(p0), np.float32(p1)]
    launch1d(d, "unary", ct, f"k_{op}", _unary_source, x.size, args)
    return y


def _broadcast(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise KernelError(f"{op}: shapes {list(a)} and {list(b)} do not broadcast") from None


def _bstrides(shape: tuple[int, ...], out: tuple[int, ...]) -> list[int]:
    st = contiguous_strides(shape)
    lead = len(out) - len(shape)
    return [0] * lead + [0 if s == 1 else t for s, t in zip(shape, st)]


def _cast(x: ClTensor, dtype: np.dtype, op: str) -> ClTensor:
    it = _INTS.get(x.dtype.name)
    if it is None:
        raise KernelError(f"{op}: cannot take {x.dtype} with {dtype} on OpenCL")
    d = dev(x)
    y = d.empty(x.shape, dtype)
    launch1d(
        d, "binary", ctype(dtype, op), f"k_cast_{it}", _binary_source, x.size, [x.buffer, y.buffer]
    )
    return y


def binary(op: str, a: ClTensor, b: ClTensor) -> ClTensor:
    """``y = a op b`` with numpy broadcasting, for an op of :data:`BINARY`."""
    d = dev(a, b)
    if a.dtype != b.dtype:
        cast = _cast(b, a.dtype, op)
        try:
            return binary(op, a, cast)
        finally:
            cast.release()
    ct = ctype(a.dtype, op)
    shape = _broadcast(op, a.shape, b.shape)
    y = d.empty(shape, a.dtype)
    n = y.size
    if a.shape == b.shape:
        args = [a.buffer, b.buffer, y.buffer]
        launch1d(d, "binary", ct, f"k_{op}_dense", _binary_source, n, args)
        return y
    dims, (sa, sb) = collapse(shape, [_bstrides(a.shape, shape), _bstrides(b.shape, shape)])
    meta = d.meta((len(dims), *dims, *sa, *sb))
    args = [a.buffer, b.buffer, y.buffer, meta]
    launch1d(d, "binary", ct, f"k_{op}_strided", _binary_source, n, args)
    return y


def _variadic(op: str, xs: tuple[ClTensor, ...]) -> ClTensor:
    if not xs:
        raise KernelError(f"{op} needs at least one input")
    if len(xs) == 1:
        return dev(xs[0]).copy(xs[0])
    acc = binary(op, xs[0], xs[1])
    for x in xs[2:]:
        nxt = binary(op, acc, x)
        acc.release()
        acc = nxt
    return acc


def _register_unary(op: str, since: int, until: int | None = None) -> None:
    def fn(x: ClTensor) -> ClTensor:
        return unary(op, x)

    fn.__name__ = f"opencl_{op.lower()}"
    kernel(op, since=since, until=until, dtypes=F)(fn)


for _op, _since in [
    ("Relu", 6), ("Sigmoid", 6), ("Tanh", 6), ("Exp", 6), ("Log", 6), ("Sqrt", 6), ("Neg", 6),
    ("Abs", 6), ("Reciprocal", 6), ("Floor", 6), ("Ceil", 6), ("Round", 11), ("Sign", 9),
    ("Erf", 9), ("Sin", 7), ("Cos", 7), ("Tan", 7), ("Asin", 7), ("Acos", 7), ("Atan", 7),
    ("Sinh", 9), ("Cosh", 9), ("Asinh", 9), ("Acosh", 9), ("Atanh", 9), ("Softsign", 1),
    ("Softplus", 1), ("HardSwish", 14), ("Mish", 18),
]:  # fmt: skip
    _register_unary(_op, _since)


@kernel("LeakyRelu", since=6, dtypes=F)
def leaky_relu(x: ClTensor, *, alpha: float = 0.01) -> ClTensor:
    return unary("LeakyRelu", x, alpha)


@kernel("Elu", since=6, dtypes=F)
def elu(x: ClTensor, *, alpha: float = 1.0) -> ClTensor:
    return unary("Elu", x, alpha)


@kernel("Selu", since=6, dtypes=F)
def selu(
    x: ClTensor,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
) -> ClTensor:
    return unary("Selu", x, alpha, gamma)


@kernel("Celu", since=12, dtypes=F)
def celu(x: ClTensor, *, alpha: float = 1.0) -> ClTensor:
    return unary("Celu", x, alpha)


@kernel("HardSigmoid", since=6, dtypes=F)
def hard_sigmoid(x: ClTensor, *, alpha: float = 0.2, beta: float = 0.5) -> ClTensor:
    return unary("HardSigmoid", x, alpha, beta)


@kernel("ThresholdedRelu", since=10, dtypes=F)
def thresholded_relu(x: ClTensor, *, alpha: float = 1.0) -> ClTensor:
    return unary("ThresholdedRelu", x, alpha)


@kernel("Gelu", since=20, dtypes=F)
def gelu(x: ClTensor, *, approximate: str = "none") -> ClTensor:
    if approximate not in ("none", "tanh"):
        raise KernelError(f"Gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return unary("GeluTanh" if approximate == "tanh" else "Gelu", x)


@kernel("Clip", since=6, until=10, dtypes=F)
def clip_v6(x: ClTensor, *, min: float = -3.4e38, max: float = 3.4e38) -> ClTensor:
    return unary("Clip", x, min, max)


@kernel("Clip", since=11, dtypes=F)
def clip(x: ClTensor, lo: ClTensor | None = None, hi: ClTensor | None = None) -> ClTensor:
    low, high = scalar(lo), scalar(hi)
    return unary("Clip", x, -np.inf if low is None else low, np.inf if high is None else high)


def _register_binary(op: str, since: int) -> None:
    def fn(a: ClTensor, b: ClTensor) -> ClTensor:
        return binary(op, a, b)

    fn.__name__ = f"opencl_{op.lower()}"
    kernel(op, since=since, dtypes=F)(fn)


for _op in ("Add", "Sub", "Mul", "Div", "Pow"):
    _register_binary(_op, 7)
_register_binary("PRelu", 9)


def _register_variadic(op: str, pairwise: str) -> None:
    def fn(*xs: ClTensor) -> ClTensor:
        out = _variadic(pairwise, xs)
        if op != "Mean" or len(xs) == 1:
            return out
        try:
            return unary("Scale", out, 1.0 / len(xs))
        finally:
            out.release()

    fn.__name__ = f"opencl_{op.lower()}"
    kernel(op, since=8, dtypes=F)(fn)


for _op, _pair in (("Sum", "Add"), ("Mean", "Add"), ("Max", "Max"), ("Min", "Min")):
    _register_variadic(_op, _pair)
