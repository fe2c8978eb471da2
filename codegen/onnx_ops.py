"""ONNX element-wise ops lowered onto the expression primitives (``codegen/expr.py``).

``lower(op_type, args, attributes)`` returns the ``Expr`` of one ONNX node given the
expressions of its inputs, or None when the node cannot be expressed (a non-constant Clip
bound, a Pow exponent that is not a scalar constant, an unknown approximation). Each lowering
keeps the CPU kernel's formula, so a fused chain computes what the unfused nodes compute:

* LeakyRelu: ``x >= 0 ? x : alpha * x``; Relu: ``max(x, 0)`` (NaN propagates);
* HardSigmoid: ``min(max(alpha * x + beta, 0), 1)``; HardSwish: ``x * HardSigmoid(x, 1/6, 1/2)``;
* Gelu: ``0.5 * x * (1 + erf(x / sqrt 2))``, or the tanh form;
* Clip: ``min(max(x, lo), hi)`` with absent bounds left out;
* Pow: ``x * x`` for exponent 2 (what numpy does), ``x * x * x`` for 3 (what onnxruntime's
  Pow does; glibc's scalar ``powf`` kept the whole loop from vectorizing: the tanh-GELU of the
  GPT-2 exports ran 5x slower), ``1 / x`` for -1, else ``pow``.
"""

from __future__ import annotations

import math
from typing import Any

from anychip.codegen.expr import Expr, call, const, is_const

__all__ = ["ELEMENTWISE_OPS", "lower"]

_UNARY = {
    "Neg": "neg",
    "Abs": "abs",
    "Exp": "exp",
    "Log": "log",
    "Sqrt": "sqrt",
    "Tanh": "tanh",
    "Erf": "erf",
    "Sigmoid": "sigmoid",
    "Reciprocal": "recip",
}
_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "Div": "div"}
_OTHER = (
    "Relu",
    "LeakyRelu",
    "HardSigmoid",
    "HardSwish",
    "Gelu",
    "Clip",
    "Pow",
    "Max",
    "Min",
)
#: The ONNX (default-domain) ops the element-wise fusion takes.
ELEMENTWISE_OPS = frozenset(_UNARY) | frozenset(_BINARY) | frozenset(_OTHER)


def _hard_sigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    lin = call("add", call("mul", x, const(alpha)), const(beta))
    return call("min", call("max", lin, const(0.0)), const(1.0))


def _gelu(x: Expr, approximate: str) -> Expr | None:
    half, one = const(0.5), const(1.0)
    if approximate == "tanh":
        cube = call("mul", call("mul", call("mul", const(0.044715), x), x), x)
        inner = call("mul", const(math.sqrt(2.0 / math.pi)), call("add", x, cube))
        return call("mul", call("mul", half, x), call("add", one, call("tanh", inner)))
    if approximate != "none":
        return None
    phi = call("add", one, call("erf", call("mul", x, const(1.0 / math.sqrt(2.0)))))
    return call("mul", call("mul", half, x), phi)


def _clip(x: Expr, lo: Expr | None, hi: Expr | None) -> Expr | None:
    for b in (lo, hi):
        if b is not None and b.op != "const":
            return None
    if lo is not None:
        x = call("max", x, lo)
    if hi is not None:
        x = call("min", x, hi)
    return x


def _pow(x: Expr, e: Expr) -> Expr | None:
    if e.op != "const":
        return None
    if is_const(e, 1.0):
        return x
    if is_const(e, 2.0):
        return call("mul", x, x)
    if is_const(e, 3.0):
        return call("mul", call("mul", x, x), x)
    if is_const(e, -1.0):
        return call("recip", x)
    return call("pow", x, e)


def _fold(op: str, args: list[Expr]) -> Expr:
    out = args[0]
    for a in args[1:]:
        out = call(op, out, a)
    return out


def lower(op_type: str, args: list[Expr | None], attributes: dict[str, Any]) -> Expr | None:
    """The expression of ONNX ``op_type`` over ``args`` (None for an omitted optional input),
    or None when it cannot be fused. ``attributes``: the node's attributes as Python values
    (defaults applied by the caller)."""
    a = attributes
    if op_type in _UNARY:
        return call(_UNARY[op_type], args[0])
    if op_type in _BINARY:
        return call(_BINARY[op_type], args[0], args[1])
    if op_type in ("Max", "Min"):
        return _fold(op_type.lower(), list(args)) if all(x is not None for x in args) else None
    x = args[0]
    if op_type == "Relu":
        return call("max", x, const(0.0))
    if op_type == "LeakyRelu":
        alpha = const(a.get("alpha", 0.01))
        return call("select", call("ge", x, const(0.0)), x, call("mul", x, alpha))
    if op_type == "HardSigmoid":
        return _hard_sigmoid(x, a.get("alpha", 0.2), a.get("beta", 0.5))
    if op_type == "HardSwish":
        return call("mul", x, _hard_sigmoid(x, 1.0 / 6.0, 0.5))
    if op_type == "Gelu":
        return _gelu(x, a.get("approximate", "none"))
    if op_type == "Clip":
        if "min" in a or "max" in a:  # opset < 11: attributes
            lo, hi = a.get("min"), a.get("max")
            return _clip(x, None if lo is None else const(lo), None if hi is None else const(hi))
        padded = list(args) + [None, None]
        return _clip(x, padded[1], padded[2])
    if op_type == "Pow":
        return _pow(x, args[1])
    return None
