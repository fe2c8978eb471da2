"""Conv and pooling of the array-API family, for 1-D to 3-D images.

Conv: a 1×1 kernel with unit strides and no padding is one batched GEMM over the channels;
every other Conv is im2col + GEMM. The columns are gathered with the standard's strided
slicing, one slice of the padded input per kernel offset (``array_api_extra.pad`` pads), and
stacked, so ``cols[n, g, c*K + k, p]`` is the input element kernel offset ``k`` of output
position ``p`` reads; groups are one batched ``matmul``. Pools take the same window slices and
reduce over the stacked axis; AveragePool divides by a window sum of a padded mask of ones, so
``count_include_pad`` and ``ceil_mode`` follow ONNX exactly.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from anychip.backends.arrayapi.family._common import extra, kernel
from anychip.backends.arrayapi.tensor import Space
from anychip.errors import KernelError

__all__ = ["geometry", "windows"]


def geometry(
    spatial: tuple[int, ...], kernel_shape: list[int], attrs: dict[str, Any], *, ceil: bool = False
) -> tuple[list[int], list[tuple[int, int]], list[int], list[int], list[int]]:
    """(output sizes, (begin, end) pads incl. ceil-mode extra, strides, dilations, extra)."""
    n = len(spatial)
    strides = list(attrs.get("strides") or [1] * n)
    dil = list(attrs.get("dilations") or [1] * n)
    auto = attrs.get("auto_pad") or "NOTSET"
    auto = auto.decode() if isinstance(auto, bytes) else auto
    pads = list(attrs.get("pads") or [0] * (2 * n))
    outs, pad_pairs, extra = [], [], []
    for i, size in enumerate(spatial):
        span = (kernel_shape[i] - 1) * dil[i] + 1
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            o = -(-size // strides[i])
            total = max(0, (o - 1) * strides[i] + span - size)
            b = total // 2 if auto == "SAME_UPPER" else total - total // 2
            pb, pe = b, total - b
        else:
            pb, pe = (0, 0) if auto == "VALID" else (pads[i], pads[i + n])
            room = size + pb + pe - span
            o = (-(-room // strides[i]) if ceil else room // strides[i]) + 1
            if ceil and (o - 1) * strides[i] >= size + pb:
                o -= 1
        ex = max(0, (o - 1) * strides[i] + span - (size + pb + pe))
        outs.append(o)
        pad_pairs.append((pb, pe))
        extra.append(ex)
    return outs, pad_pairs, strides, dil, extra


def windows(
    s: Space, xpad: Any, ksize: list[int], outs: list[int], strides: list[int], dil: list[int]
) -> Any:
    """``[N, C, prod(ksize), *outs]``: the padded input under each kernel offset."""
    cols = []
    for offs in itertools.product(*[range(k) for k in ksize]):
        idx = [slice(None), slice(None)]
        for o, k, st, d in zip(outs, offs, strides, dil):
            idx.append(slice(k * d, k * d + st * (o - 1) + 1, st))
        cols.append(xpad[tuple(idx)])
    return s.xp.stack(cols, axis=2)


def _pad(s: Space, x: Any, pairs: list[tuple[int, int]], value: float) -> Any:
    if not any(p for pair in pairs for p in pair):
        return x
    return extra().pad(x, [(0, 0), (0, 0), *pairs], constant_values=value, xp=s.xp)


@kernel("Conv", since=1, until=22)
def conv(s: Space, x: Any, w: Any, b: Any = None, **attrs: Any) -> Any:
    xp = s.xp
    n, c, *spatial = x.shape
    m, cg, *ks = w.shape
    g = int(attrs.get("group", 1) or 1)
    if c != cg * g or m % g:
        raise KernelError(f"Conv: {c} input channels, weight {list(w.shape)} and group {g}")
    outs, pads, strides, dil, _ = geometry(tuple(spatial), ks, attrs)
    p = math.prod(outs)
    wg = xp.reshape(w, (g, m // g, cg * math.prod(ks)))
    pointwise = (
        all(k == 1 for k in ks)
        and all(st == 1 for st in strides)
        and not any(q for pair in pads for q in pair)
    )
    if pointwise:
        cols = xp.reshape(x, (n, g, cg, p))
    else:
        cols = windows(s, _pad(s, x, pads, 0.0), ks, outs, strides, dil)
        cols = xp.reshape(cols, (n, g, cg * math.prod(ks), p))
    y = xp.reshape(xp.matmul(wg, cols), (n, m, *outs))
    if b is not None:
        y = y + xp.reshape(b, (1, m) + (1,) * len(outs))
    return y


def _positions(
    s: Space, spatial: tuple, ks: list, outs: list, pads: list, strides: list, dil: list,
    attrs: dict[str, Any],
) -> Any:  # fmt: skip
    """``[1, 1, prod(ks), *outs]`` int64: the flat input index each window element reads
    (row-major, or column-major over the image for ``storage_order=1``), as MaxPool's
    Indices count them."""
    grids = np.meshgrid(*[np.arange(k) for k in ks], *[np.arange(o) for o in outs], indexing="ij")
    nd = len(ks)
    flat = np.zeros(grids[0].shape, np.int64)
    order = range(nd - 1, -1, -1) if attrs.get("storage_order", 0) else range(nd)
    for i in order:
        coord = grids[nd + i] * strides[i] + grids[i] * dil[i] - pads[i][0]
        flat = flat * spatial[i] + coord
    flat = flat.reshape((1, 1, math.prod(ks), *outs))
    return s.xp.asarray(flat, dtype=s.xp.int64, device=s.device)


def _pool(s: Space, x: Any, attrs: dict[str, Any], op: str, indices: bool = False) -> Any:
    xp = s.xp
    ks = list(attrs["kernel_shape"])
    spatial = tuple(x.shape[2:])
    ceil = bool(attrs.get("ceil_mode", 0))
    outs, pads, strides, dil, extra = geometry(spatial, ks, attrs, ceil=ceil)
    full = [(pb, pe + ex) for (pb, pe), ex in zip(pads, extra)]
    if op == "MaxPool":
        win = windows(s, _pad(s, x, full, -math.inf), ks, outs, strides, dil)
        if not indices:
            return xp.max(win, axis=2)
        k = xp.argmax(win, axis=2, keepdims=True)
        pos = _positions(s, spatial, ks, outs, pads, strides, dil, attrs)
        flat = xp.take_along_axis(xp.broadcast_to(pos, win.shape), k, axis=2)
        n, c = x.shape[:2]
        base = xp.arange(n * c, dtype=xp.int64, device=s.device) * math.prod(spatial)
        flat = xp.squeeze(flat, axis=2) + xp.reshape(base, (n, c) + (1,) * len(outs))
        return xp.squeeze(xp.take_along_axis(win, k, axis=2), axis=2), flat
    total = xp.sum(windows(s, _pad(s, x, full, 0.0), ks, outs, strides, dil), axis=2)
    ones = xp.ones((1, 1, *spatial), dtype=x.dtype, device=s.device)
    mask = _pad(s, ones, pads, 1.0 if attrs.get("count_include_pad", 0) else 0.0)
    mask = _pad(s, mask, [(0, ex) for ex in extra], 0.0)
    count = xp.sum(windows(s, mask, ks, outs, strides, dil), axis=2)
    return total / count


@kernel("MaxPool", since=8, until=22, context=True)
def max_pool(ctx: Any, s: Space, x: Any, **attrs: Any) -> Any:
    return _pool(s, x, attrs, "MaxPool", indices=ctx.outputs_used[1:2] == [True])


@kernel("AveragePool", since=7, until=22)
def average_pool(s: Space, x: Any, **attrs: Any) -> Any:
    return _pool(s, x, attrs, "AveragePool")


@kernel("GlobalAveragePool", since=1, until=22)
def global_average_pool(s: Space, x: Any) -> Any:
    return s.xp.mean(x, axis=tuple(range(2, len(x.shape))), keepdims=True)


@kernel("GlobalMaxPool", since=1, until=22)
def global_max_pool(s: Space, x: Any) -> Any:
    return s.xp.max(x, axis=tuple(range(2, len(x.shape))), keepdims=True)
