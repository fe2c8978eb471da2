"""Concat, Reshape, Flatten and Transpose: static shapes, so the output shape is known at
compile time and Reshape's shape input is read once (never placed in device memory)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder

__all__: list[str] = []


@builder("Concat")
def build_concat(node: Any, ctx: Any) -> Run:
    axis = int(node.attr("axis"))
    return lambda xs: np.concatenate(xs, axis=axis)


@builder("Reshape", "Flatten")
def build_reshape(node: Any, ctx: Any) -> Run:
    if node.op_type == "Reshape" and node.inputs[1].const is not None:
        ctx.const(node.inputs[1])  # the output's shape is concrete: never placed on the device
    shape = tuple(node.outputs[0].shape)
    return lambda xs: xs[0].reshape(shape)


@builder("Transpose")
def build_transpose(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    perm = tuple(int(p) for p in (node.attr("perm") or range(rank - 1, -1, -1)))
    return lambda xs: xs[0].transpose(perm)
