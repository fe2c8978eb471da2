"""Shape and data-movement kernels of the array-API family: the ops CNN and transformer exports
are full of (Reshape, Transpose, Concat, Slice, Gather, Flatten, Squeeze/Unsqueeze, Expand,
Shape, Size, Identity, Tile, Split, ConstantOfShape).

Shape-like inputs (Reshape's shape, Slice's starts, ...) are read on the host (``ints``); a
small tensor copied in keeps its host copy, so constants cost no device round trip. Slices
are clamped to the axis first: the standard leaves out-of-bounds slices unspecified.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anychip.backends.arrayapi.family._common import ANY, ints, kernel, norm_axis
from anychip.backends.arrayapi.tensor import Space
from anychip.errors import KernelError

__all__ = ["reshape_to", "slice_axes"]


def reshape_to(s: Space, x: Any, shape: list[int], allowzero: int = 0) -> Any:
    """ONNX Reshape semantics: 0 copies the input's dimension (unless ``allowzero``)."""
    dims = [x.shape[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)]
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        dims[dims.index(-1)] = math.prod(x.shape) // known if known else 0
    return s.xp.reshape(x, tuple(dims))


@kernel("Reshape", since=5, until=25, dtypes=ANY)
def reshape(s: Space, x: Any, shape: Any, *, allowzero: int = 0) -> Any:
    return reshape_to(s, x, ints(s, shape), allowzero)


@kernel("Identity", since=1, until=14, dtypes=ANY)  # 16 added optional and sequence types
def identity(s: Space, x: Any) -> Any:
    return s.xp.asarray(x, copy=True)


@kernel("Flatten", since=1, until=25, dtypes=ANY)
def flatten(s: Space, x: Any, *, axis: int = 1) -> Any:
    a = axis + len(x.shape) if axis < 0 else axis
    return s.xp.reshape(x, (math.prod(x.shape[:a]), math.prod(x.shape[a:])))


def _squeeze(s: Space, x: Any, axes: list[int]) -> Any:
    rank = len(x.shape)
    drop = {norm_axis(a, rank, "Squeeze") for a in axes} if axes else None
    keep = [d for i, d in enumerate(x.shape) if not (d == 1 and (drop is None or i in drop))]
    return s.xp.reshape(x, tuple(keep))


def _unsqueeze(s: Space, x: Any, axes: list[int]) -> Any:
    rank = len(x.shape) + len(axes)
    new = {norm_axis(a, rank, "Unsqueeze") for a in axes}
    dims, it = [], iter(x.shape)
    for i in range(rank):
        dims.append(1 if i in new else next(it))
    return s.xp.reshape(x, tuple(dims))


@kernel("Squeeze", since=1, until=12, dtypes=ANY)
def squeeze_v1(s: Space, x: Any, *, axes: list[int] | None = None) -> Any:
    return _squeeze(s, x, list(axes or []))


@kernel("Squeeze", since=13, until=25, dtypes=ANY)
def squeeze(s: Space, x: Any, axes: Any = None) -> Any:
    return _squeeze(s, x, ints(s, axes))


@kernel("Unsqueeze", since=1, until=12, dtypes=ANY)
def unsqueeze_v1(s: Space, x: Any, *, axes: list[int]) -> Any:
    return _unsqueeze(s, x, list(axes))


@kernel("Unsqueeze", since=13, until=25, dtypes=ANY)
def unsqueeze(s: Space, x: Any, axes: Any) -> Any:
    return _unsqueeze(s, x, ints(s, axes))


@kernel("Transpose", since=1, until=25, dtypes=ANY)
def transpose(s: Space, x: Any, *, perm: list[int] | None = None) -> Any:
    order = tuple(perm) if perm else tuple(reversed(range(len(x.shape))))
    return s.xp.permute_dims(x, order)


def slice_axes(
    shape: tuple[int, ...], starts: list[int], ends: list[int], axes: list[int], steps: list[int]
) -> tuple[slice, ...]:
    """In-bounds Python slices for ONNX Slice's starts/ends/axes/steps (clamped as ONNX says)."""
    out = [slice(None)] * len(shape)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        if sp == 0:
            raise KernelError("Slice: a step of 0")
        a = norm_axis(ax, len(shape), "Slice")
        b, e, k = slice(st, en, sp).indices(shape[a])
        if k > 0:
            e = max(e, b)
        out[a] = slice(b, None if e < 0 else e, k) if k < 0 else slice(b, e, k)
        if k < 0 and e >= b:  # empty: a start at or before the stop, walking backwards
            out[a] = slice(0, 0, 1)
    return tuple(out)


