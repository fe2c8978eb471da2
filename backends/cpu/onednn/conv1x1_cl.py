"""A 1x1 convolution from an NCHW source to a channels-last destination as one oneDNN matmul:
``Y[n] = X[n]^T @ W^T``, ``X[n]`` the source's ``[C, H*W]`` read transposed in place (strides
``(1, H*W)``: brgemm copies its blocks), ``W^T`` the weights ``[C, M]`` packed once for the
primitive (format ``any``), ``Y[n]`` the ``[H*W, M]`` rows of the channels-last buffer; bias (per
column, the matmul's own bias argument) and activation as post-ops.

DenseNet's 1x1 convolutions read the block's NCHW buffer (its BatchNormalization and Relu run
in numpy) and write channels-last for the 3x3 convolution after them; ShuffleNet-like's read a
Split of NCHW. oneDNN's convolution primitive on such a source reorders it or takes a slower
kernel. One process, back-to-back calls, us, that convolution / this matmul, two threads:
128 -> 128 at 56x56 810 / 596, 256 -> 128 at 56x56 1398 / 1118, 512 -> 256 at 28x28 1234 /
1079, 1024 -> 512 at 14x14 2028 / 1057 (the convolution did not use its second thread),
58 -> 58 at 28x28 146 / 94; one thread: 1255 / 1030, 2582 / 2026, 2023 / 1901, 2029 / 1888,
94 / 69. Equal results (the same sums, in the same order per output: 0.0 difference at these
shapes, 1.5e-5 at 1024 channels).

Not for: a residual Z (the convolution's ``sum`` post-op path keeps it), groups, strides or
pads, another dtype, a source that is not C-contiguous, and whatever oneDNN runs with its
reference kernel (``conv.py`` then builds the convolution as before).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, omp_threads
from anychip.backends.cpu.onednn._memo import Remembered
from anychip.backends.cpu.onednn._parallel import offset_buffers, run_kept
from anychip.backends.cpu.replay import record as _replay

__all__ = ["applies", "run", "Fast", "RUNS"]

#: Calls run here (tests read it).
RUNS = [0]
#: Multiply-adds from which a batch-1 product left on one OpenMP thread, with two threads or
#: more given, runs in blocks of output channels on the pool (``conv_split.ROW_SPLIT_WORK``'s
#: figure).
SPLIT_WORK = 2_900_000
#: Fewest output channels per part.
MIN_CHANNELS = 16


def applies(x: np.ndarray, w: np.ndarray, z: Any, group: int, window: tuple) -> bool:
    """Whether ``run`` takes this convolution (module docstring)."""
    strides, _, begin, end = window
    return (
        z is None
        and group == 1
        and x.ndim == 4
        and w.ndim == 4
        and w.shape[2:] == (1, 1)
        and x.dtype == np.float32
        and w.dtype == np.float32
        and x.flags.c_contiguous
        and all(s == 1 for s in strides)
        and not any(begin)
        and not any(end)
    )


class _Plan:
    """The matmul for one shape, bias and activation, and its weights' layout."""

    __slots__ = ("prim", "w_md", "key", "m", "scratch")

    def __init__(
        self, n: int, c: int, m: int, cols: int, bias: bool, act: Any, ldd: int = 0
    ) -> None:
        L = P.lib()
        src = P.md_strided((n, cols, c), (c * cols, 1, cols))
        wei = P.md((1, c, m), C.any)
        # a part of the output channels (``_Parts``) writes every ``ldd``-th float's block
        dst = P.md_strided((n, cols, m), (cols * ldd, ldd, 1)) if ldd else P.md((n, cols, m), C.abc)
        bias_md = P.md((1, 1, m), C.abc) if bias else L.ffi.NULL
        attr = P.post_ops(False, act)
        if ldd:  # a part runs on a pool thread: its own scratchpad
            attr = P.user_scratchpad(attr)
        pd = P.make_pd(
            L.dnnl.dnnl_matmul_primitive_desc_create, L.engine, src, wei, bias_md, dst, attr
        )
        if P.impl_info(pd).startswith("ref"):
            raise P.Unsupported("oneDNN's reference matmul: the convolution primitive is faster")
        self.w_md = P.query_md(pd, C.query_weights_md)
        args = {C.arg_src: src, C.arg_weights: self.w_md, C.arg_dst: dst}
        if bias:
            args[C.arg_bias] = bias_md
        self.scratch = P.scratchpad_arg(pd, args) if ldd else None
        self.prim = P.Prim(pd, args)
        # ``ldd`` in it: a part's weights layout (gemm:jit's) is not the whole product's
        # (brgemm's), and the weights' reorder is cached by this key (sharing it wrote one
        # layout's bytes into the other's smaller buffer: heap corruption, in the bench)
        self.key = ("conv1x1-cl", n, c, m, cols, bias, act, omp_threads(), ldd)
        self.m = m

    def packed(self, w: np.ndarray, lo: int = 0) -> np.ndarray:
        """Output channels ``lo`` on of ``w`` as the ``[C, M]`` transpose in the primitive's
        layout (once per weight array)."""
        c, m = w.shape[1], self.m

        def prepare() -> np.ndarray:
            buf = P.empty_for(self.w_md)
            wt = np.ascontiguousarray(w.reshape(w.shape[0], c)[lo : lo + m].T)
            P.reorder_into((self.key, "w", lo), wt, P.md((1, c, m), C.abc), buf, self.w_md)
            return buf

        return P.weights((self.key, "w", lo), (w,), prepare)

    def run(self, x: np.ndarray, wk: np.ndarray, b: Any) -> np.ndarray:
        """The product into a new channels-last buffer (``b``: the pinned bias or None)."""
        n, c, h, wd = x.shape
        ycl = _replay.empty((n, h, wd, self.m))  # np.empty, or a recorder's
        src = x.reshape(n, c, h * wd).transpose(0, 2, 1)
        bufs = {C.arg_src: src, C.arg_weights: wk, C.arg_dst: ycl}
        if b is not None:
            bufs[C.arg_bias] = b
        self.prim.run(bufs)  # noted there
        RUNS[0] += 1
        return P.from_channels_last(ycl)


