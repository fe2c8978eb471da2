"""Reshape: opset 1 takes the shape as an attribute, opset 5+ as an input; opset 14 adds
``allowzero`` (a 0 in the shape is a real zero instead of "copy this dimension")."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["reshape_attr", "reshape", "resolve_shape", "target_shape"]


def resolve_shape(in_shape: tuple[int, ...], shape: list[int], allowzero: int) -> tuple[int, ...]:
    """The target shape with 0 (copy) and -1 (infer) resolved per ONNX rules."""
    out = list(shape)
    if not allowzero:
        for i, d in enumerate(out):
            if d == 0:
                if i >= len(in_shape):
                    raise KernelError(
                        f"Reshape: shape {shape} copies dimension {i} (0) but "
                        f"the input {in_shape} has only {len(in_shape)} dims"
                    )
                out[i] = in_shape[i]
    if out.count(-1) > 1:
        raise KernelError(f"Reshape: shape {shape} has more than one -1")
    total = math.prod(in_shape)
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or total % known:
            raise KernelError(
                f"Reshape: cannot infer -1 in {shape} for an input of shape "
                f"{in_shape} ({total} elements)"
            )
        out[out.index(-1)] = total // known
    if math.prod(out) != total or any(d < 0 for d in out):
        raise KernelError(
            f"Reshape: input of shape {in_shape} ({total} elements) cannot be reshaped to {shape}"
        )
    return tuple(out)


@kernel("Reshape", since=1, alias=True)
def reshape_attr(
    data: np.ndarray, *, shape: list[int] | None = None, consumed_inputs=None
) -> np.ndarray:
    """Opsets 1-4: the target shape is an attribute."""
    if shape is None:
        raise KernelError("Reshape (opset < 5): the 'shape' attribute is required")
    return data.reshape(resolve_shape(data.shape, list(shape), 0))


@kernel("Reshape", since=5, alias=True)
def reshape(data: np.ndarray, shape: np.ndarray, *, allowzero: int = 0) -> np.ndarray:
    """Opset 5+: the target shape is an int64 input."""
    return data.reshape(target_shape(data.shape, shape, allowzero))


def target_shape(in_shape: tuple[int, ...], shape: Any, allowzero: int) -> tuple[int, ...]:
    """What Reshape makes of ``in_shape`` given the ``shape`` input (memoized for the int64
    vectors models hold)."""
    if type(shape) is np.ndarray and shape.dtype == np.int64 and shape.ndim == 1:
        return _resolved(in_shape, shape.tobytes(), allowzero)
    return resolve_shape(in_shape, int_list(shape), allowzero)


@functools.lru_cache(maxsize=4096)
def _resolved(in_shape: tuple[int, ...], shape: bytes, allowzero: int) -> tuple[int, ...]:
    """``resolve_shape`` memoized by the input shape and the shape tensor's bytes: a model
    reshapes the same shapes every run (the tiny transformer exports: 16 Reshapes a run,
    each 2-3 us of Python before)."""
    return resolve_shape(in_shape, np.frombuffer(shape, np.int64).tolist(), allowzero)