@kernel("Slice", since=1, until=9, dtypes=ANY)
def slice_v1(s: Space, x: Any, *, starts: list, ends: list, axes: list | None = None) -> Any:
    axes = list(axes) if axes else list(range(len(starts)))
    return x[slice_axes(tuple(x.shape), list(starts), list(ends), axes, [1] * len(starts))]


@kernel("Slice", since=10, until=13, dtypes=ANY)
def slice_(s: Space, x: Any, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> Any:
    b, e = ints(s, starts), ints(s, ends)
    ax = ints(s, axes) or list(range(len(b)))
    st = ints(s, steps) or [1] * len(b)
    return s.xp.asarray(x[slice_axes(tuple(x.shape), b, e, ax, st)], copy=True)


@kernel("Concat", since=4, until=13, dtypes=ANY)
def concat(s: Space, *xs: Any, axis: int) -> Any:
    return s.xp.concat(list(xs), axis=norm_axis(axis, len(xs[0].shape), "Concat"))


@kernel("Gather", since=1, until=13, dtypes=ANY)
def gather(s: Space, x: Any, indices: Any, *, axis: int = 0) -> Any:
    xp = s.xp
    a = norm_axis(axis, len(x.shape), "Gather")
    flat = xp.reshape(indices, (-1,))
    flat = xp.where(flat < 0, flat + x.shape[a], flat)
    out = xp.take(x, flat, axis=a)
    return xp.reshape(out, tuple(x.shape[:a]) + tuple(indices.shape) + tuple(x.shape[a + 1 :]))


def _broadcast(a: tuple[int, ...], b: list[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a2, b2 = (1,) * (n - len(a)) + tuple(a), [1] * (n - len(b)) + list(b)
    out = []
    for p, q in zip(a2, b2):
        if p != q and 1 not in (p, q):
            raise KernelError(f"Expand: shapes {list(a)} and {list(b)} do not broadcast")
        out.append(q if p == 1 else p)
    return tuple(out)


@kernel("Expand", since=8, until=13, dtypes=ANY)
def expand(s: Space, x: Any, shape: Any) -> Any:
    return s.xp.asarray(s.xp.broadcast_to(x, _broadcast(tuple(x.shape), ints(s, shape))), copy=True)


@kernel("Tile", since=6, until=13, dtypes=ANY)
def tile(s: Space, x: Any, repeats: Any) -> Any:
    return s.xp.tile(x, tuple(ints(s, repeats)))


@kernel("Shape", since=1, until=25, dtypes=ANY)
def shape(s: Space, x: Any, *, start: int = 0, end: int | None = None) -> Any:
    dims = list(x.shape)[slice(start, end)]
    return s.xp.asarray(dims, dtype=s.xp.int64, device=s.device)


@kernel("Size", since=1, until=25, dtypes=ANY)
def size(s: Space, x: Any) -> Any:
    return s.xp.asarray(math.prod(x.shape), dtype=s.xp.int64, device=s.device)


def _split(s: Space, x: Any, axis: int, sizes: list[int] | None, count: int) -> tuple:
    a = norm_axis(axis, len(x.shape), "Split")
    d = x.shape[a]
    if not sizes:
        chunk = -(-d // count)
        sizes = [min(chunk, d - i * chunk) for i in range(count)]
    if sum(sizes) != d:
        raise KernelError(f"Split: sizes {sizes} do not add up to the axis' {d}")
    outs, at = [], 0
    for n in sizes:
        idx = [slice(None)] * len(x.shape)
        idx[a] = slice(at, at + n)
        outs.append(s.xp.asarray(x[tuple(idx)], copy=True))
        at += n
    return tuple(outs)


@kernel("Split", since=2, until=12, dtypes=ANY, context=True)
def split_v2(ctx: Any, s: Space, x: Any, *, axis: int = 0, split: list | None = None) -> tuple:
    return _split(s, x, axis, list(split or []), ctx.num_outputs)


@kernel("Split", since=13, until=18, dtypes=ANY, context=True)
def split(
    ctx: Any, s: Space, x: Any, sizes: Any = None, *, axis: int = 0, num_outputs: int | None = None
) -> tuple:
    return _split(s, x, axis, ints(s, sizes), num_outputs or ctx.num_outputs)


@kernel("ConstantOfShape", since=9, until=25, dtypes=frozenset(ANY))
def constant_of_shape(s: Space, shape: Any, *, value: Any = None) -> Any:
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value)
    dims = tuple(ints(s, shape))
    return s.xp.full(dims, fill.reshape(()).item(), dtype=s.xdtype(fill.dtype), device=s.device)
