"""MatMul through oneDNN's matmul primitive, for a float32 A times a constant 2-D B.

B (an initializer: a layer's weights) is reordered once into the layout the primitive picks
(format ``any``: packed for its brgemm kernels) and cached; A's leading axes are folded into
the M axis. Measured on ResNet/BERT-like shapes at one thread, packed oneDNN ran 108-115 GFLOP/s
where numpy's OpenBLAS ran 89-104 for M >= 32, and slightly behind it for M = 1 (37 against 41),
so rows below ``MIN_ROWS`` stay with numpy (one row times large weights streams them through
``backends/cpu/native/gemv.py``, ``split_gemv``). A oneDNN call costs 12-50 us of its own (binding,
execute, stream wait; more with the OpenMP team waking on a busy machine) where numpy's costs 2:
products under ``MIN_MACS`` multiply-adds stay with numpy too (the tiny Hugging Face exports'
128x32 @ 32x32: 15 us oneDNN, 3.4 numpy; a scikit-learn model's 300x12 @ 12x4: 2 us numpy; at
64x256x256 the two tie, above it oneDNN leads at one thread).

Falls back to the numpy kernel (``kernels/op_matmul.py``) for: dtypes other than float32, a B
that is not a constant of rank 2 (activations times activations, batched weights), fewer than
``MIN_ROWS`` rows or ``MIN_MACS`` multiply-adds, and anything oneDNN declines.
"""

from __future__ import annotations

import math
from itertools import pairwise
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.native.gemv import gemv
from anychip.backends.cpu.native.linear import gemm_columns
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads
from anychip.backends.cpu.onednn._parallel import run_all
from anychip.backends.cpu.replay import record as _replay

__all__ = [
    "split_gemv",
    "GEMV_SPLIT_WEIGHTS",
    "GEMV_WEIGHTS",
    "MIN_ROWS",
    "MIN_MACS",
    "COLUMN_SPLIT_MAX",
    "ROW_SPLIT_WORK",
    "ROWS_PER_PART",
    "matmul",
    "split_columns",
]

#: Fewer rows of A than this: numpy's GEMV/GEMM (one call's Python overhead is ~10 us too).
MIN_ROWS = 16
#: Fewer multiply-adds than this (m * k * n): numpy (oneDNN's fixed cost dominates).
MIN_MACS = 1 << 21
#: From this many multiply-adds, with two threads or more given and oneDNN's team at one
#: thread (under ``_lib.MATMUL_SMALL_WORK``), the rows are split into parts of
#: ``ROWS_PER_PART`` or more (up to two per thread), one primitive each, run on
#: ``backends/cpu/native/pool.py``'s threads. Off: in idle seconds (``bench/onednn_team.py --kind
# matmul``,
#: team of 1 / team of 2 / split, us) 128x256x256 194 / 167 / 200, 211 / 182 / 210 and
#: 128x256x1024 646 / 407 / 435: parts of 32 rows cost 1.2-1.5x the CPU time of the whole,
#: and oneDNN's own team of two does better. Set it (tests, ``onednn_team.py``) to use it.
ROW_SPLIT_WORK = 1 << 62
ROWS_PER_PART = 32
#: From ``MIN_MACS`` multiply-adds to under this, given two threads or more, the product runs
#: as column blocks of numpy's sgemm, one per thread, on ``backends/cpu/native/pool.py``'s threads
#: (``cpu/native/linear.gemm_columns``), not through oneDNN: the BERT-like layer's 128x256x256
#: (2^23) took 94-97 us so (CPU 187-194) against 167-207 for oneDNN's team of two (its
#: threads wake from a passive wait, 60-100 us here) and 169 for one sgemm; with its FFN's
#: 128x256x1024 and 128x1024x256 (2^25) split too, bert_like ran 2.05 -> 1.80 ms and
#: gpt2_like 1.88 -> 1.75 at two threads (A/B in one process, load 1.6). The MLP's 64x1024x1024
#: (2^26) tied (5.40 / 5.63 ms, noisy): left to oneDNN's team. Why the row split above did
#: not pay and this does: parts of 32 rows ran oneDNN's brgemm at 1.2-1.5x the CPU time of
#: the whole, while column halves keep all rows per sgemm (each reads half of B), 1.1x.
COLUMN_SPLIT_MAX = 1 << 26


