"""Conv and com.microsoft FusedConv through oneDNN's convolution primitive.

Activations stay channels-last: the primitive picks its layouts (format ``any``; on AVX2 that
is NHWC activations and blocked weights), and its output is returned as the logical NCHW view
of a channels-last buffer, so the next oneDNN op reads it without a reorder (numpy's
elementwise ops keep that layout too). Inputs in another layout are reordered on entry.
FusedConv's bias, residual input Z (a ``sum`` post-op) and activation (an ``eltwise`` post-op)
run inside the primitive. Depthwise convolutions on a channels-last source go to the C kernel
of ``backends/cpu/native/dwconv.py`` first, where it measured faster.

Falls back to the numpy kernel (``kernels/op_conv.py``) for: dtypes other than float32,
1-D to 3-D convolutions only (rank 3-5), an empty batch or output, a Z whose shape is not the
output's, activations oneDNN has no eltwise for, and any attribute set oneDNN declines.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native import copies, dwconv
from anychip.backends.cpu.onednn import _parallel, conv1x1, conv1x1_cl, conv_split
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads
from anychip.backends.cpu.onednn._memo import Remembered
from anychip.backends.cpu.replay import record as _replay
from anychip.ir.window import window_geometry

__all__ = ["conv", "eltwise"]

_ACTS = {
    "Relu": C.eltwise_relu,
    "LeakyRelu": C.eltwise_relu,
    "Tanh": C.eltwise_tanh,
    "Sigmoid": C.eltwise_logistic,
    "Clip": C.eltwise_clip,
    "HardSigmoid": C.eltwise_hardsigmoid,
}


def eltwise(name: str | None, params: list[float] | None) -> tuple[int, float, float] | None:
    """oneDNN's (alg, alpha, beta) for a FusedConv activation (ONNX defaults filled in), or
    None when oneDNN has no matching eltwise."""
    p = list(params or []) + [None, None]
    if name not in _ACTS:
        return None
    if name == "LeakyRelu":
        return _ACTS[name], 0.01 if p[0] is None else float(p[0]), 0.0
    if name == "Clip":
        lo = -np.inf if p[0] is None else float(p[0])
        hi = np.inf if p[1] is None else float(p[1])
        return _ACTS[name], lo, hi
    if name == "HardSigmoid":
        return (
            _ACTS[name],
            0.2 if p[0] is None else float(p[0]),
            0.5 if p[1] is None else float(p[1]),
        )
    return _ACTS[name], 0.0, 0.0


def conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    attrs: dict[str, Any],
    channels_last: bool = False,
    out: np.ndarray | None = None,
    team: int = 1,
    memo: dict | None = None,
) -> np.ndarray | None:
    """Y = act(conv(x, w) + b + z) through oneDNN, or None when oneDNN cannot run it.
    ``team``: the OpenMP threads given; a convolution left on one thread (``team_for``) may
    run in bands of rows on that many (``conv_split.py``). ``memo``: the node's own dict,
    where the simple path is remembered for its next calls (``_Fast``).

    ``channels_last``: return the NCHW view of a channels-last buffer (for a oneDNN reader),
    else a C-contiguous array (for numpy readers, whose planned outputs are C-contiguous),
    written into the planned ``out`` when it fits.
    """
    fast = memo.get("fast") if memo is not None else None
    if fast is not None and fast.serves(x, w, b, z, channels_last, team):
        y = fast.run(x, w, z, out)
        if y is not None:  # None: a split while the pool backs off
            return y
    geo = _accepted(x, w, b, z, attrs)
    if geo is None:
        return None
    y_shape, group, kshape, window = geo
    if group > 1 and dwconv.applies(x, w, group):  # depthwise, channels-last: C (dwconv.py)
        y = dwconv.depthwise(x, w, b, z, act, geo, channels_last, out, team)
        if y is not None:
            if memo is not None:
                memo["fast"] = _Depthwise(x, w, b, z, act, geo, channels_last, team)
            return y
    x_tags = P.layouts(x)
    if not x_tags:
        x = _replay.contiguous(x)
        x_tags = P.layouts(x)
    if channels_last and conv1x1_cl.applies(x, w, z, group, window):  # NCHW in, NHWC out
        y = conv1x1_cl.run(x, w, b, act, team, memo)
        if y is not None:
            return y
    # A 1x1 convolution between plain (NCHW) neighbours is a matrix product on NCHW itself:
    # W[M, C] @ X[n][C, HW] through oneDNN's matmul (brgemm), else its convolution's GEMM
    # path (x64:gemm:jit); reorders on both sides cost more there (conv1x1.py).
    plain_io = (
        not channels_last and x_tags[0] == P.plain_tag(x.ndim) and all(k == 1 for k in kshape)
    )
    threads = omp_threads()
    split_team = team if threads == 1 else 1  # a primitive left on one thread may split
    if plain_io or not channels_last and x.ndim == 4 and all(k == 1 for k in kshape):
        y = conv1x1.run(x, w, b, z, act, y_shape, window, out, split_team, memo)  # NCHW/NHWC x
        if y is not None:
            return y
    splits = conv_split.will_split(y_shape, w, split_team)  # False at a split_team of 1
    if splits:
        y = _split(x, x_tags[0], w, b, z, act, geo, split_team, memo if channels_last else None)
        if y is not None:
            return y if channels_last else _to_plain(y, y_shape, out)
    key = ("conv", x.shape, x_tags[0], w.shape, b is not None, z is not None, act, window,
           group, plain_io, threads)  # fmt: skip
    try:
        prim = P.cached(
            key, lambda: _build(x.shape, w.shape, y_shape, group, window, b, z, act, plain_io)
        )
    except P.Unsupported:
        return None
    y = _run(prim, key, x, x_tags, w, b, z, y_shape, channels_last, out)
    if memo is not None and not splits and _Fast.applies(prim, x, x_tags, channels_last):
        memo["fast"] = _Fast(prim, key, x, w, b, z, team)
    return y


def _split(
    x: np.ndarray,
    tag: int,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    geo: tuple,
    team: int,
    memo: dict | None = None,
) -> np.ndarray | None:
    """``conv_split.split_conv`` on a channels-last ``x`` (remembered in ``memo``); a batch-1
    NCHW ``x`` of at most ``conv_split.FEW_CHANNELS`` channels (a model's first convolution,
    on the image) is reordered to channels-last for it first: that copy is small (3x224x224:
    40 us), and oneDNN's kernel for an NCHW source writes a blocked destination, reordered
    after, on one thread (SqueezeNet's first convolution 412 us plus 90)."""
    if P.from_channels_last_ok(x):
        return conv_split.split_conv(x, w, b, z, act, geo, team, memo)
    few = x.ndim == 4 and x.shape[1] <= conv_split.FEW_CHANNELS
    if not few or tag != P.plain_tag(4):
        return None
    xcl = np.empty(P.channels_last(x.shape), np.float32)
    nhwc = P.channels_last_tag(4)
    P.reorder_tags((("conv-nchw", x.shape), "src"), x.shape, x, tag, xcl, nhwc)
    return conv_split.split_conv(P.from_channels_last(xcl), w, b, z, act, geo, team)


def _to_plain(y: np.ndarray, y_shape: tuple[int, ...], out: np.ndarray | None) -> np.ndarray:
    """The split's channels-last ``y`` in NCHW, in the planned ``out`` when it fits (a numpy
    reader, or a Concat's slice): one reorder, as the whole primitive's own output takes."""
    res = out if fits(out, y_shape, np.dtype(np.float32)) else np.empty(y_shape, np.float32)
    if copies.to_planar(y, res):  # a tile transpose in C, on the pool
        P.REORDERS["dst"] += 1  # counted as oneDNN's reorder is
        return res
    nhwc, plain = P.channels_last_tag(4), P.plain_tag(4)
    P.reorder_tags((("conv-rows", y_shape), "dst"), y_shape, y, nhwc, res, plain)
    return res


def _accepted(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    attrs: dict[str, Any],
) -> tuple | None:
    """The convolution's geometry (``_geometry``) when oneDNN can run it, else None: float32
    1-D to 3-D convolutions, a 1-D bias of the output channels, a Z of the output's shape."""
    if get() is None or x.dtype != np.float32 or w.dtype != np.float32:
        return None
    if not 3 <= x.ndim <= 5 or w.ndim != x.ndim:
        return None
    if b is not None and (b.dtype != np.float32 or b.ndim != 1 or b.shape[0] != w.shape[0]):
        return None  # the numpy kernel words the error
    sig = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items())
    geo = _geometry(x.shape, w.shape, sig)
    if geo is None or z is not None and (z.shape != geo[0] or z.dtype != np.float32):
        return None
    return geo


