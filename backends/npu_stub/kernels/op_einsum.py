"""Einsum as one batched matmul (``einsum_plan.py`` says which equations): operand A is
transposed to ``[batch, free_a, contracted]``, B to ``[batch, contracted, free_b]``, both
reshaped to 3-D, multiplied, and the product reshaped and transposed to the output's index
order. In fp16 mode operands are rounded to float16, products accumulate in float32, as
MatMul's."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder, round_fp16
from anychip.backends.npu_stub.kernels.einsum_plan import EinsumPlan, plan_einsum

__all__: list[str] = []


def _perm(term: str, order: str) -> tuple[int, ...]:
    return tuple(term.index(c) for c in order)


def _build(plan: EinsumPlan, shapes: list[tuple[int, ...]], fp16: bool) -> Run:
    if len(plan.terms) == 1:
        perm = _perm(plan.terms[0], plan.output)
        return lambda xs: xs[0].transpose(perm)
    a, b = plan.terms
    size = {c: int(d) for t, s in zip(plan.terms, shapes) for c, d in zip(t, s)}

    def prod(idx: str) -> int:
        return int(np.prod([size[c] for c in idx], dtype=np.int64))

    pa = _perm(a, plan.batch + plan.free_a + plan.contracted)
    pb = _perm(b, plan.batch + plan.contracted + plan.free_b)
    nb, m, k, n = prod(plan.batch), prod(plan.free_a), prod(plan.contracted), prod(plan.free_b)
    full = plan.batch + plan.free_a + plan.free_b
    full_shape = tuple(size[c] for c in full)
    out_perm = _perm(full, plan.output)

    def run(xs: list) -> np.ndarray:
        xa = xs[0].transpose(pa).reshape(nb, m, k)
        xb = xs[1].transpose(pb).reshape(nb, k, n)
        if fp16:
            xa, xb = round_fp16(xa), round_fp16(xb)
        return np.matmul(xa, xb).reshape(full_shape).transpose(out_perm)

    return run


@builder("Einsum")
def build_einsum(node: Any, ctx: Any) -> Run:
    plan = plan_einsum(str(node.attr("equation")), len(node.inputs))
    if isinstance(plan, str):  # check_node refused it: the placement never gives it to us
        raise ValueError(plan)
    return _build(plan, [tuple(v.shape) for v in node.inputs], ctx.fp16)
