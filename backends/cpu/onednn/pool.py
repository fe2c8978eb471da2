"""MaxPool, AveragePool, GlobalAveragePool and GlobalMaxPool through oneDNN's pooling primitive.

The source is described as it lies in memory (plain or channels-last, so a convolution's
channels-last output is read in place); the output has the source's layout, made
C-contiguous afterwards when a numpy kernel reads it (``kernels.py``).

Falls back to the numpy kernels (``kernels/op_pool.py``) for: dtypes other than float32,
ranks other than 3-5, MaxPool's Indices output, AveragePool with count_include_pad=1 where
ceil_mode adds trailing positions (ONNX does not count those, oneDNN would), empty tensors,
and anything oneDNN declines.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native import copies
from anychip.backends.cpu.onednn import _parallel
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads
from anychip.backends.cpu.replay import record as _replay
from anychip.ir.window import window_geometry

__all__ = ["pool"]


def pool(
    x: np.ndarray,
    alg: int,
    kernel_shape: list[int] | None,
    attrs: dict[str, Any],
    op: str,
    channels_last: bool = False,
    planned: np.ndarray | None = None,
    memo: dict | None = None,
) -> np.ndarray | None:
    """The pooled ``x`` (``kernel_shape`` None: global pooling), or None when oneDNN cannot.

    The output is channels-last (as an NCHW view) when ``channels_last``, else C-contiguous
    (in ``planned`` when it fits and the source is plain). ``memo``: a dict kept per node
    (its attributes do not change), where the primitive and the output's shape are found
    again for the same source shape, strides and team without working the window out.
    """
    if get() is None or x.dtype != np.float32 or not 3 <= x.ndim <= 5 or 0 in x.shape:
        return None
    key = (x.shape, x.strides, omp_threads())
    found = memo.get(key) if memo is not None else None
    if found is None:
        found = _prepare(x, alg, kernel_shape, attrs, op)
        if found is None:
            return None
        if memo is not None:
            memo[key] = found
    prim, y_shape, src_cl, contiguous, direct = found
    if contiguous:
        x = np.ascontiguousarray(x)
    if src_cl:
        out = _replay.empty(P.channels_last(y_shape))  # np.empty, or a recorder's
        y = P.from_channels_last(out)
    elif fits(planned, y_shape, np.dtype(np.float32)):
        out = y = planned
    else:
        out = y = _replay.empty(y_shape)
    # The source as its dense buffer: NHWC behind the NCHW view, or the array itself.
    xs = x.transpose((0, *range(2, x.ndim), 1)) if src_cl else x
    if direct is not None and xs.flags.c_contiguous and out.flags.c_contiguous:
        direct(direct.fb(xs), direct.fb(out))  # one C call (``_parallel.Bound``)
        if _replay.ACTIVE and not contiguous:
            _replay.seal()  # that call, and _c_order's copy, noted: all it did
    else:
        prim.run({C.arg_src: x, C.arg_dst: out})
    return _c_order(y, planned) if src_cl and not channels_last else y


def _prepare(
    x: np.ndarray, alg: int, kernel_shape: list[int] | None, attrs: dict[str, Any], op: str
) -> tuple[P.Prim, tuple[int, ...], bool, bool, tuple | None] | None:
    """``(primitive, output shape, source channels-last, source to make C-contiguous, the
    one direct call or None)`` for ``x``'s shape and strides, or None when oneDNN cannot."""
    g = _geometry(x.shape[2:], kernel_shape, attrs, op)
    if alg == C.pooling_avg_include_padding and any(g.extra_end):
        return None
    if 0 in g.out:
        return None
    tags = P.layouts(x)
    contiguous = not tags
    if contiguous:
        tags = P.layouts(np.ascontiguousarray(x))
    tag = tags[-1]  # channels-last when it is both (C or spatial of size 1)
    # The JIT kernels want the output in the source's layout (mixed layouts run oneDNN's
    # reference kernel, 70x slower).
    src_cl = tag != P.plain_tag(x.ndim)
    y_shape = x.shape[:2] + tuple(g.out)
    right = [e + s for e, s in zip(g.end, g.extra_end)]
    key = (
        "pool",
        alg,
        x.shape,
        tag,
        tuple(g.kernel),
        tuple(g.strides),
        tuple(g.dilations),
        tuple(g.begin),
        tuple(right),
        omp_threads(),
    )
    try:
        prim = P.cached(key, lambda: _build(x.shape, y_shape, tag, alg, g, right))
    except P.Unsupported:
        return None
    return prim, y_shape, src_cl, contiguous, _parallel.bound(prim, (C.arg_src, C.arg_dst))


def _c_order(y: np.ndarray, planned: np.ndarray | None) -> np.ndarray:
    """``y`` in C order for a numpy reader, in the planned buffer (a Concat's slice) when it
    fits: a 4-D one through the generated tile transpose (``cpu/native/copies.to_planar``; 2x
    numpy's strided copy at 64x56x56: 86 against 158 us, 1 thread), else numpy's copy."""
    out = planned if fits(planned, y.shape, np.dtype(np.float32)) else None
    if y.ndim == 4:
        target = out if out is not None else _replay.empty(y.shape)
        if copies.to_planar(y, target):  # noted there
            return target
    target = out if out is not None else _replay.empty(y.shape)
    _replay.copy(target, y)
    return target


def _geometry(
    spatial: tuple[int, ...], kernel_shape: list[int] | None, attrs: dict[str, Any], op: str
) -> Any:
    """The pooling window's geometry from the ONNX attributes (global: the whole input)."""
    return window_geometry(
        spatial,
        list(spatial if kernel_shape is None else kernel_shape),
        strides=attrs.get("strides"),
        dilations=attrs.get("dilations"),
        pads=attrs.get("pads"),
        auto_pad=attrs.get("auto_pad") or "NOTSET",
        ceil_mode=int(attrs.get("ceil_mode") or 0),
        op=op,
    )


def _build(
    x_shape: tuple[int, ...],
    y_shape: tuple[int, ...],
    tag: int,
    alg: int,
    g: Any,
    right: list[int],
) -> P.Prim:
    L = P.lib()
    src = P.md(x_shape, tag)
    dst = P.md(y_shape, tag)
    pd = P.make_pd(
        L.dnnl.dnnl_pooling_forward_primitive_desc_create,
        L.engine,
        C.forward_inference,
        alg,
        src,
        dst,
        P.dims(g.strides),
        P.dims(g.kernel),
        P.dims([d - 1 for d in g.dilations]),
        P.dims(g.begin),
        P.dims(right),
        L.ffi.NULL,
    )
    return P.Prim(pd, {C.arg_src: src, C.arg_dst: dst})
