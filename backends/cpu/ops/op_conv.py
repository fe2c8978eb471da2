"""Conv: im2col through a strided window view plus one batched matmul for all groups.

Paths, fastest first:
    * 1x1, stride 1, no padding: a plain ``W @ X`` per image, no im2col at all.
    * depthwise-like (one input channel per group): a loop over the kernel offsets (9 for
      3x3) accumulating ``w[:, :, k] * window`` over every channel at once.
    * general: one copy into the (group, C/group * k, out) column matrix and one matmul.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.ops._window import pad_spatial, window_geometry, window_view
from anychip.backends.cpu.table import kernel
from anychip.core.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["conv"]

_CONV_TYPES = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})


@kernel("Conv", since=1, dtypes=_CONV_TYPES)
def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """N-D convolution (cross-correlation) of ``x`` (N, C, *S) with ``w`` (M, C/group, *K)."""
    if x.ndim < 3 or w.ndim != x.ndim:
        raise KernelError(
            f"Conv needs X of rank >= 3 and W of the same rank, got shapes {x.shape} and {w.shape}"
        )
    n, c = x.shape[:2]
    m, cg = w.shape[:2]
    if group < 1 or c != cg * group or m % group:
        raise KernelError(
            f"Conv: X has {c} channels, W {w.shape} and group={group} do not "
            f"fit (need C == W.shape[1] * group and M divisible by group)"
        )
    kshape = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    g = window_geometry(
        x.shape[2:],
        kshape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        op="Conv",
    )
    out_dtype = x.dtype
    if x.dtype.itemsize < 4:
        # float16/bfloat16: accumulate in float32 and round once at the end.
        x = x.astype(np.float32)
    mg = m // group
    p = math.prod(g.out)
    k = math.prod(kshape)
    w = w.astype(x.dtype, copy=False)
    if k == 1 and not any(g.begin) and not any(g.end) and all(s == 1 for s in g.strides):
        xs = x.reshape(n, group, cg, p)
        y = np.matmul(w.reshape(group, mg, cg), xs)
    elif cg == 1:
        y = _depthwise(x, w, g, group, mg)
    else:
        xp = pad_spatial(x, g, 0)
        xp = xp.reshape((n, group, cg) + xp.shape[2:])
        cols = window_view(xp, g, lead=3).reshape(n, group, cg * k, p)
        y = np.matmul(w.reshape(group, mg, cg * k), cols)
    y = y.reshape((n, m) + tuple(g.out))
    if b is not None:
        y += b.astype(y.dtype, copy=False).reshape((1, m) + (1,) * len(g.out))
    return y.astype(out_dtype, copy=False)


def _depthwise(x: np.ndarray, w: np.ndarray, g, group: int, mg: int) -> np.ndarray:
    """One input channel per group: accumulate over kernel offsets, vectorised over channels."""
    n = x.shape[0]
    xp = pad_spatial(x, g, 0)
    view = window_view(xp, g, lead=2)  # (N, C, *K, *out)
    nk = len(g.kernel)
    wk = w.reshape((group, mg) + tuple(g.kernel))
    y = np.zeros((n, group, mg) + tuple(g.out), dtype=x.dtype)
    tail = (1,) * len(g.out)
    for offs in np.ndindex(*g.kernel):
        win = view[(slice(None), slice(None)) + offs]  # (N, C, *out)
        coef = wk[(slice(None), slice(None)) + offs].reshape((1, group, mg) + tail)
        y += coef * win[:, :, None]
    del nk
    return y.reshape((n, group, mg, -1))
