"""Pooling: MaxPool (with Indices), AveragePool, GlobalAveragePool, GlobalMaxPool.

Windows come from a strided view of the padded input; the reduction loops over kernel offsets
(9 for 3x3), each step a full vectorised pass over (N, C, *out), which beats a numpy
reduction over the trailing window axes of a strided view.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels._window import pad_spatial, window_view
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.ir.window import window_geometry

__all__ = ["max_pool", "average_pool", "global_average_pool", "global_max_pool"]

_FLOATS = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})
_MAXPOOL_TYPES = _FLOATS | {DType.INT8, DType.UINT8}


def _check_input(x: np.ndarray, op: str, kernel_shape) -> None:
    if x.ndim < 3:
        raise KernelError(
            f"{op} needs an input of rank >= 3 (N, C, spatial...), got shape {x.shape}"
        )
    if not kernel_shape:
        raise KernelError(f"{op}: the kernel_shape attribute is required")


def _lowest(dtype: np.dtype):
    if dtype.kind in "iu":
        return np.iinfo(dtype).min
    return -np.inf


@kernel("MaxPool", since=1, dtypes=_MAXPOOL_TYPES, context=True)
def max_pool(
    ctx,
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    out: np.ndarray | None = None,
):
    """Max over each window; the optional second output holds flat argmax indices.

    Indices are into the flattened input (N, C, *S), row-major, or column-major over the
    spatial axes when ``storage_order=1``; the first maximum in window order wins.
    """
    _check_input(x, "MaxPool", kernel_shape)
    g = window_geometry(
        x.shape[2:],
        kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        op="MaxPool",
    )
    xp = pad_spatial(x, g, _lowest(x.dtype))
    view = window_view(xp, g)
    want_indices = ctx.num_outputs > 1
    y = None
    idx = None
    spatial = x.shape[2:]
    if want_indices or not fits(out, x.shape[:2] + tuple(g.out), x.dtype):
        out = None
    for offs in np.ndindex(*g.kernel):
        win = view[(slice(None), slice(None)) + offs]
        if y is None:
            y = np.array(win) if out is None else out
            if out is not None:
                np.copyto(out, win)
            if want_indices:
                idx = np.broadcast_to(_flat_index(offs, g, spatial, storage_order), y.shape).copy()
            continue
        if want_indices:
            better = win > y
            np.copyto(idx, _flat_index(offs, g, spatial, storage_order), where=better)
        np.maximum(y, win, out=y)
    if not want_indices:
        return y
    n, c = x.shape[:2]
    plane = int(np.prod(spatial))
    base = (np.arange(n * c, dtype=np.int64) * plane).reshape((n, c) + (1,) * len(spatial))
    return y, idx + base


def _flat_index(
    offs: tuple[int, ...], g, spatial: tuple[int, ...], storage_order: int
) -> np.ndarray:
    """Flat spatial index of kernel offset ``offs`` for every output position."""
    nd = len(spatial)
    coords = []
    for i in range(nd):
        pos = np.arange(g.out[i]) * g.strides[i] - g.begin[i] + offs[i] * g.dilations[i]
        coords.append(pos.reshape((-1,) + (1,) * (nd - 1 - i)))
    # Padding positions never win (they hold the dtype's lowest value), so clamping is safe.
    coords = [np.clip(cd, 0, s - 1) for cd, s in zip(coords, spatial)]
    flat = np.zeros((1,) * nd, dtype=np.int64)
    order = range(nd) if storage_order == 0 else reversed(range(nd))
    for i in order:
        flat = flat * spatial[i] + coords[i]
    return flat


@kernel("AveragePool", since=1, dtypes=_FLOATS)
def average_pool(
    x: np.ndarray,
    *,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    count_include_pad: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Mean over each window; padding counts in the divisor only with count_include_pad=1.

    ceil_mode's extra trailing positions never count.
    """
    _check_input(x, "AveragePool", kernel_shape)
    g = window_geometry(
        x.shape[2:],
        kernel_shape,
        strides=strides,
        dilations=dilations,
        pads=pads,
        auto_pad=auto_pad,
        ceil_mode=ceil_mode,
        op="AveragePool",
    )
    xp = pad_spatial(x, g, 0)
    view = window_view(xp, g)
    work = np.float32 if x.dtype.itemsize < 4 else x.dtype
    shape = x.shape[:2] + tuple(g.out)
    if work == x.dtype and fits(out, shape, x.dtype):
        total = out
        total.fill(0)
    else:
        total = np.zeros(shape, dtype=work)
    for offs in np.ndindex(*g.kernel):
        total += view[(slice(None), slice(None)) + offs]
    counts = _window_counts(x.shape[2:], g, count_include_pad)
    total /= counts.astype(work)
    return total.astype(x.dtype, copy=False)


_COUNTS: dict[tuple, np.ndarray] = {}


def _window_counts(spatial: tuple[int, ...], g, count_include_pad: int) -> np.ndarray:
    """Number of counted elements in each window, shape (1, 1, *out); kept per geometry (a
    pooling node sees the same one run after run, and working it out padded ones again cost
    as much as the pooling of a small feature map). Read-only."""
    key = (tuple(spatial), count_include_pad) + tuple(
        tuple(getattr(g, f)) for f in type(g).__slots__
    )
    counts = _COUNTS.get(key)
    if counts is None:
        counts = _make_counts(spatial, g, count_include_pad)
        counts.flags.writeable = False
        if len(_COUNTS) >= 256:
            _COUNTS.clear()
        _COUNTS[key] = counts
    return counts


def _make_counts(spatial: tuple[int, ...], g, count_include_pad: int) -> np.ndarray:
    ones = np.ones((1, 1) + tuple(spatial), dtype=np.float32)
    if count_include_pad:
        ones = pad_spatial(ones, g, 1, with_extra=False)
        inner = type(g)(
            [0] * len(spatial),
            [0] * len(spatial),
            g.extra_end,
            g.out,
            g.kernel,
            g.strides,
            g.dilations,
        )
        padded = pad_spatial(ones, inner, 0)
    else:
        padded = pad_spatial(ones, g, 0)
    view = window_view(padded, g)
    counts = np.zeros((1, 1) + tuple(g.out), dtype=np.float32)
    for offs in np.ndindex(*g.kernel):
        counts += view[(slice(None), slice(None)) + offs]
    return counts


@kernel("GlobalAveragePool", since=1, dtypes=_FLOATS)
def global_average_pool(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Mean over all spatial axes, keeping them as size-1 axes."""
    axes = tuple(range(2, x.ndim))
    if not fits(out, x.shape[:2] + (1,) * len(axes), x.dtype):
        out = None
    return np.mean(x, axis=axes, keepdims=True, dtype=x.dtype, out=out)


@kernel("GlobalMaxPool", since=1, dtypes=_FLOATS)
def global_max_pool(x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    """Max over all spatial axes, keeping them as size-1 axes."""
    axes = tuple(range(2, x.ndim))
    if not fits(out, x.shape[:2] + (1,) * len(axes), x.dtype):
        out = None
    return np.max(x, axis=axes, keepdims=True, out=out)
