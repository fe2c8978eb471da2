"""Element-wise kernels of the array-API family: unary maths, activations, binary arithmetic
and comparisons with broadcasting, variadic Max/Min/Sum/Mean, Where, Cast, Clip.

The standard has no ``erf``; ``erf`` below is the float32 rational approximation XLA and Eigen
use (odd polynomial over an even one on ``x`` clamped to [-4, 4]; its error is below 2 float32
ulps), computed in float32 for float16 and bfloat16 inputs.
"""

from __future__ import annotations

import math
from typing import Any

from anychip.backends.arrayapi.family._common import ANY, NUM, F, kernel, scalar
from anychip.backends.arrayapi.tensor import Space
from anychip.ir.dtypes import DType

__all__ = ["erf", "gelu_of"]

_ALPHA = (-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06,
          -5.69250639462346e-05, -7.34990630326855e-04, -2.95459980854025e-03,
          -1.60960333262415e-02)  # fmt: skip
_BETA = (-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
         -7.37332916720468e-03, -1.42647390514189e-02)  # fmt: skip


def _wide(s: Space, x: Any) -> tuple[Any, Any]:
    """``x`` in float32 when it is a narrower float (the result is cast back)."""
    xp = s.xp
    if x.dtype in (getattr(xp, "float16", None), getattr(xp, "bfloat16", None)):
        return xp.astype(x, xp.float32), x.dtype
    return x, None


def erf(s: Space, x: Any) -> Any:
    """The error function from standard operations (see the module docstring)."""
    xp = s.xp
    w, back = _wide(s, x)
    w = xp.clip(w, -4.0, 4.0)
    x2 = w * w
    p = x2 * _ALPHA[0] + _ALPHA[1]
    for c in _ALPHA[2:]:
        p = p * x2 + c
    q = x2 * _BETA[0] + _BETA[1]
    for c in _BETA[2:]:
        q = q * x2 + c
    out = w * p / q
    return out if back is None else xp.astype(out, back)


def gelu_of(s: Space, x: Any, approximate: str = "none") -> Any:
    """Gelu: exact (with ``erf``) or the tanh approximation."""
    xp = s.xp
    w, back = _wide(s, x)
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (w + 0.044715 * w * w * w)
        out = 0.5 * w * (1.0 + xp.tanh(inner))
    else:
        out = 0.5 * w * (1.0 + erf(s, w * (1.0 / math.sqrt(2.0))))
    return out if back is None else xp.astype(out, back)


def _sigmoid(s: Space, x: Any) -> Any:
    xp = s.xp
    e = xp.exp(-xp.abs(x))  # no overflow: exp of a non-positive number
    return xp.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


#: op -> (since, until, dtypes, fn(s, x))
_UNARY = {
    "Abs": (6, 13, NUM, lambda s, x: s.xp.abs(x)),
    "Neg": (6, 13, NUM, lambda s, x: s.xp.negative(x)),
    "Exp": (6, 13, F, lambda s, x: s.xp.exp(x)),
    "Log": (6, 13, F, lambda s, x: s.xp.log(x)),
    "Sqrt": (6, 13, F, lambda s, x: s.xp.sqrt(x)),
    "Floor": (6, 13, F, lambda s, x: s.xp.floor(x)),
    "Ceil": (6, 13, F, lambda s, x: s.xp.ceil(x)),
    "Reciprocal": (6, 13, F, lambda s, x: 1.0 / x),
    "Relu": (6, 14, NUM - {DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64},
             lambda s, x: s.xp.maximum(x, scalar(s, x, 0))),
    "Sigmoid": (6, 13, F, _sigmoid),
    "Tanh": (6, 13, F, lambda s, x: s.xp.tanh(x)),
    "Sin": (7, 22, F, lambda s, x: s.xp.sin(x)),
    "Cos": (7, 22, F, lambda s, x: s.xp.cos(x)),
    "Tan": (7, 22, F, lambda s, x: s.xp.tan(x)),
    "Asin": (7, 22, F, lambda s, x: s.xp.asin(x)),
    "Acos": (7, 22, F, lambda s, x: s.xp.acos(x)),
    "Atan": (7, 22, F, lambda s, x: s.xp.atan(x)),
    "Sinh": (9, 22, F, lambda s, x: s.xp.sinh(x)),
    "Cosh": (9, 22, F, lambda s, x: s.xp.cosh(x)),
    "Erf": (9, 13, F, erf),
    "Sign": (9, 13, NUM, lambda s, x: s.xp.sign(x)),
    "Round": (11, 22, F, lambda s, x: s.xp.round(x)),
    "Softplus": (1, 22, F, lambda s, x: s.xp.logaddexp(x, scalar(s, x, 0.0))),
    "Softsign": (1, 22, F, lambda s, x: x / (1.0 + s.xp.abs(x))),
    "Not": (1, 1, frozenset({DType.BOOL}), lambda s, x: s.xp.logical_not(x)),
    "IsNaN": (9, 20, F, lambda s, x: s.xp.isnan(x)),
    "HardSwish": (14, 22, F, lambda s, x: x * s.xp.clip(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)),
}  # fmt: skip


def _register_unary(op: str, since: int, until: int, dtypes: frozenset, fn: Any) -> None:
    def run(s: Space, x: Any) -> Any:
        return fn(s, x)

    run.__name__ = op.lower()
    kernel(op, since=since, until=until, dtypes=dtypes)(run)


