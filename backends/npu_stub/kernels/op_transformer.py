"""What transformer exports need beside MatMul and Softmax: Sub, Div, Sqrt, Tanh, Erf, Gelu
and LayerNormalization (Y only; its Mean and InvStdDev outputs are refused in
``check_node``). Float32 throughout; LayerNormalization's statistics in float32, as
onnxruntime computes them for float inputs (``stash_type`` 1)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder

__all__: list[str] = []

_SQRT_HALF = np.float32(0.7071067811865476)
_SQRT_2_OVER_PI = np.float32(0.7978845608028654)
# Abramowitz & Stegun 7.1.26 (absolute error 1.5e-7, float32's own resolution): the formula the
# CPU's Erf kernel and the generated C use, written here so the stub needs no other backend.
_ERF_P = np.float32(0.3275911)
_ERF_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736)]
_ERF_A1 = np.float32(0.254829592)


def _erf(x: np.ndarray) -> np.ndarray:
    """The error function in float32."""
    a = np.abs(x)
    t = np.float32(1) / (np.float32(1) + _ERF_P * a)
    poly = _ERF_A[0]
    for c in _ERF_A[1:]:
        poly = c + t * poly
    poly = t * (_ERF_A1 + t * poly)
    with np.errstate(under="ignore"):
        y = np.sign(x) * (np.float32(1) - poly * np.exp(-a * a))
    return y.astype(np.float32, copy=False)


def _elementwise(fn: Any) -> Any:
    """The builder of an op that is one numpy ufunc over its inputs."""
    return lambda node, ctx: lambda xs: fn(*xs)


for _op, _fn in {"Sub": np.subtract, "Div": np.divide, "Sqrt": np.sqrt, "Tanh": np.tanh}.items():
    builder(_op)(_elementwise(_fn))


@builder("Erf")
def build_erf(node: Any, ctx: Any) -> Run:
    return lambda xs: _erf(xs[0])


@builder("Gelu")
def build_gelu(node: Any, ctx: Any) -> Run:
    if node.attr("approximate", "none") == "tanh":

        def run(xs: list) -> np.ndarray:
            x = xs[0]
            inner = _SQRT_2_OVER_PI * (x + np.float32(0.044715) * x * x * x)
            return np.float32(0.5) * x * (np.float32(1) + np.tanh(inner))

        return run
    return lambda xs: np.float32(0.5) * xs[0] * (np.float32(1) + _erf(xs[0] * _SQRT_HALF))


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
