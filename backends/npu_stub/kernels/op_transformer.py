"""What transformer exports need beside MatMul and Softmax: Sub, Div (also over integers, the
shape arithmetic), Sqrt, Reciprocal, Tanh, Erf, Gelu, LayerNormalization (Y only; its Mean
and InvStdDev outputs are refused in ``check_node``) and InstanceNormalization (wav2vec2's
front end). Float32 throughout; the normalizations' statistics in float32, as onnxruntime
computes them for float inputs (``stash_type`` 1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder
from anychip.core.plugin.reference.erf import erf_array

__all__: list[str] = []

_SQRT_HALF = np.float32(0.7071067811865476)
_SQRT_2_OVER_PI = np.float32(0.7978845608028654)


def _elementwise(fn: Any) -> Any:
    """The builder of an op that is one numpy ufunc over its inputs."""
    return lambda node, ctx: lambda xs: fn(*xs)


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX's Div: integers truncate toward zero (C's division, as onnxruntime computes it)."""
    if np.issubdtype(a.dtype, np.integer):
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) != (b < 0), -q, q).astype(a.dtype, copy=False)
    return np.divide(a, b)


_ONE = {"Sub": np.subtract, "Div": _divide, "Sqrt": np.sqrt, "Tanh": np.tanh}
for _op, _fn in {**_ONE, "Reciprocal": np.reciprocal}.items():
    builder(_op)(_elementwise(_fn))


@builder("Erf")
def build_erf(node: Any, ctx: Any) -> Run:
    return lambda xs: erf_array(xs[0])


@builder("Gelu")
def build_gelu(node: Any, ctx: Any) -> Run:
    if node.attr("approximate", "none") == "tanh":

        def run(xs: list) -> np.ndarray:
            x = xs[0]
            inner = _SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)
            return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))

        return run
    return lambda xs: np.float32(0.5) * xs[0] * (np.float32(1) + erf_array(xs[0] * _SQRT_HALF))


@builder("LayerNormalization")
def build_layer_norm(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    axis = int(node.attr("axis", -1))
    axes = tuple(range(axis + rank if axis < 0 else axis, rank))
    eps = np.float32(node.attr("epsilon", 1e-5))
    has_bias = len(node.inputs) > 2 and node.inputs[2] is not None

    def run(xs: list) -> np.ndarray:
        x = xs[0]
        centred = x - x.mean(axis=axes, keepdims=True)
        var = np.mean(np.square(centred), axis=axes, keepdims=True)
        y = centred / np.sqrt(var + eps)
        y *= xs[1]
        if has_bias:
            y += xs[2]
        return y

    return run


@builder("InstanceNormalization")
def build_instance_norm(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    axes = tuple(range(2, rank))  # per (sample, channel), over the spatial axes
    eps = np.float32(node.attr("epsilon", 1e-5))
    per_channel = (-1,) + (1,) * (rank - 2)

    def run(xs: list) -> np.ndarray:
        x = xs[0]
        centred = x - x.mean(axis=axes, keepdims=True, dtype=np.float32)
        var = np.mean(np.square(centred), axis=axes, keepdims=True, dtype=np.float32)
        y = centred / np.sqrt(var + eps)
        y *= xs[1].reshape(per_channel)
        y += xs[2].reshape(per_channel)
        return y

    return run