class _Parts:
    """The product cut into blocks of output channels, one primitive each on the pool's
    threads (``_parallel.run_kept``): every part reads the whole transposed source and writes
    its columns of the channels-last rows (a strided destination, ``ldd`` = all the channels:
    oneDNN's ``gemm:jit`` there, brgemm declining it); its own packed weights, bias slice and
    scratchpad. Two parts against the whole product on one thread, us: 64 -> 128 at 56x56
    534 / 335, 128 -> 128 at 28x28 286 / 141, 512 -> 128 at 14x14 249 / 151, 1024 -> 128 at
    7x7 129 / 75."""

    __slots__ = ("plans", "prims", "bounds", "offsets", "m", "team")

    def __init__(self, c: int, m: int, cols: int, bias: bool, act: Any, parts: int) -> None:
        self.bounds = [m * k // parts for k in range(parts + 1)]
        self.plans = [
            _Plan(1, c, hi - lo, cols, bias, act, ldd=m) for lo, hi in pairwise(self.bounds)
        ]
        self.prims = [p.prim for p in self.plans]
        self.m, self.team = m, parts
        # each part's byte offsets from the whole arrays (``_parallel.offset_buffers``); its
        # scratchpad's address from 0
        self.offsets = []
        for plan, lo in zip(self.plans, self.bounds):
            off = {C.arg_src: 0, C.arg_dst: 4 * lo, C.arg_scratchpad: P.ptr(plan.scratch)}
            if bias:
                off[C.arg_bias] = 4 * lo
            self.offsets.append(off)

    def packed(self, w: np.ndarray) -> list[np.ndarray]:
        return [p.packed(w, lo) for p, lo in zip(self.plans, self.bounds)]

    def run(self, x: np.ndarray, wk: list[np.ndarray], b: Any) -> np.ndarray:
        """The blocks at once (``b``: the bias array or None)."""
        n, c, h, wd = x.shape
        ycl = _replay.empty((n, h, wd, self.m))  # np.empty, or a recorder's
        bases = {C.arg_src: P.ptr(x), C.arg_dst: P.ptr(ycl), C.arg_scratchpad: 0}
        if b is not None:
            bases[C.arg_bias] = P.ptr(b)
        buffers = offset_buffers(bases, self.offsets)
        for bufs, packed in zip(buffers, wk):
            bufs[C.arg_weights] = P.ptr(packed)
        run_kept(self.prims, buffers, self.team, x, ycl, wk, b, self)  # noted, self's scratch kept
        RUNS[0] += 1
        return P.from_channels_last(ycl)


def run(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    act: Any,
    team: int,
    memo: dict | None,
) -> np.ndarray | None:
    """``act(conv1x1(x, w) + b)`` channels-last (the NCHW view of an NHWC buffer) for an ``x``
    that ``applies``; None where oneDNN declines (the caller builds the convolution)."""
    n, c, h, wd = x.shape
    m = w.shape[0]
    bias = b is not None
    key = ("conv1x1-cl", n, c, m, h * wd, bias, act, omp_threads())
    split = n == 1 and team > 1 and omp_threads() == 1 and c * m * h * wd >= SPLIT_WORK
    parts = min(team, m // MIN_CHANNELS) if split else 1
    banded = parts > 1 and pool.try_parallel()  # while the pool backs off: whole, not kept
    try:
        if banded:
            plan: Any = P.cached(key + (parts,), lambda: _Parts(c, m, h * wd, bias, act, parts))
        else:
            plan = P.cached(key, lambda: _Plan(n, c, m, h * wd, bias, act))
    except P.Unsupported:
        return None
    bc = None if b is None else np.ascontiguousarray(b, np.float32).reshape(1, 1, m)
    if isinstance(plan, _Plan):
        bc = None if bc is None else P.pin(bc)
    y = plan.run(x, plan.packed(w), bc)
    if _replay.ACTIVE:
        _replay.seal()  # the matmul's one call: all it did
    if memo is not None and banded == (parts > 1):
        memo["fast"] = Fast(plan, x, w, b, bc, team)
    return y


class Fast(Remembered):
    """A node's channels-last 1x1 product remembered (``_memo.Remembered``): the next such call
    runs the primitive with nothing looked up (its packed weights prepared again only when
    sampled values of the array changed)."""

    __slots__ = ("plan", "bias")

    def __init__(
        self, plan: _Plan | _Parts, x: np.ndarray, w: np.ndarray, b: Any, bc: Any, team: int
    ) -> None:
        super().__init__(x, w, b, None, True, team)
        self.plan, self.bias = plan, bc

    def run(self, x: np.ndarray, w: np.ndarray, z: Any, out: Any = None) -> np.ndarray | None:
        plan = self.plan
        if isinstance(plan, _Parts) and not pool.try_parallel():
            return None  # the pool backs off: the full path runs it whole
        y = plan.run(x, self.prepared(w, lambda: plan.packed(w)), self.bias)
        if _replay.ACTIVE:
            _replay.seal()
        return y
