"""A 1x1 convolution between plain (NCHW) neighbours as oneDNN's matmul primitive.

With stride 1 and no padding, ``Y[n, g] = W[g] @ X[n, g]`` for each of the G groups (``W[g]``
is ``[M/G, C/G]``, ``X[n, g]`` is ``[C/G, H*W]``), plus bias per row, Z, activation: the weights
are the matmul's source (broadcast over the batch), the activations its ``weights`` argument,
every tensor in its own NCHW memory, so nothing is reordered. Z is a ``sum`` post-op; the
bias a ``binary_add`` post-op of a ``[1, M, 1]`` tensor (as the matmul's bias argument, that
shape sends oneDNN to its reference kernel, 500x slower), then the activation an ``eltwise``.
With groups (4-D) the bias post-op also takes the reference kernel, so the bias, and a Relu
after it, are added after, in one pass of generated C (``FusedElementwise``'s kernel); other
activations after a bias decline.

Measured at one thread (medians, the ``x64:gemm:jit`` convolution on NCHW against this
``brg:avx512_core`` matmul, us): 58->58 channels at 28x28 106 / 64, 24->58 at 56x56 1116 / 104,
64->256 at 56x56 5627 / 941, 256->64 at 56x56 2108 / 947, 1024->256 at 14x14 1039 / 1049;
ShuffleNet v1's four groups (CPU time): 24->112 at 56x56 2245 / 385, 136->136 at 28x28
737 / 150, 136->544 at 7x7 72 / 62. ShuffleNet's, SqueezeNet's and DenseNet's 1x1
convolutions write NCHW buffers for the Concat, Split and Reshape nodes that read them, so
this is their path.

Given two threads or more (``team``, the convolution left on one OpenMP thread) a batch-1
product from ``SPLIT_WORK`` multiply-adds is cut into parts of output channels (of whole
groups when grouped), one matmul each, on ``backends/cpu/native/pool.py``'s threads
(``_parallel``): in
NCHW a part's weights rows, bias and output rows are contiguous blocks, and its input the
whole ``X`` (or its groups' channels), so the parts share nothing they write.

Returns None (the convolution primitive runs instead) for strides or pads other than the
identity's, and anything oneDNN declines or runs with its reference kernel.
"""

from __future__ import annotations

import math
from collections import Counter
from itertools import pairwise
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_fused_elementwise import elementwise_call, evaluate_into
from anychip.backends.cpu.native import pool
from anychip.backends.cpu.onednn import _parallel
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, omp_threads
from anychip.backends.cpu.onednn._memo import Remembered
from anychip.backends.cpu.onednn._parallel import offset_buffers, run_all
from anychip.backends.cpu.replay import record as _replay

__all__ = ["run", "SPLIT_WORK", "RUNS"]

#: Multiply-adds from which a batch-1 product splits its output channels over the threads
#: given (as ``conv_split.ROW_SPLIT_WORK``).
SPLIT_WORK = 2_900_000
#: Products run split, by part count (tests read it).
RUNS: Counter[int] = Counter()


