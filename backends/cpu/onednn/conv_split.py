"""A small 2-D convolution at batch 1 split by output rows: one oneDNN primitive per part,
run at once on ``backends/cpu/native/pool.py`` (``_parallel.run_all``).

Under ``_lib.SMALL_WORK`` a convolution runs on one OpenMP thread: waking oneDNN's passive
team costs 60-100 us a primitive on this VM, more than a second thread saves on a small one
(``bench/onednn_team.py --kind conv``: 7.2M multiply-adds 397 us on one thread, 487-563 on
the team of two). SqueezeNet's and ShuffleNet's convolutions are all that small, so at two
threads they ran on one. The pool's threads do not sleep between close calls, so here each
part is a convolution of its own over a band of output rows:

* in the channels-last layout (NHWC) a band of rows is one contiguous block, of the source
  (the rows the band's windows read) and of the destination alike, so a part is an ordinary
  dense convolution on pointers into the whole buffers, with no copy and no strided layout
  (a oneDNN convolution on a strided channel slice falls to its reference kernel);
* a part's padding is what its band lacks at the image's top or bottom edge, so each output
  row is the same sum over the same inputs as in the whole convolution;
* the residual ``Z`` (a ``sum`` post-op) is copied into the destination first, as in the
  unsplit path; bias and activation are post-ops of every part.

Each part keeps its own primitive, scratchpad and prepared weights (cached by the part's
bounds). Parts run one after another where the pool is off or backing off.
"""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C
from anychip.backends.cpu.onednn._memo import Remembered
from anychip.backends.cpu.onednn._parallel import offset_buffers, run_all, run_kept
from anychip.backends.cpu.replay import record as _replay

__all__ = [
    "Fast",
    "team_work",
    "WEIGHTY",
    "WEIGHTY_TEAM_WORK",
    "WEIGHTY_BYTES",
    "ROW_SPLIT_WORK",
    "TEAM_WORK",
    "MIN_PART_ROWS",
    "FEW_CHANNELS",
    "FINE_WORK",
    "PARTS_PER_THREAD",
    "RUNS",
    "split_conv",
    "will_split",
]

#: Convolutions run split, by part count (tests read it to see the split ran).
RUNS: Counter[int] = Counter()

#: Multiply-adds from which a one-thread convolution is split by rows when two or more
#: threads were given (2.9M). Two parts against one thread, pool held, medians of 200, us,
#: load average 0.1-0.7, after the parts' buffers were bound in C: 2.1M (1x1 at 13x13) 57 /
#: 55-57, 3.0M (1x1) 77-85 / 65-68, 4.5M 106 / 80, 11.9M 238 / 146, 26.9M (3x3) 480 / 274.
#: Before that (Python binding, 2 us a buffer) 3-5.5M gained nothing. ShuffleNet-like's 1x1
#: convolutions of 2.6M (58x58 at 28x28, 116x116 at 14x14, 232x232 at 7x7) read 1.04x split.
ROW_SPLIT_WORK = 2_900_000
#: Multiply-adds from which a batch-1 convolution runs on oneDNN's own team instead
#: (``_lib.SMALL_WORK``, the threshold of every other primitive).
TEAM_WORK = 1 << 25
#: Multiply-adds from which a batch-1 1x1 convolution whose weights hold at least
#: ``WEIGHTY`` times the bytes of its source runs on oneDNN's team rather than split by rows:
#: each band re-reads all the weights. Team / split at two threads, back-to-back calls, us:
#: 512 -> 1024 at 7x7 (25.7M) 281 / 369, 256 -> 512 at 14x14 (25.7M) 316 / 402; kept split:
#: 512 -> 128 at 14x14 (weights a third of the source) 206 / 147, a 3x3 48 -> 192 at 13x13
#: 215 / 146, 64 -> 256 at 13x13 269 / 273.
WEIGHTY_TEAM_WORK = 1 << 24
WEIGHTY = 2
#: The same from ``WEIGHTY_TEAM_WORK`` for a convolution of any window whose weights reach a
#: core's L2 cache (1 MiB here): each band would read them again from L3. Team / split, two
#: threads, pool held, medians of 8 x 40 calls, us: Inception-v2's 3x3 convolutions at 7x7
#: 192 -> 224 232 / 331, 192 -> 320 331 / 466, 224 -> 224 270 / 386, 256 -> 256 stride 2
#: 388 / 599, Inception-v1's 192 -> 384 at 6x6 323 / 484; kept split (weights under 1 MiB):
#: 96 -> 128 at 14x14 242 / 229, 64 -> 256 at 13x13 269 / 247.
WEIGHTY_BYTES = 1 << 20
#: Most channels of a batch-1 NCHW source reordered to channels-last to be split
#: (``conv.py``): a model's first convolution. With many channels (DenseNet's 1x1
#: convolutions after numpy's BatchNormalization) reorder and split measured 1.01-1.09 of
#: the whole primitive (which reorders too): 256 -> 128 at 28x28 632 / 692 us.
FEW_CHANNELS = 4
#: Fewest output rows per part.
MIN_PART_ROWS = 2
#: Multiply-adds from which a convolution is cut into ``PARTS_PER_THREAD`` parts a thread,
#: taken by whichever thread is free: a late or cache-cold thread then leaves the caller one
#: small part to wait for, not half the convolution.
FINE_WORK = 1 << 24
PARTS_PER_THREAD = 2


