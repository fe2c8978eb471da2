"""Which Einsum equations the NPU runs, and how: as one batched matmul on its matmul engine
between transposes and reshapes (``op_einsum.py``).

Accepted: one operand that is a pure transposition (every index kept, none repeated), or two
operands whose indices each appear in the output or in both operands (batch indices: both
and the output; contracted: both, not the output; free: one operand and the output). Refused,
with a reason ``check_node`` shows: ellipses, an index repeated within one term (diagonals),
an index summed over one operand only, more than two operands.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EinsumPlan", "plan_einsum"]


@dataclass(frozen=True)
class EinsumPlan:
    """The terms of an equation and the index groups of its matmul."""

    terms: tuple[str, ...]
    output: str
    batch: str = ""
    contracted: str = ""
    free_a: str = ""
    free_b: str = ""


def _parse(equation: str) -> tuple[list[str], str | None]:
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    return lhs.split(","), (out if arrow else None)


def plan_einsum(equation: str, n_inputs: int) -> EinsumPlan | str:
    """The plan of ``equation`` over ``n_inputs`` operands, or why the NPU refuses it."""
    terms, out = _parse(equation)
    if "." in equation:
        return f"Einsum equation {equation!r}: ellipsis ('...') not supported"
    if len(terms) != n_inputs:
        return f"Einsum equation {equation!r} has {len(terms)} terms for {n_inputs} inputs"
    if any(not t.isalpha() for t in terms) or (out is not None and not out.isalpha() and out):
        return f"Einsum equation {equation!r}: only letters as indices are supported"
    for t in terms + ([out] if out else []):
        if len(set(t)) != len(t):
            return f"Einsum equation {equation!r}: a repeated index in {t!r} not supported"
    if out is None:  # implicit: the indices seen once, in alphabetical order
        seen = "".join(terms)
        out = "".join(sorted(c for c in set(seen) if seen.count(c) == 1))
    if set(out) - set("".join(terms)):
        return f"Einsum equation {equation!r}: output index not in any input"
    if len(terms) == 1:
        if set(terms[0]) != set(out):
            return f"Einsum equation {equation!r}: a sum over one operand not supported"
        return EinsumPlan((terms[0],), out)
    if len(terms) != 2:
        return f"Einsum with {len(terms)} operands not supported (one or two)"
    a, b = terms
    lonely = [c for c in a + b if c not in out and (c in a) != (c in b)]
    if lonely:
        return f"Einsum equation {equation!r}: index {lonely[0]!r} summed over one operand only"
    return EinsumPlan(
        (a, b),
        out,
        batch="".join(c for c in a if c in b and c in out),
        contracted="".join(c for c in a if c in b and c not in out),
        free_a="".join(c for c in a if c not in b),
        free_b="".join(c for c in b if c not in a),
    )
