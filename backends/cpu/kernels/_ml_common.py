"""Shared pieces of the native ai.onnx.ml kernels (not an op module: ``load_all`` skips it):
the post transforms, the classifier's label/score finishing, and a per-node cache of what a
kernel compiles from its attributes once (tree tables, support vectors)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError
from anychip.ir.node import Node

__all__ = ["post_transform", "compiled", "labels_of", "ML"]

ML = "ai.onnx.ml"

# id(node) -> (node, compiled); the node is kept so a recycled id is never mistaken for it.
_CACHE: dict[int, tuple[Node, Any]] = {}
_CACHE_LIMIT = 4096


def compiled(ctx: KernelContext, build: Callable[[], Any]) -> Any:
    """``build()`` once per node: what a kernel derives from its attributes."""
    hit = _CACHE.get(id(ctx.node))
    if hit is not None and hit[0] is ctx.node:
        return hit[1]
    value = build()
    if len(_CACHE) >= _CACHE_LIMIT:
        _CACHE.clear()
    _CACHE[id(ctx.node)] = (ctx.node, value)
    return value


def _erf_inv(x: np.ndarray) -> np.ndarray:
    """The approximation onnxruntime (and onnx's reference) use for PROBIT."""
    sgn = np.where(x < 0, -1.0, 1.0)
    y = (1.0 - x) * (1.0 + x)
    with np.errstate(divide="ignore", invalid="ignore"):
        log = np.log(y)
        v = 2.0 / (np.pi * 0.147) + 0.5 * log
        v3 = -v + np.sqrt(v * v - log / 0.147)
        out = sgn * np.sqrt(v3)
    return np.where(y == 0, 0.0, out)


def _softmax_zero(s: np.ndarray) -> np.ndarray:
    """Softmax in which exact zeros (|v| <= 1e-7) keep weight ``exp(0 - max)`` scaled like
    the others, as onnxruntime's SOFTMAX_ZERO does; a row summing to 0 becomes 0.5."""
    m = s.max(axis=1, keepdims=True)
    zero = np.abs(s) <= 1e-7
    e = np.where(zero, s * np.exp(-m), np.exp(s - m))
    total = e.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total == 0, 0.5, e / total)


def post_transform(scores: np.ndarray, name: str | None) -> np.ndarray:
    """NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO or PROBIT, row-wise on ``[N, C]`` scores."""
    if name in (None, "NONE"):
        return scores
    if name == "LOGISTIC":
        return 1.0 / (1.0 + np.exp(-scores))
    if name == "SOFTMAX":
        e = np.exp(scores - scores.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if name == "SOFTMAX_ZERO":
        return _softmax_zero(scores)
    if name == "PROBIT":
        return 1.41421356 * _erf_inv(scores * 2 - 1)
    raise KernelError(
        f"post_transform {name!r} is not one of NONE, LOGISTIC, SOFTMAX, SOFTMAX_ZERO, PROBIT"
    )


def labels_of(
    index: np.ndarray, ints: list[int] | None, strings: list[str] | None, op: str
) -> np.ndarray:
    """Class labels for class indices, from ``classlabels_int64s`` or ``classlabels_strings``."""
    if ints:
        return np.asarray(ints, np.int64)[index]
    if strings:
        return np.asarray(strings, dtype=object)[index]
    raise KernelError(f"{op}: neither classlabels_int64s nor classlabels_strings is given")