#: Weights (``k * n`` floats) from which a one-row product (a batch-1 fully connected layer)
#: at one thread streams them through ``backends/cpu/native/gemv.py``'s kernel rather than numpy's
# one-row
#: sgemm: with the caches flushed before each call (they are, in a model), numpy / this, us:
#: 4096x25088 (VGG-19's fc6) 21824 / 14899, 4096x9216 (AlexNet's) 7532 / 5956, but 4096x4096
#: 2952 / 3027 and 1000x1024 184-234 / 242-263, where numpy's stays.
GEMV_WEIGHTS = 1 << 25
#: From this many weights, given two threads or more, the product is cut into blocks of the
#: output on ``backends/cpu/native/pool.py``'s threads, streamed by the same kernel: two threads
# stream
#: the weights at twice the rate (a classifier's 1024x1000 Gemm took 200-222 us in
#: ShuffleNet's session at one thread's bandwidth, 54 us warm). Against the blocks of numpy's
#: sgemv it replaced, two threads, caches flushed, us: 4096x25088 15013 / 12428, 4096x9216
#: 5172 / 4458, 1000x2048 355 / 228; 4096x4096, 1000x1024 and 1000x544 within 8% either way.
GEMV_SPLIT_WEIGHTS = 1 << 19


def split_gemv(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool = False
) -> np.ndarray | None:
    """``a @ b`` (``a @ b.T`` with ``trans_b``) for one row ``a`` and large weights, as
    ``GEMV_WEIGHTS`` and ``GEMV_SPLIT_WEIGHTS`` describe; None for other shapes, smaller
    weights, and where ``backends/cpu/native/gemv.py`` does not apply (the caller runs numpy's)."""
    if a.ndim < 2 or b.ndim != 2 or b.size < GEMV_SPLIT_WEIGHTS or a.size == 0:
        return None
    k = b.shape[1] if trans_b else b.shape[0]
    if a.size != k or a.shape[-1] != k:  # one row
        return None
    threads = omp_threads()
    if threads > 1 and pool.try_parallel():
        return gemv(a, b, out, trans_b, threads)
    return gemv(a, b, out, trans_b, 1) if b.size >= GEMV_WEIGHTS else None


def split_columns(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool = False
) -> np.ndarray | None:
    """``a @ b`` (``a @ b.T`` with ``trans_b``) as ``COLUMN_SPLIT_MAX`` describes, into
    ``out`` when it fits; None (the caller runs oneDNN or numpy) at one thread, outside that
    range, while the pool backs off, and where ``gemm_columns`` does not apply."""
    if a.ndim < 2 or b.ndim != 2:
        return None
    n, k = b.shape if trans_b else b.shape[::-1]
    if not MIN_MACS <= a.size * n < COLUMN_SPLIT_MAX or a.shape[-1] != k:
        return None
    if a.size // k < MIN_ROWS:
        return None  # matrix-vector shapes: numpy's gemv or oneDNN, as before
    threads = omp_threads()
    if threads < 2 or not pool.try_parallel():
        return None
    return gemm_columns(a, b, out, trans_b, threads)