def _band(a: int, b: int, stride: int, span: int, pad: int, size: int) -> tuple[int, int, int, int]:
    """Input rows ``[lo, hi)`` that output rows ``[a, b)`` read, and the padding the band
    needs before and after them (``span``: the dilated kernel's height)."""
    first = a * stride - pad
    last = (b - 1) * stride - pad + span  # exclusive
    lo, hi = max(first, 0), min(last, size)
    return lo, hi, lo - first, last - hi


class _Part:
    __slots__ = ("prim", "w_md", "scratch", "scratch_ptr", "rows")

    def __init__(self, prim: P.Prim, w_md: Any, scratch: np.ndarray, rows: tuple) -> None:
        self.prim, self.w_md, self.scratch, self.rows = prim, w_md, scratch, rows
        self.scratch_ptr = P.ptr(scratch)


def _build(
    x_shape: tuple[int, ...],
    wdims: tuple[int, ...],
    y_shape: tuple[int, ...],
    window: tuple,
    bias: bool,
    sum_z: bool,
    act: Any,
    a: int,
    b: int,
) -> _Part:
    L = P.lib()
    ffi, dn = L.ffi, L.dnnl
    strides, dilations, begin, end = window
    span = (wdims[-2] - 1) * dilations[0] + 1
    lo, hi, before, after = _band(a, b, strides[0], span, begin[0], x_shape[2])
    nhwc = P.channels_last_tag(4)
    src = P.md((1, x_shape[1], hi - lo, x_shape[3]), nhwc)
    dst = P.md((1, y_shape[1], b - a, y_shape[3]), nhwc)
    bias_md = P.md((y_shape[1],), C.a) if bias else ffi.NULL
    attr = P.user_scratchpad(P.post_ops(sum_z, act))
    pd = P.make_pd(
        dn.dnnl_convolution_forward_primitive_desc_create,
        L.engine,
        C.forward_inference,
        C.convolution_direct,
        src,
        P.md(wdims, C.any),
        bias_md,
        dst,
        P.dims(strides),
        P.dims([d - 1 for d in dilations]),
        P.dims((before, begin[1])),
        P.dims((after, end[1])),
        attr,
    )
    if not P.md_equal(P.query_md(pd, C.query_src_md), src) or not P.md_equal(
        P.query_md(pd, C.query_dst_md), dst
    ):
        raise P.Unsupported("the part's layouts are not NHWC")
    w_md = P.query_md(pd, C.query_weights_md)
    args = {C.arg_src: src, C.arg_weights: w_md, C.arg_dst: dst}
    if bias:
        args[C.arg_bias] = bias_md
    scratch = P.scratchpad_arg(pd, args)
    return _Part(P.Prim(pd, args), w_md, scratch, (lo, hi, a, b))


