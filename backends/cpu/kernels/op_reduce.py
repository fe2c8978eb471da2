"""Reductions: ReduceMean/Sum/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp.

``axes`` is an attribute up to opset 17 (ReduceSum: up to 12) and an optional input after,
where ``noop_with_empty_axes=1`` turns an empty axes list into the identity. Empty reductions
return the operation's identity (0 for sums, 1 for products, -inf/+inf for max/min; for max and
min of integers the type's lowest/highest value). Outputs keep the input dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axes
from anychip.backends.cpu.table import kernel
from anychip.ir.dtypes import NUMERIC_TYPES, DType

__all__ = ["REDUCERS"]


def _sum(x, axes, keepdims):
    return np.add.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _mean(x, axes, keepdims):
    if x.dtype.kind in "iu":
        return np.mean(x, axis=axes, keepdims=keepdims, dtype=np.float64).astype(x.dtype)
    with np.errstate(invalid="ignore"):
        return np.mean(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _extreme(fn, x, axes, keepdims, sign):
    if x.size and all(x.shape[a] for a in (axes if axes is not None else range(x.ndim))):
        return fn(x, axis=axes, keepdims=keepdims)
    if x.dtype.kind in "iu":
        info = np.iinfo(x.dtype)
        init = info.min if sign < 0 else info.max
    elif x.dtype.kind == "b":
        init = sign > 0
    else:
        init = -np.inf if sign < 0 else np.inf
    return fn(x, axis=axes, keepdims=keepdims, initial=init)


def _max(x, axes, keepdims):
    return _extreme(np.max, x, axes, keepdims, -1)


def _min(x, axes, keepdims):
    return _extreme(np.min, x, axes, keepdims, 1)


def _prod(x, axes, keepdims):
    return np.multiply.reduce(x, axis=axes, keepdims=keepdims, dtype=x.dtype)


def _sum_square(x, axes, keepdims):
    return np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l1(x, axes, keepdims):
    return np.sum(np.abs(x), axis=axes, keepdims=keepdims, dtype=x.dtype)


def _l2(x, axes, keepdims):
    if x.dtype.kind in "iu":
        s = np.sum(np.square(x.astype(np.float64)), axis=axes, keepdims=keepdims)
        return np.sqrt(s).astype(x.dtype)
    return np.sqrt(np.sum(np.square(x), axis=axes, keepdims=keepdims, dtype=x.dtype))


def _log_sum(x, axes, keepdims):
    with np.errstate(divide="ignore"):
        return np.log(np.sum(x, axis=axes, keepdims=keepdims, dtype=x.dtype))


#: Longest last axis whose max is taken column by column: numpy's reduction over a short
#: inner axis pays its loop setup per row (300 x 3: 12 us, against 1.5 us for two maximums).
_SHORT = 16


def _short_max(x, axes):
    """``np.max(x, axes, keepdims=True)``; the same values (max is exact; a NaN gives NaN
    either way; only the sign of a zero may differ, which LogSumExp's ``x - m`` and
    ``log(s) + m`` do not carry)."""
    k = x.shape[-1] if x.ndim else 0
    if axes != (x.ndim - 1,) or not 1 < k <= _SHORT or x.size == 0:
        return np.max(x, axis=axes, keepdims=True)
    m = x[..., :1].copy()
    for i in range(1, k):
        np.maximum(m, x[..., i : i + 1], out=m)
    return m


def _log_sum_exp(x, axes, keepdims):
    if x.size == 0 or x.dtype.kind in "iu":
        with np.errstate(divide="ignore"):
            wide = x.astype(np.float64)
            out = np.log(np.sum(np.exp(wide), axis=axes, keepdims=keepdims))
            return out.astype(x.dtype)
    m = _short_max(x, axes)
    m = np.where(np.isfinite(m), m, np.zeros((), x.dtype))
    s = np.sum(np.exp(x - m), axis=axes, keepdims=True, dtype=x.dtype)
    with np.errstate(divide="ignore"):
        out = np.log(s) + m
    if not keepdims:
        out = np.squeeze(out, axis=axes)
    return out


REDUCERS: dict[str, tuple[Callable, int]] = {
    # op: (function, first opset where axes is an input)
    "ReduceMean": (_mean, 18),
    "ReduceSum": (_sum, 13),
    "ReduceMax": (_max, 18),
    "ReduceMin": (_min, 18),
    "ReduceProd": (_prod, 18),
    "ReduceSumSquare": (_sum_square, 18),
    "ReduceL1": (_l1, 18),
    "ReduceL2": (_l2, 18),
    "ReduceLogSum": (_log_sum, 18),
    "ReduceLogSumExp": (_log_sum_exp, 18),
}

_TYPES = NUMERIC_TYPES | {DType.BOOL}


def _reduce(fn, x: np.ndarray, axes: list[int] | None, keepdims: int, noop: int, op: str):
    if not axes:
        if noop:
            return np.array(x)
        axes_t = None
    elif len(axes) == 1 and -x.ndim <= axes[0] < x.ndim:
        axes_t = (axes[0] % x.ndim,)  # the common case, without norm_axes' checks
    else:
        axes_t = tuple(norm_axes(axes, x.ndim, op))
    return np.asarray(fn(x, axes_t, bool(keepdims)))


def _register(op: str, fn: Callable, input_since: int) -> None:
    @kernel(op, since=1, dtypes=_TYPES)
    def with_attr(data, *, axes=None, keepdims=1):
        return _reduce(fn, data, axes, keepdims, 0, op)

    @kernel(op, since=input_since, dtypes=_TYPES)
    def with_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        return _reduce(fn, data, int_list(axes), keepdims, noop_with_empty_axes, op)

    with_attr.__name__ = f"{op[6:].lower()}_attr"
    with_input.__name__ = f"{op[6:].lower()}"


for _op, (_fn, _since) in REDUCERS.items():
    _register(_op, _fn, _since)