@functools.lru_cache(maxsize=4096)
def _geometry(x_shape: tuple[int, ...], w_shape: tuple[int, ...], sig: tuple) -> tuple | None:
    """(output shape, group, kernel shape, (strides, dilations, pads before, pads after)) of a
    convolution, or None where the numpy kernel should run (and word any error). Memoized:
    the same node asks with the same arguments every run."""
    attrs = dict(sig)
    n, c = x_shape[:2]
    m, cg = w_shape[:2]
    group = int(attrs.get("group") or 1)
    if group < 1 or cg * group != c or m % group:
        return None
    kshape = list(attrs.get("kernel_shape") or w_shape[2:])
    if kshape != list(w_shape[2:]):
        return None
    g = window_geometry(
        x_shape[2:],
        kshape,
        strides=attrs.get("strides"),
        dilations=attrs.get("dilations"),
        pads=attrs.get("pads"),
        auto_pad=attrs.get("auto_pad") or "NOTSET",
        op="Conv",
    )
    if n == 0 or 0 in g.out or 0 in x_shape:
        return None
    window = (tuple(g.strides), tuple(g.dilations), tuple(g.begin), tuple(g.end))
    return (n, m) + tuple(g.out), group, tuple(kshape), window


class _Conv:
    """A cached convolution: the primitive plus what ``_run`` needs to feed it."""

    __slots__ = (
        "prim",
        "src_md",
        "w_md",
        "dst_md",
        "cl_md",
        "dst_cl",
        "dst_plain",
        "src_cl",
        "y_shape",
        "w_dims",
        "_users",
    )

    def __init__(
        self,
        prim: P.Prim,
        src_md: Any,
        w_md: Any,
        dst_md: Any,
        cl_md: Any,
        w_dims: tuple,
        y_shape: tuple[int, ...],
        src_shape: tuple[int, ...],
    ) -> None:
        self.prim = prim
        self.src_md = src_md
        self.w_md = w_md
        self.dst_md = dst_md
        self.cl_md = cl_md
        #: The primitive writes channels-last itself (else its output is reordered into it).
        self.dst_cl = P.md_equal(dst_md, cl_md)
        self.dst_plain = P.md_equal(dst_md, P.md(y_shape, P.plain_tag(len(y_shape))))
        #: The primitive reads a channels-last source (4-D).
        self.src_cl = len(y_shape) == 4 and P.md_equal(
            src_md, P.md(src_shape, P.channels_last_tag(4))
        )
        self.w_dims = w_dims
        self.y_shape = y_shape
        self._users: dict[tuple, Any] = {}

    def user_md(self, shape: tuple[int, ...], tag: int) -> Any:
        """The descriptor of a numpy array of ``shape`` in layout ``tag`` (made once)."""
        d = self._users.get((shape, tag))
        if d is None:
            d = self._users[(shape, tag)] = P.md(shape, tag)
        return d

    def direct_tag(self, shape: tuple[int, ...], tags: list[int]) -> int | None:
        """The first of ``tags`` that is the primitive's source layout (no reorder), or None."""
        for t in tags:
            if P.md_equal(self.user_md(shape, t), self.src_md):
                return t
        return None


