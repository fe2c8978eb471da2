"""Relu, Clip, Sigmoid, HardSwish, Add, Mul, Sum and (inference) BatchNormalization."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder
from anychip.backends.npu_stub.kernels.support import opset_of

__all__ = ["batch_norm_affine"]


@builder("Relu")
def build_relu(node: Any, ctx: Any) -> Run:
    return lambda xs: np.maximum(xs[0], np.float32(0))


@builder("Clip")
def build_clip(node: Any, ctx: Any) -> Run:
    if opset_of(node) < 11:
        lo, hi = node.attr("min", -np.inf), node.attr("max", np.inf)
    else:
        bounds = [
            ctx.const(v) if i < len(node.inputs) and (v := node.inputs[i]) is not None else None
            for i in (1, 2)
        ]
        lo = -np.inf if bounds[0] is None else float(bounds[0])
        hi = np.inf if bounds[1] is None else float(bounds[1])
    lo32, hi32 = np.float32(lo), np.float32(hi)
    return lambda xs: np.minimum(np.maximum(xs[0], lo32), hi32)


@builder("Sigmoid")
def build_sigmoid(node: Any, ctx: Any) -> Run:
    # exp(-logaddexp(0, -x)) = 1 / (1 + exp(-x)) without overflow for large |x|.
    return lambda xs: np.exp(-np.logaddexp(np.float32(0), -xs[0]))


@builder("HardSwish")
def build_hard_swish(node: Any, ctx: Any) -> Run:
    def run(xs: list) -> np.ndarray:
        x = xs[0]
        return x * np.clip(x * np.float32(1 / 6) + np.float32(0.5), 0, 1)

    return run


@builder("Add")
def build_add(node: Any, ctx: Any) -> Run:
    return lambda xs: np.add(xs[0], xs[1])


@builder("Mul")
def build_mul(node: Any, ctx: Any) -> Run:
    return lambda xs: np.multiply(xs[0], xs[1])


@builder("Sum")
def build_sum(node: Any, ctx: Any) -> Run:
    def run(xs: list) -> np.ndarray:
        total = np.array(xs[0], dtype=np.float32, copy=True)
        for x in xs[1:]:
            total = total + x  # broadcasting may grow the result, so no in-place add
        return total

    return run


def batch_norm_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel ``(a, b)`` such that BatchNormalization(x) = a * x + b."""
    a = (scale / np.sqrt(var.astype(np.float64) + epsilon)).astype(np.float32)
    b = (bias - mean * a).astype(np.float32)
    return a, b


@builder("BatchNormalization")
def build_batch_norm(node: Any, ctx: Any) -> Run:
    eps = float(node.attr("epsilon", 1e-5))
    params = node.inputs[1:5]
    rank = len(node.inputs[0].shape)
    tail = (1,) * (rank - 2)
    if all(v.const is not None for v in params):
        ref = ctx.weight(
            params[0],
            pack=lambda _: np.stack(batch_norm_affine(*(v.const for v in params), eps)),
            key=("bn", eps, *(id(v) for v in params)),
        )
        for v in params[1:]:
            ctx.const(v)  # folded into ref, never placed on its own

        def run(xs: list) -> np.ndarray:
            a, b = ref.array
            return xs[0] * a.reshape(-1, *tail) + b.reshape(-1, *tail)

        return run

    def run_dynamic(xs: list) -> np.ndarray:
        a, b = batch_norm_affine(*xs[1:5], eps)
        return xs[0] * a.reshape(-1, *tail) + b.reshape(-1, *tail)

    return run_dynamic