def run(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    y_shape: tuple[int, ...],
    window: tuple,
    out: np.ndarray | None,
    team: int = 1,
    memo: dict | None = None,
) -> np.ndarray | None:
    """``act(conv1x1(x, w) + b + z)`` for a C-contiguous or channels-last ``x`` (read in
    place: a strided operand costs brgemm 5-15 us where a reorder into NCHW costs 40-65 at
    ShuffleNet's 136x28x28), into ``out`` when it fits; None where this path does not
    apply. ``memo``: the node's dict, where a one-primitive product without Z is remembered
    (``Fast``)."""
    strides, _, begin, end = window
    if any(s != 1 for s in strides) or any(begin) or any(end):
        return None
    n, c = x.shape[:2]
    m, cols, g = w.shape[0], math.prod(x.shape[2:]), c // w.shape[1]
    # oneDNN's matmul broadcasts a bias post-op per row only in 3-D (grouped: 4-D, where it
    # takes the reference kernel): with groups the bias, and the Relu after it, run in numpy.
    outside = b is not None and g > 1
    if outside and act is not None and act != (C.eltwise_relu, 0.0, 0.0):
        return None
    inner_act, inner_b = (None, None) if outside else (act, b)
    nhwc = not x.flags.c_contiguous  # the caller passes C-contiguous or channels-last
    spec = (n, c, m, cols, g, inner_b is not None, z is not None, inner_act, nhwc)
    split = n == 1 and team > 1 and m * c // g * cols >= SPLIT_WORK
    parts = _parts(spec, team) if split else None
    try:
        if parts is None:
            key = ("conv1x1", *spec, omp_threads())
            prim = P.cached(key, lambda: _build(*spec))
    except P.Unsupported:
        return None
    y = out if fits(out, y_shape, np.dtype(np.float32)) else _replay.empty(y_shape)
    if z is not None:
        _replay.copy(y, z)
    wc = np.ascontiguousarray(w)
    bc = None if inner_b is None else np.ascontiguousarray(inner_b)
    if parts is not None:
        _run_parts(parts, x, wc, bc, y, z is not None, team)
        if _replay.ACTIVE:
            _replay.note(_run_parts, (parts, x, wc, bc, y, z is not None, team))
    else:
        bufs = {C.arg_src: wc, C.arg_weights: x, C.arg_dst: y}
        if bc is not None:
            bufs[C.arg_post_op_src1(int(z is not None))] = bc
        prim.run(bufs)
    post = None
    if outside:
        # one pass of generated C, in place (numpy's add then maximum: the same values, 101
        # against 29 us at ShuffleNet's 136x28x28)
        rows = y.reshape(n, m, cols)
        expr = "add(in0,in1)" if act is None else "max(add(in0,in1),0.0)"
        post = expr, b.reshape(m, 1), (n, m, cols)
        if evaluate_into((rows, post[1]), expr, rows)[1] and _replay.ACTIVE:
            _replay.seal()  # Z's copy, the product and the bias pass in C: all noted
    elif _replay.ACTIVE:
        _replay.seal()  # Z's copy and the product: all noted
    if memo is not None and not split and z is None:
        memo["fast"] = Fast(prim, x, w, b, bufs, y_shape, team, post)
    return y


class Fast(Remembered):
    """A node's 1x1 product on one primitive without Z, remembered with what it depends on
    (``_memo.Remembered``, as ``conv._Fast``): the next such call runs the primitive and the
    bias pass with nothing looked up. The weights are read in place (nothing prepared), so
    an array rewritten in place is read as it is."""

    __slots__ = ("prim", "args", "y_shape", "post", "direct", "x_cl")

    def __init__(
        self, prim: P.Prim, x: np.ndarray, w: np.ndarray, b: Any, bufs: dict, y_shape: tuple,
        team: int, post: tuple | None,
    ) -> None:  # fmt: skip
        super().__init__(x, w, b, None, False, team)
        self.prim, self.y_shape = prim, y_shape
        self.args = {k: P.pin(v) for k, v in bufs.items() if k not in (C.arg_weights, C.arg_dst)}
        # One direct C call (``_parallel.bound``): the kept arguments, then the source (the
        # matmul's weights argument: NCHW or channels-last, dense) and the destination.
        self.x_cl = x.ndim == 4 and P.from_channels_last_ok(x)
        dense = self.x_cl or x.flags.c_contiguous
        keys = (*self.args, C.arg_weights, C.arg_dst)
        kept = tuple(self.args.values())
        self.direct = _parallel.bound(prim, keys, kept) if dense else None
        self.post = None
        if post is not None:  # the generated bias pass, looked up once
            expr, bias, rows = post
            call = elementwise_call(expr, np.dtype(np.float32), (rows, bias.shape))
            self.post = (bias, rows, call, expr)

    def run(self, x: np.ndarray, w: np.ndarray, z: Any, out: np.ndarray | None) -> np.ndarray:
        y_shape = self.y_shape
        y = out if fits(out, y_shape, np.dtype(np.float32)) else _replay.empty(y_shape)
        direct = self.direct
        sealed = direct is not None and y.flags.c_contiguous
        if sealed:
            fb = direct.fb
            direct(fb(x.transpose(0, 2, 3, 1)) if self.x_cl else fb(x), fb(y))
        else:
            bufs = dict(self.args)
            bufs[C.arg_weights], bufs[C.arg_dst] = x, y
            self.prim.run(bufs)
        if self.post is not None:
            bias, rows, call, expr = self.post
            view = y.reshape(rows)
            if call is None:
                sealed = False
                evaluate_into((view, bias), expr, view)
            else:
                call([view, bias], view)  # generated C, noted (``codegen.CFunction``)
        if sealed and _replay.ACTIVE:  # the product's one call and the bias pass's
            _replay.seal()
        return y


