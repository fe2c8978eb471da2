"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both take class scores of shape (N, C) or (N, C, d1, ..., dk) and integer targets (N, d1..dk).
Targets equal to ``ignore_index`` contribute nothing and weigh nothing in the mean. float16
and bfloat16 compute in float32 and are cast back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError
from anychip.ir.dtypes import DType

__all__ = ["negative_log_likelihood_loss", "softmax_cross_entropy_loss"]

_TYPES = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE, DType.BFLOAT16})


def _nll(
    logp: np.ndarray,
    target: np.ndarray,
    weight: np.ndarray | None,
    ignore_index: int | None,
    reduction: str,
    op: str,
) -> np.ndarray:
    """Weighted negative log-likelihood of ``logp`` (N, C, ...) at ``target`` (N, ...)."""
    if logp.ndim < 2 or target.shape != (logp.shape[0], *logp.shape[2:]):
        raise KernelError(
            f"{op}: input shape {list(logp.shape)} and target shape {list(target.shape)} do "
            "not match (expected input (N, C, d...) and target (N, d...))"
        )
    classes = logp.shape[1]
    target = target.astype(np.int64)
    keep = np.ones(target.shape, dtype=bool) if ignore_index is None else target != ignore_index
    if np.any((target[keep] < 0) | (target[keep] >= classes)):
        raise KernelError(f"{op}: target values must lie in [0, {classes}) or be ignore_index")
    safe = np.where(keep, target, 0)
    picked = np.take_along_axis(logp, safe[:, None], axis=1)[:, 0]
    w = np.ones(classes, dtype=logp.dtype) if weight is None else weight.astype(logp.dtype)
    wt = np.where(keep, w[safe], 0).astype(logp.dtype)
    loss = -picked * wt
    if reduction == "none":
        return loss
    if reduction == "sum":
        return np.sum(loss)
    if reduction == "mean":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.sum(loss) / np.sum(wt)
    raise ModelError(f"{op}: reduction must be 'none', 'sum' or 'mean', got {reduction!r}")


def _compute(x: np.ndarray) -> np.ndarray:
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


@kernel("NegativeLogLikelihoodLoss", since=12, dtypes=_TYPES)
def negative_log_likelihood_loss(
    x: np.ndarray,
    target: np.ndarray,
    weight: Any = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> np.ndarray:
    x = np.asarray(x)
    w = None if weight is None else _compute(np.asarray(weight))
    out = _nll(_compute(x), np.asarray(target), w, ignore_index, reduction, "NLLLoss")
    return np.asarray(out).astype(x.dtype)


@kernel("SoftmaxCrossEntropyLoss", since=12, dtypes=_TYPES)
def softmax_cross_entropy_loss(
    scores: np.ndarray,
    labels: np.ndarray,
    weights: Any = None,
    *,
    ignore_index: int | None = None,
    reduction: str = "mean",
) -> tuple[np.ndarray, np.ndarray]:
    scores = np.asarray(scores)
    s = _compute(scores)
    m = np.max(s, axis=1, keepdims=True)
    logp = s - m - np.log(np.sum(np.exp(s - m), axis=1, keepdims=True))
    w = None if weights is None else _compute(np.asarray(weights))
    loss = _nll(logp, np.asarray(labels), w, ignore_index, reduction, "SoftmaxCrossEntropyLoss")
    return np.asarray(loss).astype(scores.dtype), logp.astype(scores.dtype)
