"""Sliding windows over numpy arrays, shared by the CPU's Conv and pooling kernels (not a kernel
module).

``pad_spatial`` pads the spatial axes by a ``Geometry`` (``ir/window.py``: ONNX's pads and
output sizes, the same for every backend); ``window_view`` gives a zero-copy strided view of
every window so kernels do im2col with one reshape or reduce with one loop over kernel offsets.
"""

from __future__ import annotations

import numpy as np

from anychip.ir.window import Geometry

__all__ = ["pad_spatial", "window_view"]


def pad_spatial(
    x: np.ndarray, g: Geometry, value: float | int, *, with_extra: bool = True
) -> np.ndarray:
    """``x`` padded on its spatial axes (2..) by the geometry's pads, with ``value``."""
    ends = [e + (x_ if with_extra else 0) for e, x_ in zip(g.end, g.extra_end)]
    if not any(g.begin) and not any(ends):
        return x
    if min(g.begin) < 0 or min(ends) < 0:
        width = [(0, 0), (0, 0)] + list(zip(g.begin, ends))
        return np.pad(x, width, mode="constant", constant_values=value)
    # Filled and copied by hand: np.pad's Python cost (about 20 us) exceeded the pooling of a
    # small feature map.
    spatial = x.shape[2:]
    shape = x.shape[:2] + tuple(s + b + e for s, b, e in zip(spatial, g.begin, ends))
    xp = np.zeros(shape, x.dtype) if value == 0 else np.full(shape, value, x.dtype)
    inner = tuple(slice(b, b + s) for b, s in zip(g.begin, spatial))
    xp[(slice(None), slice(None)) + inner] = x
    return xp


def window_view(
    xp: np.ndarray, g: Geometry, lead: int = 2, kernel_first: bool = True
) -> np.ndarray:
    """A read-only view of shape ``lead dims + kernel + out`` (or ``+ out + kernel``).

    ``xp`` is already padded; its first ``lead`` axes are kept as they are.
    """
    st = xp.strides
    sp = st[lead:]
    k_shape = tuple(g.kernel)
    k_strides = tuple(s * d for s, d in zip(sp, g.dilations))
    o_shape = tuple(g.out)
    o_strides = tuple(s * t for s, t in zip(sp, g.strides))
    if kernel_first:
        shape = xp.shape[:lead] + k_shape + o_shape
        strides = st[:lead] + k_strides + o_strides
    else:
        shape = xp.shape[:lead] + o_shape + k_shape
        strides = st[:lead] + o_strides + k_strides
    if not xp.flags.c_contiguous:
        return np.lib.stride_tricks.as_strided(xp, shape=shape, strides=strides, writeable=False)
    # np.ndarray over the buffer: as_strided's wrapper costs about 8 us a call.
    view = np.ndarray(shape, xp.dtype, buffer=xp, strides=strides)
    view.flags.writeable = False
    return view