def team_work(x: np.ndarray, w: np.ndarray) -> int:
    """The multiply-adds from which a batch-1 convolution of ``x`` by ``w`` runs on oneDNN's
    team (``_lib.team_for``'s ``small``): ``TEAM_WORK``, or ``WEIGHTY_TEAM_WORK`` for a 1x1
    convolution whose weights outweigh its source ``WEIGHTY`` times and for any whose
    weights reach ``WEIGHTY_BYTES``."""
    if w.ndim != 4:
        return TEAM_WORK
    weighty_1x1 = w.shape[2:] == (1, 1) and w.size >= WEIGHTY * (x.size // x.shape[0])
    return WEIGHTY_TEAM_WORK if weighty_1x1 or w.nbytes >= WEIGHTY_BYTES else TEAM_WORK


def will_split(y_shape: tuple[int, ...], w: np.ndarray, team: int) -> bool:
    """Whether a 2-D convolution of output ``y_shape`` and weights ``w`` is batch 1 and worth
    splitting on ``team`` threads (enough work, enough rows)."""
    if team < 2 or len(y_shape) != 4 or y_shape[0] != 1:
        return False
    return y_shape[2] * y_shape[3] * w.size >= ROW_SPLIT_WORK and y_shape[2] >= 2 * MIN_PART_ROWS


def split_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: Any,
    geometry: tuple,
    team: int,
    memo: dict | None = None,
) -> np.ndarray | None:
    """The convolution's output as the NCHW view of a channels-last buffer, computed in
    bands of rows on ``team`` threads; None where the split does not apply (not 4-D at batch
    1, too few rows or too little work, the pool backing off, oneDNN declining a part).
    ``memo``: the node's dict, where a split without Z is remembered (``Fast``)."""
    y_shape, group, _, window = geometry
    if not will_split(y_shape, w, team):
        return None
    oh = y_shape[2]
    work = oh * y_shape[3] * w.size
    parts = min(team * (PARTS_PER_THREAD if work >= FINE_WORK else 1), oh // MIN_PART_ROWS)
    if not pool.try_parallel():
        return None
    wdims = w.shape if group == 1 else (group, w.shape[0] // group) + tuple(w.shape[1:])
    spec = (x.shape, wdims, y_shape, window, b is not None, z is not None, act)
    try:  # one lookup a call: the plan holds its parts
        plan = P.cached(("conv-rows-plan", *spec, parts), lambda: _Plan(spec, parts))
    except P.Unsupported:
        return None
    xcl = x.transpose(0, 2, 3, 1)
    copied = not xcl.flags.c_contiguous
    if copied:
        xcl = np.ascontiguousarray(xcl)
    ycl = np.empty((1, oh, y_shape[3], y_shape[1]), np.float32)
    if z is not None:
        np.copyto(ycl, z.transpose(0, 2, 3, 1))
    buffers, alive = _buffers(plan, wdims, w, b, xcl, ycl)
    run_all(plan.prims, buffers, team)
    if memo is not None and not copied:
        memo["fast"] = Fast(plan, x, w, b, z, alive, team, ycl.shape, wdims)
    del alive  # the arrays behind the addresses lived until here
    RUNS[parts] += 1
    return P.from_channels_last(ycl)


class Fast(Remembered):
    """A node's split convolution, with or without Z, remembered with what it depends on
    (``_memo.Remembered``, as ``conv._Fast``): the next such call binds its bands and runs
    them with nothing looked up; the prepared weights are kept with 65 sampled values of the
    array, so an array rewritten in place is prepared again."""

    __slots__ = ("plan", "bias", "y_cl", "wdims")

    def __init__(
        self, plan: _Plan, x: np.ndarray, w: np.ndarray, b: Any, z: Any, alive: tuple,
        team: int, y_cl: tuple, wdims: tuple,
    ) -> None:  # fmt: skip
        super().__init__(x, w, b, z, True, team)
        self.plan, self.y_cl, self.wdims = plan, y_cl, wdims
        self.wk, self.bias = alive
        self.sample = P.sampled(w)  # the weights as prepared for this call

    def run(self, x: np.ndarray, w: np.ndarray, z: Any, out: Any = None) -> np.ndarray | None:
        if not pool.try_parallel():
            return None  # the caller runs the whole primitive while the pool backs off
        plan, key, wdims = self.plan, self.plan.wkey, self.wdims
        wk = self.prepared(
            w, lambda: P.weights(key, (w,), lambda: _weights_all(key, plan.parts, wdims, w))
        )
        ycl = _replay.empty(
            self.y_cl
        )  # np.empty, or the recorder's (backends/cpu/replay/record.py)
        if z is not None:
            _replay.copy(ycl, z.transpose(0, 2, 3, 1))  # the parts' sum post-op adds into it
        buffers = _bind(plan, wk, self.bias, x.transpose(0, 2, 3, 1), ycl)
        run_kept(plan.prims, buffers, self.team, wk, self.bias, x, ycl, plan)  # its scratchpads
        RUNS[len(plan.prims)] += 1
        if _replay.ACTIVE:  # the copy of Z and the parts' one call: all it did
            _replay.seal()
        return P.from_channels_last(ycl)


class _Plan:
    """A split's ``parts`` (one primitive per band of rows), built once per geometry, and
    each part's byte offsets by argument: its bands of the channels-last source and
    destination from their starts, its scratchpad's address from 0, the bias at 0."""

    __slots__ = ("parts", "prims", "wkey", "offsets")

    def __init__(self, spec: tuple, parts: int) -> None:
        x_shape, _, y_shape, _, bias = spec[:5]
        bounds = [y_shape[2] * k // parts for k in range(parts + 1)]
        self.parts = [
            P.cached(("conv-rows", *spec, lo, hi), lambda lo=lo, hi=hi: _build(*spec, lo, hi))
            for lo, hi in pairwise(bounds)
        ]
        self.prims = [p.prim for p in self.parts]
        self.wkey = ("conv-rows-w", *spec, tuple(p.rows for p in self.parts))
        x_row, y_row = 4 * x_shape[3] * x_shape[1], 4 * y_shape[3] * y_shape[1]
        self.offsets = []
        for part in self.parts:
            lo, _, a, _ = part.rows
            offsets = {C.arg_src: lo * x_row, C.arg_dst: a * y_row}
            offsets[C.arg_scratchpad] = part.scratch_ptr
            if bias:
                offsets[C.arg_bias] = 0
            self.offsets.append(offsets)


def _buffers(
    plan: _Plan,
    wdims: tuple[int, ...],
    w: np.ndarray,
    b: np.ndarray | None,
    xcl: np.ndarray,
    ycl: np.ndarray,
) -> tuple[list[dict[int, int]], tuple]:
    """Each part's buffers as addresses (``_bind``), its weights from one cache entry for all
    parts; and the arrays behind them that the caller must hold while they run (the weight
    cache may drop its entry meanwhile, from another thread, and a non-contiguous bias is a
    copy)."""
    key, built = plan.wkey, plan.parts
    wk = P.weights(key, (w,), lambda: _weights_all(key, built, wdims, w))
    bc = None if b is None else np.ascontiguousarray(b)
    return _bind(plan, wk, bc, xcl, ycl), (wk, bc)


def _bind(
    plan: _Plan, wk: _PartWeights, bias: np.ndarray | None, xcl: np.ndarray, ycl: np.ndarray
) -> list[dict[int, int]]:
    """Each part's buffers as addresses: ``plan.offsets`` from the arrays' starts, its own
    prepared weights."""
    bases = {C.arg_src: P.ptr(xcl), C.arg_dst: P.ptr(ycl), C.arg_scratchpad: 0}
    if bias is not None:
        bases[C.arg_bias] = P.ptr(bias)
    buffers = offset_buffers(bases, plan.offsets)
    for bufs, w_ptr in zip(buffers, wk.ptrs):
        bufs[C.arg_weights] = w_ptr
    return buffers


class _PartWeights:
    """The parts' prepared weights and their addresses (kept together: the addresses are
    valid while the arrays live)."""

    __slots__ = ("arrays", "ptrs")

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays
        self.ptrs = [P.ptr(a) for a in arrays]


def _weights_all(key: tuple, built: list[_Part], wdims: tuple[int, ...], w: np.ndarray) -> Any:
    return _PartWeights([_weights((key, k), p, wdims, w) for k, p in enumerate(built)])


def _weights(key: tuple, part: _Part, wdims: tuple[int, ...], w: np.ndarray) -> np.ndarray:
    buf = P.empty_for(part.w_md)
    user = P.md(wdims, P.plain_tag(len(wdims)))
    P.reorder_into((key, "w"), np.ascontiguousarray(w), user, buf, part.w_md)
    return buf