def matmul(
    a: np.ndarray, b: np.ndarray, out: np.ndarray | None, trans_b: bool = False, team: int = 1
) -> np.ndarray | None:
    """``a @ b`` (``a @ b.T`` with ``trans_b``: Gemm's transB) for a constant 2-D ``b``,
    written into ``out`` when it fits; None: numpy. ``team``: the threads given (a product
    run by one oneDNN thread may split its rows over them)."""
    if get() is None or a.dtype != np.float32 or b.dtype != np.float32:
        return None
    if a.ndim < 2 or b.ndim != 2 or 0 in a.shape or 0 in b.shape:
        return None
    m, (k, n) = math.prod(a.shape[:-1]), (b.shape[::-1] if trans_b else b.shape)
    if a.shape[-1] != k or m < MIN_ROWS or m * k * n < MIN_MACS:
        return None
    parts, threads = 1, omp_threads()
    if team > 1 and m * k * n >= ROW_SPLIT_WORK and threads == 1 and m >= 2 * ROWS_PER_PART:
        parts = min(2 * team, m // ROWS_PER_PART) if pool.try_parallel() else 1
    rows = -(-m // parts)
    bounds = list(range(0, m, rows)) + [m]
    packs: dict[int, np.ndarray] = {}  # B packed once per part height (the last may differ)
    try:
        runs = [_part(b, trans_b, (hi - lo, k, n, threads), j, len(bounds) - 1, packs)
                for j, (lo, hi) in enumerate(pairwise(bounds))]  # fmt: skip
    except P.Unsupported:
        return None
    y_shape = a.shape[:-1] + (n,)
    if out is None or out.shape != y_shape or out.dtype != np.float32 or not out.flags.c_contiguous:
        out = _replay.empty(y_shape)  # np.empty, or a recorder's (backends/cpu/replay/record.py)
    a = _replay.contiguous(a)
    if len(runs) == 1:  # the whole product: the arrays as they are, no row views
        entry, packed = runs[0]
        entry.prim.run({C.arg_src: a, C.arg_weights: packed, C.arg_dst: out})  # noted there
        _replay.seal()  # the copy and the product: all it did (callers adding more unseal)
        return out
    a2, y2 = a.reshape(m, k), out.reshape(m, n)
    bufs = []
    for (entry, packed), (lo, hi) in zip(runs, pairwise(bounds)):
        bufs.append({C.arg_src: a2[lo:hi], C.arg_weights: packed, C.arg_dst: y2[lo:hi]})
        bufs[-1][C.arg_scratchpad] = entry.scratch  # parts are built with their own
    run_all([e.prim for e, _ in runs], bufs, team)
    if _replay.ACTIVE:  # the parts' one call (the buffers' arrays kept by the note)
        _replay.note(run_all, ([e.prim for e, _ in runs], bufs, team))
        _replay.seal()
    return out


def _part(
    b: np.ndarray, trans_b: bool, dims: tuple[int, int, int, int], j: int, parts: int,
    packs: dict[int, np.ndarray],
) -> tuple[_MatMul, np.ndarray]:  # fmt: skip
    """The primitive for part ``j`` of ``parts`` (``dims``: its rows, k, n and the OpenMP
    count) and B packed for it (kept in ``packs`` by rows)."""
    m, k, n, _ = dims
    key = ("matmul", *dims)
    if parts > 1:  # parts run at once: distinct primitives, each with its own scratchpad
        entry = P.cached(key + (j, parts), lambda: _build(m, k, n, own=True))
    else:
        entry = P.cached(key, lambda: _build(m, k, n))
    if m not in packs:
        # Cached per weight array: a transposed B is made contiguous once, when it is packed.
        packs[m] = P.weights(
            key + (trans_b,), (b,), lambda: _pack(entry, key, b.T if trans_b else b)
        )
    return entry, packs[m]


class _MatMul:
    __slots__ = ("prim", "w_md", "k", "n", "scratch")

    def __init__(self, prim: P.Prim, w_md: Any, k: int, n: int, scratch: Any) -> None:
        self.prim = prim
        self.w_md = w_md
        self.k = k
        self.n = n
        self.scratch = scratch


def _build(m: int, k: int, n: int, own: bool = False) -> _MatMul:
    """``own``: the scratchpad is an argument (the part runs on another thread)."""
    L = P.lib()
    src, dst = P.md((m, k), C.ab), P.md((m, n), C.ab)
    pd = P.make_pd(
        L.dnnl.dnnl_matmul_primitive_desc_create,
        L.engine,
        src,
        P.md((k, n), C.any),
        L.ffi.NULL,
        dst,
        P.user_scratchpad() if own else P.attr(),
    )
    w_md = P.query_md(pd, C.query_weights_md)
    args = {C.arg_src: src, C.arg_weights: w_md, C.arg_dst: dst}
    scratch = P.scratchpad_arg(pd, args) if own else None
    return _MatMul(P.Prim(pd, args), w_md, k, n, scratch)


def _pack(entry: _MatMul, key: tuple, b: np.ndarray) -> np.ndarray:
    buf = P.empty_for(entry.w_md)
    user = P.md((entry.k, entry.n), C.ab)
    P.reorder_into((key, "w"), np.ascontiguousarray(b), user, buf, entry.w_md)
    return buf
