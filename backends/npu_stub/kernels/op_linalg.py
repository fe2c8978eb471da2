"""MatMul, Gemm and Softmax. In fp16 mode operands are rounded to float16, products
accumulate in float32; constant right-hand sides are packed ``[K, N]`` once in device memory."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder, round_fp16
from anychip.backends.npu_stub.kernels.support import opset_of

__all__: list[str] = []


def _operand(ctx: Any, v: Any, pack: Any = None) -> Any:
    if v.const is None:
        return None
    return ctx.weight(v, pack=pack, dtype=np.float16 if ctx.fp16 else np.float32)


@builder("MatMul")
def build_matmul(node: Any, ctx: Any) -> Run:
    fp16 = ctx.fp16
    refs = [_operand(ctx, v) for v in node.inputs[:2]]

    def run(xs: list) -> np.ndarray:
        a, b = (r.array if r is not None else x for r, x in zip(refs, xs))
        if fp16:
            a, b = round_fp16(a), round_fp16(b)
        return np.matmul(a, b)

    return run


@builder("Gemm")
def build_gemm(node: Any, ctx: Any) -> Run:
    fp16 = ctx.fp16
    alpha = np.float32(node.attr("alpha", 1.0))
    beta = np.float32(node.attr("beta", 1.0))
    trans_a, trans_b = bool(node.attr("transA", 0)), bool(node.attr("transB", 0))
    bref = _operand(ctx, node.inputs[1], pack=(lambda w: w.T) if trans_b else None)
    c = node.inputs[2] if len(node.inputs) > 2 else None

    def run(xs: list) -> np.ndarray:
        a = xs[0].T if trans_a else xs[0]
        if bref is not None:
            b = bref.array  # packed [K, N] at compile time
        else:
            b = xs[1].T if trans_b else xs[1]
        if fp16:
            a, b = round_fp16(a), round_fp16(b)
        y = a @ b
        if alpha != 1:
            y *= alpha
        if c is not None:
            y += beta * xs[2] if beta != 1 else xs[2]
        return y

    return run


@builder("Softmax")
def build_softmax(node: Any, ctx: Any) -> Run:
    shape = node.inputs[0].shape
    legacy = opset_of(node) < 13
    axis = int(node.attr("axis", 1 if legacy else -1))
    axis = axis + len(shape) if axis < 0 else axis

    def run(xs: list) -> np.ndarray:
        x = xs[0]
        if legacy:  # opset < 13: softmax over the flattened trailing dimensions
            x = x.reshape(int(np.prod(shape[:axis])), -1)
            ax = 1
        else:
            ax = axis
        e = np.exp(x - x.max(axis=ax, keepdims=True))
        e /= e.sum(axis=ax, keepdims=True)
        return e.reshape(shape)

    return run