for _op, (_since, _until, _dt, _fn) in _UNARY.items():
    _register_unary(_op, _since, _until, _dt, _fn)


@kernel("LeakyRelu", since=6, until=16)
def leaky_relu(s: Space, x: Any, *, alpha: float = 0.01) -> Any:
    return s.xp.where(x >= 0, x, x * alpha)


@kernel("Elu", since=6, until=22)
def elu(s: Space, x: Any, *, alpha: float = 1.0) -> Any:
    return s.xp.where(x > 0, x, alpha * s.xp.expm1(s.xp.minimum(x, scalar(s, x, 0.0))))


@kernel("Selu", since=6, until=22)
def selu(
    s: Space,
    x: Any,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
) -> Any:
    neg = alpha * s.xp.expm1(s.xp.minimum(x, scalar(s, x, 0.0)))
    return gamma * s.xp.where(x > 0, x, neg)


@kernel("HardSigmoid", since=6, until=22)
def hard_sigmoid(s: Space, x: Any, *, alpha: float = 0.2, beta: float = 0.5) -> Any:
    return s.xp.clip(x * alpha + beta, 0.0, 1.0)


@kernel("Gelu", since=20)
def gelu(s: Space, x: Any, *, approximate: str = "none") -> Any:
    return gelu_of(s, x, approximate)


@kernel("Clip", since=11, until=13, dtypes=NUM)
def clip(s: Space, x: Any, lo: Any = None, hi: Any = None) -> Any:
    xp = s.xp
    if lo is not None:
        x = xp.maximum(x, xp.reshape(lo, ()))
    if hi is not None:
        x = xp.minimum(x, xp.reshape(hi, ()))
    return x


@kernel("Clip", since=6, until=10)
def clip_v6(s: Space, x: Any, *, min: float = -3.4e38, max: float = 3.4e38) -> Any:
    return s.xp.minimum(s.xp.maximum(x, scalar(s, x, min)), scalar(s, x, max))


def _pow(s: Space, a: Any, b: Any) -> Any:
    if b.dtype != a.dtype:
        b = s.xp.astype(b, a.dtype)
    return s.xp.pow(a, b)


#: op -> (since, until, dtypes, fn(s, a, b))
_BINARY = {
    "Add": (7, 14, NUM, lambda s, a, b: s.xp.add(a, b)),
    "Sub": (7, 14, NUM, lambda s, a, b: s.xp.subtract(a, b)),
    "Mul": (7, 14, NUM, lambda s, a, b: s.xp.multiply(a, b)),
    "Div": (7, 14, F, lambda s, a, b: s.xp.divide(a, b)),
    "Pow": (7, 15, F, _pow),
    "Equal": (7, 19, ANY, lambda s, a, b: s.xp.equal(a, b)),
    "Less": (7, 13, NUM, lambda s, a, b: s.xp.less(a, b)),
    "Greater": (7, 13, NUM, lambda s, a, b: s.xp.greater(a, b)),
    "LessOrEqual": (12, 16, NUM, lambda s, a, b: s.xp.less_equal(a, b)),
    "GreaterOrEqual": (12, 16, NUM, lambda s, a, b: s.xp.greater_equal(a, b)),
    "And": (7, 7, frozenset({DType.BOOL}), lambda s, a, b: s.xp.logical_and(a, b)),
    "Or": (7, 7, frozenset({DType.BOOL}), lambda s, a, b: s.xp.logical_or(a, b)),
    "Xor": (7, 7, frozenset({DType.BOOL}), lambda s, a, b: s.xp.logical_xor(a, b)),
}  # fmt: skip


def _register_binary(op: str, since: int, until: int, dtypes: frozenset, fn: Any) -> None:
    def run(s: Space, a: Any, b: Any) -> Any:
        return fn(s, a, b)

    run.__name__ = op.lower()
    kernel(op, since=since, until=until, dtypes=dtypes)(run)


for _op, (_since, _until, _dt, _fn) in _BINARY.items():
    _register_binary(_op, _since, _until, _dt, _fn)


def _register_variadic(op: str, dtypes: frozenset) -> None:
    def run(s: Space, *xs: Any) -> Any:
        xp = s.xp
        pair = {"Max": xp.maximum, "Min": xp.minimum, "Sum": xp.add, "Mean": xp.add}[op]
        out = xs[0]
        for x in xs[1:]:
            out = pair(out, x)
        if op == "Mean":
            out = out / float(len(xs))
        return out

    run.__name__ = op.lower()
    kernel(op, since=8, until=13, dtypes=dtypes)(run)


for _op, _dt in (("Max", NUM), ("Min", NUM), ("Sum", F), ("Mean", F)):
    _register_variadic(_op, _dt)


@kernel("Where", since=9, until=16, dtypes=ANY, dtype_input=1)
def where(s: Space, cond: Any, a: Any, b: Any) -> Any:
    return s.xp.where(cond, a, b)


@kernel("Cast", since=6, until=21, dtypes=ANY)
def cast(s: Space, x: Any, *, to: int, saturate: int = 1, round_mode: str = "up") -> Any:
    target = s.xdtype(DType(int(to)).numpy)
    return s.xp.astype(x, target)
