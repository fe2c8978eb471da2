"""Squeeze and Unsqueeze: ``axes`` is an attribute before opset 13 and an input from 13."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axes
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["squeeze_attr", "squeeze", "unsqueeze_attr", "unsqueeze"]


def _squeeze(data: np.ndarray, axes: list[int] | None) -> np.ndarray:
    if axes is None:
        return data.reshape(tuple(d for d in data.shape if d != 1))
    axes = norm_axes(axes, data.ndim, "Squeeze")
    for a in axes:
        if data.shape[a] != 1:
            raise KernelError(
                f"Squeeze: axis {a} of shape {data.shape} has size {data.shape[a]}, not 1"
            )
    return data.reshape(tuple(d for i, d in enumerate(data.shape) if i not in axes))


def _unsqueeze(data: np.ndarray, axes: list[int] | None) -> np.ndarray:
    if not axes:
        raise KernelError("Unsqueeze: 'axes' is required and must not be empty")
    rank = data.ndim + len(axes)
    axes = set(norm_axes(axes, rank, "Unsqueeze"))
    dims = iter(data.shape)
    return data.reshape(tuple(1 if i in axes else next(dims) for i in range(rank)))


@kernel("Squeeze", since=1, alias=True)
def squeeze_attr(data: np.ndarray, *, axes: list[int] | None = None) -> np.ndarray:
    """Opsets 1-12: remove the size-1 ``axes`` (all size-1 axes when unset)."""
    return _squeeze(data, axes)


@kernel("Squeeze", since=13, alias=True)
def squeeze(data: np.ndarray, axes: np.ndarray | None = None) -> np.ndarray:
    """Opset 13+: ``axes`` is an optional int64 input."""
    return _squeeze(data, int_list(axes))


@kernel("Unsqueeze", since=1, alias=True)
def unsqueeze_attr(data: np.ndarray, *, axes: list[int] | None = None) -> np.ndarray:
    """Opsets 1-12: insert size-1 dims at ``axes`` (positions in the output)."""
    return _unsqueeze(data, axes)


@kernel("Unsqueeze", since=13, alias=True)
def unsqueeze(data: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """Opset 13+: ``axes`` is an int64 input."""
    return _unsqueeze(data, int_list(axes))
