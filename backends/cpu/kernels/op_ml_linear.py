"""LinearClassifier and LinearRegressor (ai.onnx.ml): one matrix product each, with the
binary and post-transform rules of onnx's reference evaluator (which onnxruntime matches)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anychip.backends.cpu.kernels._ml_common import ML, compiled, labels_of, post_transform
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError

__all__ = ["linear_classifier", "linear_regressor"]


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _rows(x: np.ndarray) -> np.ndarray:
    if type(x) is not np.ndarray:
        x = np.asarray(x)
    if x.dtype != _F32 and x.dtype != _F64:
        x = x.astype(np.float32)
    return x.reshape(1, -1) if x.ndim == 1 else x


def _weights(coefficients: list[float], width: int, x: np.ndarray, op: str) -> np.ndarray:
    c = np.asarray(coefficients, x.dtype)
    if c.size % width:
        raise KernelError(f"{op}: {c.size} coefficients do not divide into rows of {width}")
    return c.reshape(-1, width).T


def _prepared(
    ctx: KernelContext,
    x: np.ndarray,
    intercepts: list[float] | None,
    weights: Callable[[], np.ndarray],
) -> tuple[np.ndarray, np.ndarray | None]:
    """Weights ``[F, C]`` (``weights()``, made contiguous) and intercepts in ``x``'s type, made
    once per node and type: converting the attribute lists on every run cost more than the
    product."""
    cache: dict = compiled(ctx, dict)
    hit = cache.get(x.dtype)
    if hit is None:
        w = np.ascontiguousarray(weights())
        b = np.asarray(intercepts, x.dtype) if intercepts else None
        hit = cache[x.dtype] = (w, b)
    return hit


def _affine(op: str, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, per: str) -> np.ndarray:
    """``x @ w + b``, or a ``KernelError`` when ``x``'s features are not ``w``'s."""
    if w.shape[0] != x.shape[1]:
        raise KernelError(f"{op}: {w.shape[0]} coefficients per {per}, {x.shape[1]} features")
    y = x @ w
    if b is not None:
        y += b
    return y


@kernel("LinearClassifier", domain=ML, since=1, context=True)
def linear_classifier(
    ctx: KernelContext,
    x: np.ndarray,
    *,
    coefficients: list[float],
    intercepts: list[float] | None = None,
    classlabels_ints: list[int] | None = None,
    classlabels_strings: list[str] | None = None,
    multi_class: int = 0,
    post_transform: str = "NONE",
) -> tuple[np.ndarray, np.ndarray]:
    x = _rows(x)
    w, b = _prepared(
        ctx, x, intercepts, lambda: _weights(coefficients, x.shape[1], x, "LinearClassifier")
    )
    scores = _affine("LinearClassifier", x, w, b, "class")
    n_classes = max(len(classlabels_ints or []), len(classlabels_strings or []))
    if scores.shape[1] == 1 and n_classes == 2:
        scores = np.concatenate([-scores, scores], axis=1)
    scores = post_transform_(scores, post_transform)
    if scores.shape[1] > 1:
        best = scores.argmax(axis=1)
        if classlabels_ints is None and classlabels_strings is None:
            return best.astype(np.int64), scores
        return labels_of(best, classlabels_ints, classlabels_strings, "LinearClassifier"), scores
    positive = scores[:, 0] >= (0 if post_transform == "NONE" else 0.5)
    if classlabels_ints:
        return np.where(positive, classlabels_ints[0], 0).astype(np.int64), scores
    return positive.astype(np.int64), scores


def post_transform_(scores: np.ndarray, name: str) -> np.ndarray:
    if name == "NONE":
        return scores
    out = post_transform(scores, name)
    return out.astype(np.float32, copy=False) if scores.dtype != np.float64 else out


@kernel("LinearRegressor", domain=ML, since=1, context=True)
def linear_regressor(
    ctx: KernelContext,
    x: np.ndarray,
    *,
    coefficients: list[float],
    intercepts: list[float] | None = None,
    targets: int = 1,
    post_transform: str = "NONE",
) -> np.ndarray:
    x = _rows(x)
    w, b = _prepared(
        ctx, x, intercepts, lambda: np.asarray(coefficients, x.dtype).reshape(targets, -1).T
    )
    return post_transform_(_affine("LinearRegressor", x, w, b, "target"), post_transform)
