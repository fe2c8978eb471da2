"""Conv: im2col through a strided window view plus one batched matmul for all groups.

Paths, fastest first:
    * 1x1, stride 1, no padding: a plain ``W @ X`` per image, no im2col at all.
    * 2-D stride 1 (any dilation, any group, depthwise included): im2col over the padded
      image with rows laid end to end, so the copy moves long contiguous runs.
    * general N-D: one copy of the strided window view into the (group, C/group * k, out)
      column matrix.
Every path ends in one batched matmul over (image, group); float16/bfloat16 accumulate in
float32.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels._window import pad_spatial, window_view
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.ir.window import window_geometry

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
    out: np.ndarray | None = None,
) -> np.ndarray:
    """N-D convolution (cross-correlation) of ``x`` (N, C, *S) with ``w`` (M, C/group, *K).

    With a planned ``out`` the matmul writes straight into it where the path's result has
    the output's layout; otherwise the bias add (or the final copy) does.
    """
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
    y_shape = (n, m) + tuple(g.out)
    if not fits(out, y_shape, out_dtype):
        out = None
    if n == 0 or p == 0:  # an empty batch or output: an empty result, as onnxruntime gives
        return out if out is not None else np.zeros(y_shape, out_dtype)
    # The matmul may write into ``out`` itself only when no dtype change follows.
    direct = out.reshape(n, group, mg, p) if out is not None and x.dtype == out_dtype else None
    if k == 1 and not any(g.begin) and not any(g.end) and all(st == 1 for st in g.strides):
        y = np.matmul(w.reshape(group, mg, cg), x.reshape(n, group, cg, p), out=direct)
    elif len(kshape) == 2 and g.strides == [1, 1]:
        cols, wp = _im2col_flat_2d(x, g, group)
        y = np.matmul(w.reshape(group, mg, cg * k), cols)  # junk columns: never into out
        ho, wo = g.out
        y = y.reshape(n, m, ho, wp)[..., :wo]
        direct = None
    else:
        xp = pad_spatial(x, g, 0)
        xp = xp.reshape((n, group, cg) + xp.shape[2:])
        cols = window_view(xp, g, lead=3).reshape(n, group, cg * k, p)
        y = np.matmul(w.reshape(group, mg, cg * k), cols, out=direct)
    y = y.reshape(y_shape)
    bias = None if b is None else b.astype(y.dtype, copy=False).reshape((1, m) + (1,) * len(g.out))
    if out is None:
        if bias is not None:
            y = y + bias
        return np.ascontiguousarray(y, dtype=out_dtype)
    if bias is not None:
        if direct is not None or y.dtype == out_dtype:
            return np.add(y, bias, out=out)
        y = y + bias
    if direct is None:
        np.copyto(out, y, casting="unsafe")  # float16/bfloat16: one rounding, as astype
    return out


def _im2col_flat_2d(x: np.ndarray, g, group: int) -> tuple[np.ndarray, int]:
    """Column matrix (N, group, C/group * K, ho * wp) of a stride-1 2-D conv, and ``wp``.

    With the padded image's rows laid end to end, the inputs that kernel offset (i, j) meets
    for every output are one contiguous run starting at ``i * wp + j`` (``wp``: padded
    width). Outputs are computed over the full padded width and the ``wp - wo`` junk
    columns dropped afterwards; in exchange the im2col copy moves long contiguous runs
    instead of ``wo``-element rows, which is what makes numpy's copy fast.
    """
    n, c = x.shape[:2]
    ho, _ = g.out
    # One extra bottom row keeps the last offset's run inside the buffer.
    # Padded by hand: np.pad's Python cost (about 10 us) was a third of a small conv's.
    h, w = x.shape[2:]
    hp, wp = g.begin[0] + h + g.end[0] + 1, g.begin[1] + w + g.end[1]
    xp = np.zeros((n, c, hp, wp), x.dtype)
    xp[:, :, g.begin[0] : g.begin[0] + h, g.begin[1] : g.begin[1] + w] = x
    flat = xp.reshape(n, group, c // group, -1)
    item = flat.itemsize
    sn, sg, sc, _ = flat.strides
    length = ho * wp
    k0, k1 = g.kernel
    # np.ndarray over the buffer rather than as_strided (whose wrapper costs about 8 us).
    view = np.ndarray(
        (n, group, c // group, k0, k1, length),
        flat.dtype,
        buffer=xp,
        strides=(sn, sg, sc, g.dilations[0] * wp * item, g.dilations[1] * item, item),
    )
    return view.reshape(n, group, (c // group) * k0 * k1, length), wp
