"""The front half of the code generator: a small typed expression IR for fused element-wise
chains, shared by every emitter (C today; OpenCL and CUDA emit from the same tree).

An ``Expr`` is an immutable tree over a few primitive operations, all of one float dtype:

* leaves: ``("in", k)`` reads input ``k`` at the output element's (broadcast) index,
  ``("const", value)`` is a scalar constant;
* unary: ``neg abs exp log sqrt tanh erf sigmoid recip``;
* binary: ``add sub mul div max min pow``; ``max``/``min`` propagate NaN (numpy's
  ``maximum``/``minimum``, which the CPU kernels use);
* ``select(cond, a, b)`` where ``cond`` is a comparison ``lt le gt ge eq`` (true/false, never
  a stored value).

The ONNX ops are lowered onto these (``codegen/onnx_ops.py``), so an emitter only implements
the primitives. The text form (``str(expr)``, ``parse(text)``) is what the fused node stores in
its ``expr`` attribute: ``mul(in0,sigmoid(in0))``; constants print with ``repr`` (exact).
"""

from __future__ import annotations

import math
import re

from anychip.errors import AnychipError

__all__ = ["Expr", "UNARY", "BINARY", "COMPARE", "parse", "inp", "const", "call"]

UNARY = ("neg", "abs", "exp", "log", "sqrt", "tanh", "erf", "sigmoid", "recip")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
COMPARE = ("lt", "le", "gt", "ge", "eq")
_ARITY = {**{u: 1 for u in UNARY}, **{b: 2 for b in BINARY}, **{c: 2 for c in COMPARE}}
_ARITY["select"] = 3


class Expr:
    """One node of the tree: ``op``, ``args`` (sub-expressions), ``value`` (the input index of
    ``in``, the float of ``const``). Immutable and hashable; equal trees compare equal."""

    __slots__ = ("op", "args", "value", "_key")

    def __init__(self, op: str, args: tuple[Expr, ...] = (), value: float | int | None = None):
        if op not in ("in", "const") and _ARITY.get(op) != len(args):
            raise AnychipError(f"expression op {op!r} with {len(args)} arguments is not known")
        self.op, self.args, self.value = op, tuple(args), value
        self._key = (op, self.args, repr(value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Expr) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __str__(self) -> str:
        if self.op == "in":
            return f"in{self.value}"
        if self.op == "const":
            return repr(float(self.value))
        return f"{self.op}({','.join(str(a) for a in self.args)})"

    def __repr__(self) -> str:
        return f"Expr({self})"

    def inputs(self) -> set[int]:
        """The input indices this expression reads."""
        if self.op == "in":
            return {int(self.value)}
        out: set[int] = set()
        for a in self.args:
            out |= a.inputs()
        return out

    def size(self) -> int:
        """The number of operations (leaves not counted)."""
        if self.op in ("in", "const"):
            return 0
        return 1 + sum(a.size() for a in self.args)


def inp(k: int) -> Expr:
    """Input ``k``."""
    return Expr("in", value=int(k))


def const(v: float) -> Expr:
    """A scalar constant."""
    return Expr("const", value=float(v))


def call(op: str, *args: Expr) -> Expr:
    """``op(args...)``."""
    return Expr(op, args)


_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z_0-9]*|[-+]?(?:nan|inf|[0-9.]+(?:e[-+]?[0-9]+)?)|[(),])")


def parse(text: str) -> Expr:
    """The expression ``str(expr)`` printed; an ``AnychipError`` names what is wrong."""
    tokens = _TOKEN.findall(text)
    if "".join(tokens) != re.sub(r"\s+", "", text):
        raise AnychipError(f"fused expression {text!r} has characters outside the grammar")
    pos = 0

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise AnychipError(f"fused expression {text!r} ends too early")
        pos += 1
        return tokens[pos - 1]

    def node() -> Expr:
        tok = take()
        if re.fullmatch(r"in[0-9]+", tok):
            return inp(int(tok[2:]))
        if tok[0].isdigit() or tok[0] in "+-." or tok in ("nan", "inf"):
            return const(float(tok))
        if tok not in _ARITY or take() != "(":
            raise AnychipError(f"fused expression {text!r}: {tok!r} is not an operation")
        args = [node()]
        while (sep := take()) == ",":
            args.append(node())
        if sep != ")":
            raise AnychipError(f"fused expression {text!r}: expected ')' after {tok} arguments")
        return Expr(tok, tuple(args))

    out = node()
    if pos != len(tokens):
        raise AnychipError(f"fused expression {text!r} has text after its end")
    return out


def is_const(e: Expr, value: float | None = None) -> bool:
    """Whether ``e`` is a constant (equal to ``value`` when given; NaN never equals)."""
    if e.op != "const":
        return False
    return value is None or (not math.isnan(e.value) and e.value == value)