def _build(
    x_shape: tuple[int, ...],
    w_shape: tuple[int, ...],
    y_shape: tuple[int, ...],
    group: int,
    window: tuple,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    plain_io: bool,
) -> _Conv:
    L = P.lib()
    ffi, dn = L.ffi, L.dnnl
    nd = len(x_shape)
    wdims = w_shape if group == 1 else (group, w_shape[0] // group) + tuple(w_shape[1:])
    strides, dilations, begin, end = window
    io = P.plain_tag(nd) if plain_io else C.any
    src_any, w_any, dst_any = P.md(x_shape, io), P.md(wdims, C.any), P.md(y_shape, io)
    bias_md = P.md((w_shape[0],), C.a) if b is not None else ffi.NULL
    attr = P.post_ops(z is not None, act)
    pd = P.make_pd(
        dn.dnnl_convolution_forward_primitive_desc_create,
        L.engine,
        C.forward_inference,
        C.convolution_direct,
        src_any,
        w_any,
        bias_md,
        dst_any,
        P.dims(strides),
        P.dims([d - 1 for d in dilations]),
        P.dims(begin),
        P.dims(end),
        attr,
    )
    src_md = P.query_md(pd, C.query_src_md)
    w_md = P.query_md(pd, C.query_weights_md)
    dst_md = P.query_md(pd, C.query_dst_md)
    cl_md = P.md(y_shape, P.channels_last_tag(nd))
    args = {C.arg_src: src_md, C.arg_weights: w_md, C.arg_dst: dst_md}
    if b is not None:
        args[C.arg_bias] = bias_md
    return _Conv(P.Prim(pd, args), src_md, w_md, dst_md, cl_md, wdims, y_shape, x_shape)


def _run(
    entry: _Conv,
    key: tuple,
    x: np.ndarray,
    x_tags: list[int],
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    y_shape: tuple[int, ...],
    channels_last: bool,
    planned: np.ndarray | None,
) -> np.ndarray:
    src = x
    tag = entry.direct_tag(x.shape, x_tags)
    if tag is None and entry.src_cl and x_tags[0] == P.plain_tag(4):
        xcl = copies.shuffle_channels_last(x, 1)  # NCHW -> NHWC in C, on the pool
        if xcl is not None:
            src = xcl.transpose(0, 2, 3, 1)
            tag = -1
            P.REORDERS["src"] += 1  # counted as oneDNN's reorder is
    if tag is None:  # reorder into the primitive's layout
        src = P.scratch_for(entry.src_md)
        user = entry.user_md(x.shape, x_tags[0])
        P.reorder_into((key, "src", x_tags[0]), x, user, src, entry.src_md)
    wk = P.weights(key, (w,), lambda: _prepare_weights(entry, key, w))
    if channels_last:
        out = _replay.empty(P.channels_last(y_shape))  # np.empty, or a recorder's
        y = P.from_channels_last(out)
    else:
        fit = fits(planned, y_shape, np.dtype(np.float32))
        out = y = planned if fit else _replay.empty(y_shape)
    direct = entry.dst_cl if channels_last else entry.dst_plain
    dst = out if direct else P.scratch_for(entry.dst_md)
    dst_cl = dst.reshape(P.channels_last(y_shape)) if entry.dst_cl and dst is not out else None
    if z is not None:
        if dst is out:
            _replay.copy(y, z)
        else:
            zc = z if P.layouts(z) else np.ascontiguousarray(z)
            ztag = P.layouts(zc)[0]
            P.reorder_into((key, "z", ztag), zc, entry.user_md(z.shape, ztag), dst, entry.dst_md)
    bufs = {C.arg_src: src, C.arg_weights: wk, C.arg_dst: dst}
    if b is not None:
        bufs[C.arg_bias] = np.ascontiguousarray(b)
    entry.prim.run(bufs)
    # Every step here is a noted call (reorders and the primitive through ``Prim.run``, the
    # copies in C): a replay runs them alone (backends/cpu/replay/record.py).
    _replay.seal()
    if dst is not out and entry.dst_cl and copies.to_planar(P.from_channels_last(dst_cl), out):
        P.REORDERS["dst"] += 1  # a tile transpose in C, on the pool; counted as a reorder
        return y
    if dst is not out:
        tag = P.layouts(y)[-1]  # part of the key: the same primitive may write either layout
        P.reorder_into((key, "dst", tag), dst, entry.dst_md, out, entry.user_md(y_shape, tag))
    return y


class _Fast(Remembered):
    """A node's convolution on the simple path (one primitive reading a channels-last source
    in place and writing a channels-last output, with or without Z, too small to split or on
    one thread: a split that backed off once must try again next call), remembered with what
    it depends on (``_memo.Remembered``): the next such call skips the geometry, the layout
    queries and the cache lookups (a tiny convolution at one thread: 24.6 -> 15.2 us a
    call). The prepared weights are kept with 65 sampled values of the array, as
    ``P.weights`` keeps them: an array rewritten in place is prepared again."""

    __slots__ = ("entry", "key", "bias", "y_cl", "direct", "x_cl")

    def __init__(
        self, entry: _Conv, key: tuple, x: np.ndarray, w: np.ndarray, b: Any, z: Any, team: int
    ) -> None:
        super().__init__(x, w, b, z, True, team)
        self.entry, self.key = entry, key
        self.bias = None if b is None else P.pin(np.ascontiguousarray(b))
        self.y_cl = P.channels_last(entry.y_shape)
        # The one C call that binds (src, weights, dst[, bias]) and executes, where the
        # source is a dense buffer (channels-last, or plain): serves() keeps its strides.
        self.x_cl = x.ndim == 4 and P.from_channels_last_ok(x)
        dense = self.x_cl or x.flags.c_contiguous
        keys = (C.arg_src, C.arg_weights, C.arg_dst) + ((C.arg_bias,) if b is not None else ())
        self.direct = _parallel.bound(entry.prim, keys) if dense else None

    @staticmethod
    def applies(entry: _Conv, x: np.ndarray, x_tags: list[int], cl: bool) -> bool:
        """Whether ``_run`` took the simple path for this call."""
        return cl and entry.dst_cl and entry.direct_tag(x.shape, x_tags) is not None

    def run(self, x: np.ndarray, w: np.ndarray, z: Any, out: Any = None) -> np.ndarray:
        entry, key = self.entry, self.key
        wp = self.prepared(  # the prepared weights' pointer (``P.pin`` holds the array)
            w, lambda: P.pin(P.weights(key, (w,), lambda: _prepare_weights(entry, key, w)))
        )
        ycl = _replay.empty(
            self.y_cl
        )  # np.empty, or the recorder's (backends/cpu/replay/record.py)
        y = P.from_channels_last(ycl)
        if z is not None:
            _replay.copy(y, z)  # the sum post-op adds into it (z's shape: _accepted's check)
        direct, bias = self.direct, self.bias
        if direct is not None:
            fb = direct.fb
            xp = fb(x.transpose(0, 2, 3, 1)) if self.x_cl else fb(x)
            if bias is None:
                direct(xp, wp, fb(ycl))
            else:
                direct(xp, wp, fb(ycl), bias)
            if _replay.ACTIVE:  # the copy of Z and the one call: all it did
                _replay.seal()
            return y
        bufs = {C.arg_src: x, C.arg_weights: wp, C.arg_dst: ycl}
        if bias is not None:
            bufs[C.arg_bias] = bias
        entry.prim.run(bufs)
        return y


class _Depthwise(Remembered):
    """A node's depthwise convolution on ``backends/cpu/native/dwconv.py``'s C kernel, remembered
    with
    what it depends on (``_memo.Remembered``): the next such call goes straight to the
    kernel, without the geometry and the checks of ``applies`` (ShuffleNet's and
    MobileNet's depthwise nodes run every call on this path)."""

    __slots__ = ("act", "geo")

    def __init__(
        self, x: np.ndarray, w: np.ndarray, b: Any, z: Any, act: Any, geo: tuple, cl: bool,
        team: int,
    ) -> None:  # fmt: skip
        super().__init__(x, w, b, z, cl, team)
        self.act, self.geo = act, geo

    def run(self, x: np.ndarray, w: np.ndarray, z: Any, out: Any = None) -> np.ndarray | None:
        if dwconv.switched_off():  # ANYCHIP_DWCONV=0 set since: the full path, oneDNN's
            return None
        return dwconv.depthwise(x, w, self.b, z, self.act, self.geo, self.cl, out, self.team)


def _prepare_weights(entry: _Conv, key: tuple, w: np.ndarray) -> np.ndarray:
    buf = P.empty_for(entry.w_md)
    user = P.md(entry.w_dims, P.plain_tag(len(entry.w_dims)))
    P.reorder_into((key, "w"), np.ascontiguousarray(w), user, buf, entry.w_md)
    return buf
