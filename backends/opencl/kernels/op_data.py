"""Data movement: Reshape-like views, and Transpose/Slice/Concat/Split/Expand/Tile/Gather.

Views (Reshape, Flatten, Squeeze, Unsqueeze) share their input's buffer (reference counted,
see ``driver``). Everything else is one kernel, a *strided copy*: for each element of a
(collapsed) index space, read the source at ``sbase + sum(i_d * ss_d)`` and write the
destination at ``dbase + sum(i_d * ds_d)``. Transpose permutes source strides, Slice offsets
and scales them (negative steps too), Expand and Tile use zero strides, Concat and Split move
each part into or out of a window of the whole. Kernels copy elements as 1/2/4/8-byte words,
so every dtype of those sizes moves (bool, ints, floats).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from anychip.backends.opencl.driver import ClDevice, ClTensor
from anychip.backends.opencl.kernels._common import (
    collapse,
    contiguous_strides,
    dev,
    ints,
    launch1d,
    norm_axis,
)
from anychip.backends.opencl.kernels.table import kernel
from anychip.errors import KernelError

__all__ = ["strided_copy", "reshape_to", "transpose_to"]

_WORDS = {1: "uchar", 2: "ushort", 4: "uint", 8: "ulong"}


def _source() -> str:
    parts = []
    for size, e in _WORDS.items():
        parts.append(
            f"__kernel void k_copy_{size}(__global const {e}* x, __global {e}* y, "
            "__global const int* m, int n) { int i = get_global_id(0); if (i >= n) return; "
            "int nd = m[0]; int r = i; int os = m[1 + 3 * nd], od = m[2 + 3 * nd]; "
            "for (int d = nd - 1; d >= 0; --d) { int s = m[1 + d]; int q = r % s; r /= s; "
            "os += q * m[1 + nd + d]; od += q * m[1 + 2 * nd + d]; } y[od] = x[os]; }"
        )
        for it in ("long", "int"):
            parts.append(
                f"__kernel void k_gather_{size}_{it}(__global const {e}* x, "
                f"__global const {it}* idx, __global {e}* y, int dim, int nidx, int inner, "
                "int n) { int i = get_global_id(0); if (i >= n) return; int in_ = i % inner; "
                "int t = i / inner; int j = t % nidx; int o = t / nidx; long ix = idx[j]; "
                "if (ix < 0) ix += dim; ix = clamp(ix, (long)0, (long)(dim - 1)); "
                "y[i] = x[(o * dim + (int)ix) * inner + in_]; }"
            )
    return "\n".join(parts)


def _word(dtype: np.dtype) -> int:
    size = np.dtype(dtype).itemsize
    if size not in _WORDS:
        raise KernelError(f"OpenCL data movement takes 1/2/4/8-byte elements, not {dtype}")
    return size


def strided_copy(
    src: ClTensor,
    dst: ClTensor,
    shape: Sequence[int],
    sstrides: Sequence[int],
    dstrides: Sequence[int],
    sbase: int = 0,
    dbase: int = 0,
) -> None:
    """``dst[dbase + i.ds] = src[sbase + i.ss]`` for every index ``i`` of ``shape``."""
    n = int(np.prod(shape, dtype=np.int64)) if len(shape) else 1
    if n == 0:
        return
    d = dev(src, dst)
    dims, (ss, ds) = collapse(shape, [list(sstrides), list(dstrides)])
    meta = d.meta((len(dims), *dims, *ss, *ds, sbase, dbase))
    size = _word(src.dtype)
    launch1d(d, "move", "uchar", f"k_copy_{size}", _source, n, [src.buffer, dst.buffer, meta])


def _dense(d: ClDevice, shape: Sequence[int], src: ClTensor) -> ClTensor:
    return d.empty(tuple(shape), src.dtype)


def transpose_to(x: ClTensor, perm: Sequence[int]) -> ClTensor:
    """``x`` with its axes permuted (a new dense tensor)."""
    st = contiguous_strides(x.shape)
    shape = [x.shape[p] for p in perm]
    y = _dense(dev(x), shape, x)
    strided_copy(x, y, shape, [st[p] for p in perm], contiguous_strides(shape))
    return y


def reshape_to(x: ClTensor, shape: Sequence[int]) -> ClTensor:
    """A view of ``x`` with ``shape`` (same element count)."""
    if int(np.prod(shape, dtype=np.int64)) != x.size:
        raise KernelError(f"cannot view {list(x.shape)} as {list(shape)}: sizes differ")
    return x.view(tuple(int(s) for s in shape))


# Identity-16 takes optionals and sequences, which an OpenCL device does not hold; the
# identity-elimination pass removes most Identity nodes before placement anyway.
@kernel("Identity", since=1, until=14)
def identity(x: ClTensor) -> ClTensor:
    return x.view(x.shape)


@kernel("Reshape", since=5)
def reshape(x: ClTensor, shape: ClTensor, *, allowzero: int = 0) -> ClTensor:
    want = ints(shape)
    out = [x.shape[i] if (s == 0 and not allowzero) else s for i, s in enumerate(want)]
    if out.count(-1) > 1:
        raise KernelError(f"Reshape: more than one -1 in {want}")
    if -1 in out:
        known = int(np.prod([s for s in out if s != -1], dtype=np.int64))
        if known == 0 or x.size % known:
            raise KernelError(f"Reshape: cannot infer -1 of {want} for {list(x.shape)}")
        out[out.index(-1)] = x.size // known
    return reshape_to(x, out)


@kernel("Flatten", since=1)
def flatten(x: ClTensor, *, axis: int = 1) -> ClTensor:
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a <= x.ndim:
        raise KernelError(f"Flatten: axis {axis} is out of range for rank {x.ndim}")
    outer = int(np.prod(x.shape[:a], dtype=np.int64))
    return reshape_to(x, [outer, int(np.prod(x.shape[a:], dtype=np.int64))])


def _squeeze(x: ClTensor, axes: list[int] | None) -> ClTensor:
    if axes is None or not axes:
        return reshape_to(x, [s for s in x.shape if s != 1])
    drop = {norm_axis(a, x.ndim, "Squeeze") for a in axes}
    for a in drop:
        if x.shape[a] != 1:
            raise KernelError(f"Squeeze: axis {a} of {list(x.shape)} is not 1")
    return reshape_to(x, [s for i, s in enumerate(x.shape) if i not in drop])


def _unsqueeze(x: ClTensor, axes: list[int]) -> ClTensor:
    rank = x.ndim + len(axes)
    put = sorted(norm_axis(a, rank, "Unsqueeze") for a in axes)
    if len(set(put)) != len(put):
        raise KernelError(f"Unsqueeze: repeated axes {axes}")
    shape = list(x.shape)
    for a in put:
        shape.insert(a, 1)
    return reshape_to(x, shape)


@kernel("Squeeze", since=1, until=12)
def squeeze_v1(x: ClTensor, *, axes: list[int] | None = None) -> ClTensor:
    return _squeeze(x, axes)


@kernel("Squeeze", since=13)
def squeeze(x: ClTensor, axes: ClTensor | None = None) -> ClTensor:
    return _squeeze(x, ints(axes) if axes is not None else None)


@kernel("Unsqueeze", since=1, until=12)
def unsqueeze_v1(x: ClTensor, *, axes: list[int]) -> ClTensor:
    return _unsqueeze(x, axes)


@kernel("Unsqueeze", since=13)
def unsqueeze(x: ClTensor, axes: ClTensor) -> ClTensor:
    return _unsqueeze(x, ints(axes))


@kernel("Transpose", since=1)
def transpose(x: ClTensor, *, perm: list[int] | None = None) -> ClTensor:
    p = list(perm) if perm is not None else list(range(x.ndim))[::-1]
    if sorted(p) != list(range(x.ndim)):
        raise KernelError(f"Transpose: perm {p} is not a permutation of {x.ndim} axes")
    return transpose_to(x, p)


def _slice(x: ClTensor, starts: list, ends: list, axes: list | None, steps: list | None):
    axes = list(range(len(starts))) if not axes else axes
    steps = [1] * len(starts) if not steps else steps
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise KernelError("Slice: starts, ends, axes and steps differ in length")
    st = contiguous_strides(x.shape)
    shape, sstr, base = list(x.shape), list(st), 0
    for s, e, a, k in zip(starts, ends, axes, steps):
        a = norm_axis(a, x.ndim, "Slice")
        if k == 0:
            raise KernelError("Slice: a step of 0")
        r = range(x.shape[a])[slice(s, e, k)]
        shape[a] = len(r)
        sstr[a] = st[a] * r.step
        if len(r):
            base += r.start * st[a]
    y = _dense(dev(x), shape, x)
    strided_copy(x, y, shape, sstr, contiguous_strides(shape), sbase=base)
    return y


@kernel("Slice", since=1, until=9)
def slice_v1(x: ClTensor, *, starts: list, ends: list, axes: list | None = None) -> ClTensor:
    return _slice(x, starts, ends, axes, None)


@kernel("Slice", since=10)
def slice_(x, starts, ends, axes=None, steps=None) -> ClTensor:
    return _slice(
        x,
        ints(starts),
        ints(ends),
        ints(axes) if axes is not None else None,
        ints(steps) if steps is not None else None,
    )


@kernel("Concat", since=4)
def concat(*xs: ClTensor, axis: int) -> ClTensor:
    first = xs[0]
    a = norm_axis(axis, first.ndim, "Concat")
    shape = list(first.shape)
    shape[a] = sum(x.shape[a] for x in xs)
    for x in xs:
        if x.ndim != first.ndim or any(
            i != a and s != t for i, (s, t) in enumerate(zip(x.shape, first.shape))
        ):
            raise KernelError(f"Concat: shapes {list(first.shape)} and {list(x.shape)} differ")
    y = _dense(dev(*xs), shape, first)
    dst = contiguous_strides(shape)
    at = 0
    for x in xs:
        strided_copy(x, y, x.shape, contiguous_strides(x.shape), dst, dbase=at * dst[a])
        at += x.shape[a]
    return y


def _split(x: ClTensor, axis: int, sizes: list[int] | None, count: int) -> tuple:
    a = norm_axis(axis, x.ndim, "Split")
    dim = x.shape[a]
    if not sizes:
        step = -(-dim // count)
        sizes = [min(step, dim - i * step) for i in range(count)]
    if sum(sizes) != dim or len(sizes) != count:
        raise KernelError(f"Split: sizes {sizes} do not split {dim} into {count} outputs")
    st = contiguous_strides(x.shape)
    outs, at = [], 0
    for s in sizes:
        shape = list(x.shape)
        shape[a] = s
        y = _dense(dev(x), shape, x)
        strided_copy(x, y, shape, st, contiguous_strides(shape), sbase=at * st[a])
        outs.append(y)
        at += s
    return tuple(outs)


@kernel("Split", since=2, until=10, context=True)
def split_v2(ctx, x, *, axis=0, split=None):
    return _split(x, axis, list(split) if split else None, ctx.num_outputs)


@kernel("Split", since=13, context=True)
def split(ctx, x, sizes=None, *, axis=0, num_outputs=None):
    return _split(x, axis, ints(sizes) if sizes is not None else None, ctx.num_outputs)


def broadcast_to(x: ClTensor, out: Sequence[int]) -> ClTensor:
    """``x`` broadcast (numpy rules) to the shape ``out``, as a new dense tensor."""
    st = contiguous_strides(x.shape)
    lead = len(out) - x.ndim
    sstr = [0] * lead + [0 if s == 1 else t for s, t in zip(x.shape, st)]
    y = _dense(dev(x), out, x)
    strided_copy(x, y, out, sstr, contiguous_strides(out))
    return y


@kernel("Expand", since=8)
def expand(x: ClTensor, shape: ClTensor) -> ClTensor:
    want = ints(shape)
    try:
        out = list(np.broadcast_shapes(x.shape, tuple(want)))
    except ValueError:
        raise KernelError(f"Expand: {list(x.shape)} does not broadcast to {want}") from None
    return broadcast_to(x, out)


@kernel("Tile", since=6)
def tile(x: ClTensor, repeats: ClTensor) -> ClTensor:
    reps = ints(repeats)
    if len(reps) != x.ndim or any(r < 0 for r in reps):
        raise KernelError(f"Tile: repeats {reps} do not fit rank {x.ndim}")
    st = contiguous_strides(x.shape)
    shape = [r * s for r, s in zip(reps, x.shape)]
    y = _dense(dev(x), shape, x)
    # Index space (r0, s0, r1, s1, ...): the repeat axes read with stride 0.
    space, sstr = [], []
    for r, s, t in zip(reps, x.shape, st):
        space += [r, s]
        sstr += [0, t]
    strided_copy(x, y, space, sstr, contiguous_strides(space))
    return y


@kernel("Gather", since=1)
def gather(x: ClTensor, indices: ClTensor, *, axis: int = 0) -> ClTensor:
    d = dev(x, indices)
    a = norm_axis(axis, x.ndim, "Gather")
    dim = x.shape[a]
    if indices.dtype not in (np.int64, np.int32):
        raise KernelError(f"Gather: indices must be int32 or int64, not {indices.dtype}")
    if indices.host is not None:
        bad = [int(i) for i in indices.host.reshape(-1) if not -dim <= int(i) < dim]
        if bad:
            raise KernelError(f"Gather: indices {bad[:5]} are out of range for axis size {dim}")
    shape = [*x.shape[:a], *indices.shape, *x.shape[a + 1 :]]
    y = d.empty(tuple(shape), x.dtype)
    if y.size == 0:
        return y
    inner = int(np.prod(x.shape[a + 1 :], dtype=np.int64))
    it = "long" if indices.dtype == np.int64 else "int"
    name = f"k_gather_{_word(x.dtype)}_{it}"
    args = [x.buffer, indices.buffer, y.buffer, np.int32(dim), np.int32(indices.size)]
    launch1d(d, "move", "uchar", name, _source, y.size, [*args, np.int32(inner)])
    return y
