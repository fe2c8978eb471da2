"""ConvTranspose (N-D, groups, dilations, output_padding, output_shape, auto_pad) and Col2Im.

Both are "scatter-add of columns": ConvTranspose first forms the columns ``W^T @ X`` per
group with one matmul, then, like Col2Im, adds every kernel offset's slice into a strided
view of the (uncropped) output, one vectorised add per kernel offset, and crops the pads.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.backends.cpu.kernels._common import FLOAT_WITH_BF16, compute_dtype
from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["conv_transpose", "col2im", "fold_columns"]


def fold_columns(
    cols: np.ndarray,
    in_sizes: list[int],
    kernel: list[int],
    strides: list[int],
    dilations: list[int],
    full: list[int],
) -> np.ndarray:
    """Scatter-add ``cols`` [N, C, *kernel, *in_sizes] into a zero [N, C, *full] buffer.

    Kernel offset ``k`` and position ``i`` land at ``k * dilation + i * stride`` per axis.
    """
    n, c = cols.shape[:2]
    out = np.zeros((n, c) + tuple(full), dtype=cols.dtype)
    for offs in np.ndindex(*kernel):
        where = tuple(
            slice(o * d, o * d + (m - 1) * s + 1, s)
            for o, d, m, s in zip(offs, dilations, in_sizes, strides)
        )
        out[(slice(None), slice(None)) + where] += cols[(slice(None), slice(None)) + offs]
    return out


@kernel("ConvTranspose", since=1, dtypes=FLOAT_WITH_BF16)
def conv_transpose(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    output_padding: list[int] | None = None,
    output_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    if x.ndim < 3 or w.ndim != x.ndim:
        raise ModelError(
            f"ConvTranspose needs X of rank >= 3 and W of the same rank, got "
            f"{x.shape} and {w.shape}"
        )
    n, c = x.shape[:2]
    if w.shape[0] != c or c % group:
        raise ModelError(
            f"ConvTranspose: W {w.shape} must have X's {c} channels first, "
            f"divisible by group={group}"
        )
    nd = x.ndim - 2
    sizes = list(x.shape[2:])
    kshape = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    strides = list(strides) if strides else [1] * nd
    dilations = list(dilations) if dilations else [1] * nd
    out_pad = list(output_padding) if output_padding else [0] * nd
    eff = [(k - 1) * d + 1 for k, d in zip(kshape, dilations)]
    natural = [s * (i - 1) + op + e for s, i, op, e in zip(strides, sizes, out_pad, eff)]
    if output_shape:
        target = list(output_shape)[-nd:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = [i * s for i, s in zip(sizes, strides)]
    else:
        target = None
    if target is not None:
        total = [nat - t for nat, t in zip(natural, target)]
        if auto_pad == "SAME_UPPER":
            begin = [t // 2 for t in total]
        else:
            begin = [t - t // 2 for t in total]
        out_sizes = target
    else:
        p = list(pads) if pads and auto_pad == "NOTSET" else [0] * (2 * nd)
        begin = p[:nd]
        out_sizes = [nat - p[i] - p[nd + i] for i, nat in enumerate(natural)]
    m_per_group = w.shape[1]
    cg = c // group
    k = math.prod(kshape)
    p_in = math.prod(sizes)
    work = compute_dtype(x.dtype)
    xs = x.astype(work).reshape(n, group, cg, p_in)
    wg = w.astype(work).reshape(group, cg, m_per_group * k)
    cols = np.matmul(wg.transpose(0, 2, 1), xs)  # [N, group, M/g * K, P]
    cols = cols.reshape((n, group * m_per_group) + tuple(kshape) + tuple(sizes))
    # Buffer big enough for the natural extent and any requested (shifted) window.
    full = [max(nat, bg + o) - min(bg, 0) for nat, bg, o in zip(natural, begin, out_sizes)]
    buf = fold_columns(cols, sizes, kshape, strides, dilations, full)
    shift = [max(-bg, 0) for bg in begin]
    if any(shift):
        buf = np.pad(buf, [(0, 0), (0, 0)] + [(s, 0) for s in shift])
    crop = tuple(slice(bg + s, bg + s + o) for bg, s, o in zip(begin, shift, out_sizes))
    y = buf[(slice(None), slice(None)) + crop]
    if b is not None:
        y = y + b.astype(work).reshape((1, -1) + (1,) * nd)
    return np.ascontiguousarray(y).astype(x.dtype, copy=False)


@kernel("Col2Im", since=18)
def col2im(
    x: np.ndarray,
    image_shape: np.ndarray,
    block_shape: np.ndarray,
    *,
    dilations: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    image = [int(v) for v in np.asarray(image_shape).reshape(-1)]
    block = [int(v) for v in np.asarray(block_shape).reshape(-1)]
    nd = len(image)
    dilations = list(dilations) if dilations else [1] * nd
    strides = list(strides) if strides else [1] * nd
    p = list(pads) if pads else [0] * (2 * nd)
    eff = [(k - 1) * d + 1 for k, d in zip(block, dilations)]
    blocks = [
        (i + p[a] + p[nd + a] - e) // s + 1 for a, (i, e, s) in enumerate(zip(image, eff, strides))
    ]
    n, ck, length = x.shape
    k = math.prod(block)
    if ck % k or length != math.prod(blocks):
        raise ModelError(
            f"Col2Im: input {x.shape} does not fit block_shape {block} and "
            f"{blocks} blocks for image_shape {image}"
        )
    work = compute_dtype(x.dtype) if x.dtype.kind == "f" or x.dtype.kind == "V" else x.dtype
    cols = x.astype(work).reshape((n, ck // k) + tuple(block) + tuple(blocks))
    full = [i + p[a] + p[nd + a] for a, i in enumerate(image)]
    buf = fold_columns(cols, blocks, block, strides, dilations, full)
    crop = tuple(slice(p[a], p[a] + i) for a, i in enumerate(image))
    return np.ascontiguousarray(buf[(slice(None), slice(None)) + crop]).astype(x.dtype)
