"""Random generators: RandomUniform, RandomNormal, their *Like forms, Bernoulli, Multinomial.

A ``seed`` attribute makes a node reproducible: the same seed gives the same numbers on every
run (numpy's PCG64 generator seeded with it). Without a seed every call draws fresh numbers.
Values are drawn in float64 and cast to the requested type.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError
from anychip.ir.dtypes import DType

__all__ = [
    "random_uniform",
    "random_normal",
    "random_uniform_like",
    "random_normal_like",
    "bernoulli",
    "multinomial",
]

_FLOATS = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE, DType.BFLOAT16})


def _rng(seed: float | None) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    # The seed is a float attribute; its bit pattern keeps distinct seeds distinct.
    return np.random.default_rng(np.frombuffer(np.float64(seed).tobytes(), np.uint64))


def _float_dtype(dtype: int | None, like: np.ndarray | None, op: str) -> np.dtype:
    if dtype is None:
        if like is None:
            return np.dtype(np.float32)
        return like.dtype
    dt = DType(dtype)
    if not dt.is_float:
        raise ModelError(f"{op}: dtype must be a floating-point type, got {dt.short}")
    return np.dtype(dt.numpy)


def _shape(shape: Sequence[int] | None, op: str) -> tuple[int, ...]:
    if shape is None:
        raise ModelError(f"{op}: the shape attribute is required")
    return tuple(int(d) for d in shape)


@kernel("RandomUniform", since=1)
def random_uniform(
    *,
    dtype: int = 1,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
    shape: Sequence[int] | None = None,
) -> np.ndarray:
    out = _float_dtype(dtype, None, "RandomUniform")
    return _rng(seed).uniform(low, high, _shape(shape, "RandomUniform")).astype(out)


@kernel("RandomNormal", since=1)
def random_normal(
    *,
    dtype: int = 1,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
    shape: Sequence[int] | None = None,
) -> np.ndarray:
    out = _float_dtype(dtype, None, "RandomNormal")
    return _rng(seed).normal(mean, scale, _shape(shape, "RandomNormal")).astype(out)


@kernel("RandomUniformLike", since=1)
def random_uniform_like(
    x: np.ndarray,
    *,
    dtype: int | None = None,
    high: float = 1.0,
    low: float = 0.0,
    seed: float | None = None,
) -> np.ndarray:
    x = np.asarray(x)
    out = _float_dtype(dtype, x, "RandomUniformLike")
    return _rng(seed).uniform(low, high, x.shape).astype(out)


@kernel("RandomNormalLike", since=1)
def random_normal_like(
    x: np.ndarray,
    *,
    dtype: int | None = None,
    mean: float = 0.0,
    scale: float = 1.0,
    seed: float | None = None,
) -> np.ndarray:
    x = np.asarray(x)
    out = _float_dtype(dtype, x, "RandomNormalLike")
    return _rng(seed).normal(mean, scale, x.shape).astype(out)


@kernel("Bernoulli", since=15, dtypes=_FLOATS)
def bernoulli(x: np.ndarray, *, dtype: int | None = None, seed: float | None = None) -> np.ndarray:
    p = np.asarray(x)
    out = np.dtype(DType(dtype).numpy) if dtype is not None else p.dtype
    pf = p.astype(np.float64)
    if np.any((pf < 0) | (pf > 1)):
        raise KernelError("Bernoulli: probabilities must lie in [0, 1]")
    return (_rng(seed).random(p.shape) < pf).astype(out)


@kernel("Multinomial", since=7, dtypes=_FLOATS)
def multinomial(
    x: np.ndarray, *, dtype: int = 6, sample_size: int = 1, seed: float | None = None
) -> np.ndarray:
    logits = np.asarray(x).astype(np.float64)
    if logits.ndim != 2:
        raise KernelError(f"Multinomial: input must be (batch, classes), got {list(logits.shape)}")
    out = DType(dtype)
    if out not in (DType.INT32, DType.INT64):
        raise ModelError(f"Multinomial: dtype must be int32 or int64, got {out.short}")
    # Each row holds unnormalized log-probabilities.
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    cdf = np.cumsum(p, axis=1)
    u = _rng(seed).random((logits.shape[0], sample_size))
    idx = np.stack([np.searchsorted(cdf[b], u[b], side="right") for b in range(len(cdf))])
    return np.minimum(idx, logits.shape[1] - 1).astype(out.numpy)
