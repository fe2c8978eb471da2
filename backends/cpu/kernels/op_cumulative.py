"""CumSum and CumProd along one axis, with ``exclusive`` and ``reverse`` variants."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anychip.backends.cpu.kernels._common import compute_dtype, normalize_axis
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import DType

__all__ = ["cum_sum", "cum_prod"]

_TYPES = frozenset(
    {
        DType.FLOAT16,
        DType.FLOAT,
        DType.DOUBLE,
        DType.BFLOAT16,
        DType.INT32,
        DType.INT64,
        DType.UINT32,
        DType.UINT64,
    }
)


def _scan(
    fn: Callable[..., np.ndarray],
    identity: int,
    x: np.ndarray,
    axis: np.ndarray,
    exclusive: int,
    reverse: int,
    op: str,
) -> np.ndarray:
    ax = normalize_axis(int(np.asarray(axis).reshape(-1)[0]), x.ndim, op)
    work = x if x.dtype.kind in "iu" else x.astype(compute_dtype(x.dtype))
    if reverse:
        work = np.flip(work, axis=ax)
    out = fn(work, axis=ax, dtype=work.dtype)
    if exclusive:
        # Shift by one along the axis: the first element becomes the identity.
        head = np.full_like(np.take(out, [0], axis=ax), identity)
        body = np.take(out, np.arange(out.shape[ax] - 1), axis=ax)
        out = np.concatenate([head, body], axis=ax)
    if reverse:
        out = np.flip(out, axis=ax)
    return np.ascontiguousarray(out).astype(x.dtype, copy=False)


@kernel("CumSum", since=11, dtypes=_TYPES)
def cum_sum(x: np.ndarray, axis: np.ndarray, *, exclusive: int = 0, reverse: int = 0) -> np.ndarray:
    return _scan(np.cumsum, 0, x, axis, exclusive, reverse, "CumSum")


@kernel("CumProd", since=26, dtypes=_TYPES)
def cum_prod(
    x: np.ndarray, axis: np.ndarray, *, exclusive: int = 0, reverse: int = 0
) -> np.ndarray:
    return _scan(np.cumprod, 1, x, axis, exclusive, reverse, "CumProd")