def _build(
    n: int,
    c: int,
    m: int,
    cols: int,
    g: int,
    bias: bool,
    sum_z: bool,
    act: tuple | None,
    nhwc: bool = False,
    ld: int = 0,
) -> P.Prim:
    """The product of ``m`` output channels over ``c`` input channels in ``g`` groups; ``ld``:
    the source's channel count where this is a part of it (the channels-last stride)."""
    L = P.lib()
    ld = ld or c
    if g == 1:
        src, wei, dst = P.md((1, m, c), C.abc), P.md((n, c, cols), C.abc), P.md((n, m, cols), C.abc)
        if nhwc:  # X[n] is [C, H*W] with strides (1, C): brgemm reads it transposed
            wei = P.md_strided((n, c, cols), (ld * cols, 1, ld))
    else:
        src = P.md((1, g, m // g, c // g), C.abcd)
        wei = P.md((n, g, c // g, cols), C.abcd)
        if nhwc:
            wei = P.md_strided((n, g, c // g, cols), (ld * cols, c // g, 1, ld))
        dst = P.md((n, g, m // g, cols), C.abcd)
    bias_md: Any = P.md((1, m, 1), C.abc) if bias else None
    attr = P.post_ops(sum_z, act, bias_md)
    pd = P.make_pd(
        L.dnnl.dnnl_matmul_primitive_desc_create, L.engine, src, wei, L.ffi.NULL, dst, attr
    )
    if not P.impl_info(pd).startswith("brg"):
        raise P.Unsupported("oneDNN's reference matmul: the convolution primitive is faster")
    args = {C.arg_src: src, C.arg_weights: wei, C.arg_dst: dst}
    if bias:
        args[C.arg_post_op_src1(int(sum_z))] = bias_md
    return P.Prim(pd, args)


def _parts(spec: tuple, team: int) -> _Parts | None:
    """The split's plan for ``spec`` on ``team`` threads (one lookup a call), or None where
    it does not apply (too few channels, the pool backing off, oneDNN declining a part)."""
    m, g, nhwc = spec[2], spec[4], spec[8]
    if g > 1 and nhwc:  # parts of strided groups ran 1.5-6x the whole (ShuffleNet's shapes)
        return None
    if g == 1 and min(team, m // 16) < 2:
        return None
    if not pool.try_parallel():
        return None
    try:
        return P.cached(("conv1x1-parts", *spec, team), lambda: _Parts(spec, team))
    except P.Unsupported:
        return None


class _Parts:
    """A split's matmuls, one per block of output channels (whole groups when grouped, else
    multiples of 16), and each part's byte offsets into the whole arrays by argument (4
    bytes a float): the same on every call, so worked out once."""

    __slots__ = ("prims", "offsets")

    def __init__(self, spec: tuple, team: int) -> None:
        _, c, m, cols, g, bias, sum_z, act, nhwc = spec
        if g > 1:
            count = min(team, g)
            cuts = [g * k // count for k in range(count + 1)]
            mg, cg = m // g, c // g
            bounds = [
                (a * mg, a * cg, (e - a) * mg, (e - a) * cg, e - a) for a, e in pairwise(cuts)
            ]
        else:
            count = min(team, m // 16)
            cuts = [m * k // count // 16 * 16 for k in range(count)] + [m]
            bounds = [(a, 0, e - a, c, 1) for a, e in pairwise(cuts)]
        x_step = 4 if nhwc else 4 * cols  # a channel's step in X: a float in channels-last
        self.prims: list[P.Prim] = []
        self.offsets: list[dict[int, int]] = []
        for m0, c0, mp, cp, gp in bounds:
            key = ("conv1x1-part", *spec, m0, mp)
            args = (1, cp, mp, cols, gp, bias, sum_z, act, nhwc, c)
            self.prims.append(P.cached(key, lambda args=args: _build(*args)))
            offsets = {C.arg_src: 4 * m0 * (c // g), C.arg_weights: x_step * c0}
            offsets[C.arg_dst] = 4 * m0 * cols
            if bias:
                offsets[C.arg_post_op_src1(int(sum_z))] = 4 * m0
            self.offsets.append(offsets)


def _run_parts(
    parts: _Parts,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    y: np.ndarray,
    z: bool,
    team: int,
) -> None:
    """Each part on its block: its offsets from the whole arrays' addresses."""
    bases = {C.arg_src: P.ptr(w), C.arg_weights: P.ptr(x), C.arg_dst: P.ptr(y)}
    if b is not None:
        bases[C.arg_post_op_src1(int(z))] = P.ptr(b)
    run_all(parts.prims, offset_buffers(bases, parts.offsets), team)
    RUNS[len(parts.prims)] += 1
