"""Normalizations other than Batch/Layer: InstanceNormalization, GroupNormalization,
RMSNormalization, LpNormalization and MeanVarianceNormalization.

Statistics are computed in float32 (or float64 for double inputs) whatever the input type;
``stash_type`` only allows float32 and wider here, which is what the spec's default asks.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, normalize_axis
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError
from anychip.ir.dtypes import DType

__all__ = [
    "instance_normalization",
    "group_normalization_18",
    "group_normalization",
    "rms_normalization",
    "lp_normalization",
    "mean_variance_normalization",
]


def _stat_dtype(x: np.ndarray, stash_type: int = 1) -> np.dtype:
    if x.dtype == np.float64 or stash_type == DType.DOUBLE:
        return np.dtype(np.float64)
    return np.dtype(np.float32)


@kernel("InstanceNormalization", since=1, dtypes=FLOAT_WITH_BF16)
def instance_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray,
    *,
    epsilon: float = 1e-5,
    consumed_inputs: list[int] | None = None,
) -> np.ndarray:
    w = x.astype(_stat_dtype(x))
    axes = tuple(range(2, x.ndim))
    mean = w.mean(axis=axes, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=axes, keepdims=True)
    tail = (1,) * (x.ndim - 2)
    s = scale.astype(w.dtype).reshape((1, -1) + tail)
    bias = b.astype(w.dtype).reshape((1, -1) + tail)
    return ((w - mean) / np.sqrt(var + epsilon) * s + bias).astype(x.dtype)


def _group_stats(x: np.ndarray, num_groups: int, epsilon: float, stash_type: int) -> np.ndarray:
    n, c = x.shape[:2]
    if num_groups <= 0 or c % num_groups:
        raise ModelError(
            f"GroupNormalization: {c} channels are not divisible by num_groups={num_groups}"
        )
    w = x.astype(_stat_dtype(x, stash_type)).reshape(n, num_groups, -1)
    mean = w.mean(axis=2, keepdims=True)
    var = ((w - mean) ** 2).mean(axis=2, keepdims=True)
    return (w - mean) / np.sqrt(var + epsilon)  # [N, G, C/G * spatial]


@kernel("GroupNormalization", since=18, until=20, dtypes=FLOAT_WITH_BF16)
def group_normalization_18(
    x: np.ndarray, scale: np.ndarray, bias: np.ndarray, *, num_groups: int, epsilon: float = 1e-5
) -> np.ndarray:
    """Opset 18: ``scale`` and ``bias`` hold one value per group."""
    y = _group_stats(x, num_groups, epsilon, 1)
    y = y * scale.astype(y.dtype).reshape(1, -1, 1) + bias.astype(y.dtype).reshape(1, -1, 1)
    return y.reshape(x.shape).astype(x.dtype)


@kernel("GroupNormalization", since=21, dtypes=FLOAT_WITH_BF16)
def group_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray,
    *,
    num_groups: int,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> np.ndarray:
    """Opset 21: ``scale`` and ``bias`` hold one value per channel."""
    y = _group_stats(x, num_groups, epsilon, stash_type).reshape(x.shape).astype(x.dtype)
    tail = (1,) * (x.ndim - 2)
    s = scale.reshape((1, -1) + tail)
    b = bias.reshape((1, -1) + tail)
    return (y * s + b).astype(x.dtype)


@kernel("RMSNormalization", since=23, dtypes=FLOAT_WITH_BF16)
def rms_normalization(
    x: np.ndarray, scale: np.ndarray, *, axis: int = -1, epsilon: float = 1e-5, stash_type: int = 1
) -> np.ndarray:
    ax = normalize_axis(axis, x.ndim, "RMSNormalization")
    w = x.astype(_stat_dtype(x, stash_type))
    ms = np.mean(w * w, axis=tuple(range(ax, x.ndim)), keepdims=True)
    normalized = (w / np.sqrt(ms + epsilon)).astype(x.dtype)
    return (normalized * scale).astype(x.dtype)


@kernel("LpNormalization", since=1, dtypes=FLOAT_WITH_BF16)
def lp_normalization(x: np.ndarray, *, axis: int = -1, p: int = 2) -> np.ndarray:
    ax = normalize_axis(axis, x.ndim, "LpNormalization")
    w = x.astype(_stat_dtype(x))
    if p == 1:
        norm = np.sum(np.abs(w), axis=ax, keepdims=True)
    elif p == 2:
        norm = np.sqrt(np.sum(w * w, axis=ax, keepdims=True))
    else:
        raise ModelError(f"LpNormalization: p must be 1 or 2, got {p}")
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(norm == 0, 0, w / norm)
    return out.astype(x.dtype)


@kernel("MeanVarianceNormalization", since=9, dtypes=FLOAT_WITH_BF16)
def mean_variance_normalization(x: np.ndarray, *, axes: list[int] | None = None) -> np.ndarray:
    axes = tuple(
        normalize_axis(a, x.ndim, "MeanVarianceNormalization")
        for a in (axes if axes is not None else [0, 2, 3])
    )
    w = x.astype(_stat_dtype(x))
    mean = w.mean(axis=axes, keepdims=True)
    # The spec's function: sqrt(E[x^2] - E[x]^2) + 1e-9 in the denominator.
    var = np.maximum((w * w).mean(axis=axes, keepdims=True) - mean * mean, 0)
    return ((w - mean) / (np.sqrt(var) + 1e-9)).astype(x.dtype)
