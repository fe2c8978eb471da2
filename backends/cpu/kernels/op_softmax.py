"""Softmax and LogSoftmax.

Opsets 1-12 coerce the input to 2-D at ``axis`` (rows: dims before axis, columns: the rest)
and normalise each row; opset 13 normalises along ``axis`` alone (default -1).
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native.rows import softmax_rows
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["softmax_2d", "softmax", "log_softmax_2d", "log_softmax"]

_FLOATS = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})


def _axis(axis: int, ndim: int, op: str) -> int:
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise KernelError(f"{op}: axis {axis} is out of range for an input of rank {ndim}")
    return axis + ndim if axis < 0 else axis


def _softmax(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    if x.dtype == np.float32 and axis in (-1, x.ndim - 1):
        y = out if fits(out, x.shape, x.dtype) else _replay.empty(x.shape, x.dtype)
        if softmax_rows(x, y, note=True):  # generated C: one pass per step, per row
            _replay.seal()  # its one call, noted there: all the node does
            return y
    if fits(out, x.shape, x.dtype):
        e = np.subtract(x, np.max(x, axis=axis, keepdims=True), out=out)
        np.exp(e, out=e)
    else:
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _as_2d(x: np.ndarray, axis: int, op: str) -> np.ndarray:
    a = _axis(axis, x.ndim, op)
    return x.reshape(math.prod(x.shape[:a]), math.prod(x.shape[a:]))


@kernel("Softmax", since=1, dtypes=_FLOATS)
def softmax_2d(x: np.ndarray, *, axis: int = 1, out: np.ndarray | None = None) -> np.ndarray:
    """Opsets 1-12: softmax over the flattened dims from ``axis`` on."""
    x2 = _as_2d(x, axis, "Softmax")
    if fits(out, x.shape, x.dtype):
        _softmax(x2, 1, out.reshape(x2.shape))
        return out
    return _softmax(x2, 1).reshape(x.shape)


@kernel("Softmax", since=13, dtypes=_FLOATS)
def softmax(x: np.ndarray, *, axis: int = -1, out: np.ndarray | None = None) -> np.ndarray:
    """Opset 13+: softmax along ``axis``."""
    return _softmax(x, _axis(axis, x.ndim, "Softmax"), out)


@kernel("LogSoftmax", since=1, dtypes=_FLOATS)
def log_softmax_2d(x: np.ndarray, *, axis: int = 1) -> np.ndarray:
    """Opsets 1-12: log-softmax over the flattened dims from ``axis`` on."""
    return _log_softmax(_as_2d(x, axis, "LogSoftmax"), 1).reshape(x.shape)


@kernel("LogSoftmax", since=13, dtypes=_FLOATS)
def log_softmax(x: np.ndarray, *, axis: int = -1) -> np.ndarray:
    """Opset 13+: log-softmax along ``axis``."""
    return _log_softmax(x, _axis(axis, x.ndim, "LogSoftmax"))
