"""The executor's out protocol on the CPU backend (not a kernel module).

A kernel that declares ``out=None`` may be handed ``out``: a C-contiguous view of the
partition's planned arena with the output's expected shape and dtype (``core/run/program.py``).
It writes its result there and returns ``out`` itself, or returns a fresh array when the
result would not fit exactly; the helpers below make that test cheap and uniform, so a wrong
shape from shape inference is never silently broadcast into ``out`` or cast into its dtype.

For kernels registered ``inplace=True`` ``out`` may be the very memory of
the first input, so those kernels only ever read an element of their first input before
writing the same element of ``out`` (numpy ufuncs do; multi-step formulas must keep to it).
"""

from __future__ import annotations

import numpy as np

__all__ = ["fits", "fits_broadcast", "broadcast_shape", "unary_into"]


def fits(out: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> bool:
    """Whether ``out`` can hold a result of ``shape`` and ``dtype`` exactly."""
    return (
        out is not None
        and out.shape == shape
        and out.dtype == dtype
        and out.flags.c_contiguous
        and out.flags.writeable
    )


def unary_into(ufunc: np.ufunc, x: np.ndarray, out: np.ndarray | None, *rest) -> np.ndarray:
    """``ufunc(x, *rest)`` (``rest``: scalars), into ``out`` when it fits ``x``."""
    if fits(out, x.shape, x.dtype):
        return ufunc(x, *rest, out=out)
    return ufunc(x, *rest)


def fits_broadcast(out: np.ndarray | None, *arrays: np.ndarray) -> bool:
    """Whether ``out`` can hold an element-wise result of ``arrays``: same dtype as all of
    them, and exactly their broadcast shape."""
    if out is None or not out.flags.c_contiguous or not out.flags.writeable:
        return False
    dt = out.dtype
    shape = out.shape
    same = True
    for a in arrays:
        if a.dtype != dt:
            return False
        same = same and a.shape == shape
    if same:
        return True
    return broadcast_shape(*(a.shape for a in arrays)) == shape


def broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's broadcast of ``shapes``, or None when they do not broadcast: in Python, since
    ``np.broadcast_shapes`` costs ~3 us, more than a small element-wise op itself."""
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        off = rank - len(s)
        for i, d in enumerate(s):
            e = out[off + i]
            if d != e:
                if e == 1:
                    out[off + i] = d
                elif d != 1:
                    return None
    return tuple(out)
