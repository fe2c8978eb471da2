"""The C library's ``powf``: BeamSearch's length penalty as onnxruntime's compiled code
computes it (numpy's float32 power differs from glibc's in about a fifth of the (length,
penalty) pairs, which reorders hypotheses whose scores are that close)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from collections.abc import Callable

import numpy as np

__all__ = ["powf"]


@functools.lru_cache(maxsize=1)
def _powf() -> Callable[..., float] | None:
    path = ctypes.util.find_library("m")
    if path is None:
        return None
    try:
        fn = ctypes.CDLL(path).powf
    except (OSError, AttributeError):
        return None
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return fn  # type: ignore[no-any-return]


def powf(x: float, y: float) -> np.float32:
    """C's ``powf(x, y)``; numpy's float64 power rounded to float32 where there is no libm."""
    fn = _powf()
    if fn is None:
        return np.float32(np.power(np.float64(x), np.float64(y)))
    return np.float32(fn(float(x), float(y)))
