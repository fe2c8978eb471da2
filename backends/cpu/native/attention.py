"""``softmax(Q @ Kt op c + mask) @ V`` head by head on ``backends/cpu/native/pool.py``'s threads.

``FusedAttention`` otherwise runs as numpy's batched matmul (OpenBLAS, at one thread inside a
CPU partition: ``core/run/blas.py``), the softmax row kernel, and a second matmul:
all on one thread. Here each (batch, head) is a chunk: its scores by numpy's own OpenBLAS
``sgemm`` (the ``scipy_cblas_sgemm64_`` that numpy loaded, called through its address, with
OpenBLAS at one thread so calls from two threads do not start its own), the scale, mask and
softmax of ``rows.py`` row by row, and the product with V. The same sgemm, the same row code
and the same order as the unthreaded path.

Applies to float32 Q [..., S, D], Kt [..., D, T] and V [..., T, Dv] of one leading shape
(rank 3 or 4), Kt C-contiguous, Q and V C-contiguous or rows of contiguous floats at any
stride (the [B, S, H, D] projections transposed as views: sgemm reads them with lda/ldb),
and a float32 mask that broadcasts to the scores; ``attention`` returns None elsewhere (no
compiler, no ILP64 OpenBLAS found, OpenBLAS running more than one thread, rank or shapes
that differ) and the caller runs numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool, rows
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.codegen.build import loader
from anychip.codegen.c_emitter import C_PRELUDE
from anychip.core.run.blas import blas_single, openblas_address

__all__ = ["attention", "sgemm_address", "SGEMM_DECL"]

#: C type of ``sgemm_address()``'s function (its callers cast the address to it).
SGEMM_DECL = r"""
typedef void (*ac_sgemm_t)(int order, int ta, int tb, int64_t m, int64_t n, int64_t k,
                           float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc);
"""
_SOURCE = (
    SGEMM_DECL
    + r"""
struct ac_attn_args {
    ac_sgemm_t gemm;
    long h, s, d, t, dv, m0, m1, m2, mj, qs0, qs1, qs2, vs0, vs1, vs2;
    const float *q, *kt, *v, *mask;
    float *scores, *out, c;
    int op;
};

/* Head ``k`` (flat over the leading axes (b, h)): scores, their rows, the product with V.
   Q and V are read through their strides (qs0/vs0 per batch, qs1/vs1 per head, qs2/vs2 per
   row, in floats): the [B, S, H, D] projections transposed as views, sgemm's lda/ldb. */
static void ac_attn_head(void *p, long k) {
    const struct ac_attn_args *a = (const struct ac_attn_args *)p;
    float *sc = a->scores + k * a->s * a->t;
    const long b = k / a->h, hh = k % a->h;
    a->gemm(101, 111, 111, a->s, a->t, a->d, 1.0f, a->q + b * a->qs0 + hh * a->qs1, a->qs2,
            a->kt + k * a->d * a->t, a->t, 0.0f, sc, a->t);
    const struct ac_softmax_args rows = {a->h, a->s, a->t, a->m0, a->m1, a->m2, a->mj, 0, 0,
                                         a->scores, a->mask, a->scores, a->c, a->op};
    ac_softmax_range(&rows, k * a->s, (k + 1) * a->s);
    a->gemm(101, 111, 111, a->s, a->dv, a->t, 1.0f, sc, a->t,
            a->v + b * a->vs0 + hh * a->vs1, a->vs2, 0.0f, a->out + k * a->s * a->dv, a->dv);
}

void ac_attention(long heads, long h, long s, long d, long t, long dv, const float *q,
                  const long *qs, const float *kt, const float *v, const long *vs,
                  const float *mask, long m0, long m1, long m2, long mj, float c, int op,
                  float *scores, float *out, uintptr_t gemm, int nthreads, uintptr_t pool) {
    struct ac_attn_args a = {(ac_sgemm_t)gemm, h, s, d, t, dv, m0, m1, m2, mj,
                             qs[0], qs[1], qs[2], vs[0], vs[1], vs[2], q, kt, v,
                             mask, scores, out, c, op};
    if (nthreads > 1 && pool) {
        ((ac_pool_fn)pool)(ac_attn_head, &a, heads, nthreads);
        return;
    }
    for (long k = 0; k < heads; k++) ac_attn_head(&a, k);
}
"""
)
_CDEF = """void ac_attention(long heads, long h, long s, long d, long t, long dv, const float *q,
    const long *qs, const float *kt, const float *v, const long *vs, const float *mask,
    long m0, long m1, long m2, long mj, float c, int op, float *scores, float *out,
    uintptr_t gemm, int nthreads, uintptr_t pool)"""
_F32 = np.dtype(np.float32)


def sgemm_address() -> int:
    """The address of numpy's ILP64 OpenBLAS ``cblas_sgemm`` (0 where none is loaded)."""
    return openblas_address("scipy_cblas_sgemm64_")


_lib = loader(C_PRELUDE + SOURCE_DECL + rows._SOURCE + _SOURCE, _CDEF, "ac_attention")[0]


def _fits(q: np.ndarray, kt: np.ndarray, v: np.ndarray) -> bool:
    arrays = (q, kt, v)
    if not all(a.dtype == _F32 and a.ndim in (3, 4) for a in arrays) or not _ok(kt, True):
        return False
    lead = q.shape[:-2]
    if kt.shape[:-2] != lead or v.shape[:-2] != lead:
        return False
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        return False
    return _ok(q, False) and _ok(v, False)


def _ok(a: np.ndarray, contiguous: bool) -> bool:
    """C-contiguous, or (``contiguous`` false) rows of contiguous floats at a row stride of
    at least a row, whole floats apart everywhere (what sgemm's lda reads)."""
    if a.flags.c_contiguous:
        return True
    if contiguous or a.strides[-1] != 4 or any(st % 4 or st < 0 for st in a.strides):
        return False
    return a.strides[-2] >= 4 * a.shape[-1]


def _strides(ffi: Any, a: np.ndarray) -> Any:
    """``long[3]``: ``a``'s strides per batch, head and row, in floats (0: no batch axis)."""
    st = [x // 4 for x in a.strides[:-1]]
    return ffi.new("long[3]", [0] * (4 - a.ndim) + st)


def _pointer(ffi: Any, f32: Any, a: np.ndarray) -> Any:
    """``a``'s first float: its buffer when contiguous, else its data address (``a`` is
    held by the caller through the call)."""
    if a.flags.c_contiguous:
        return ffi.from_buffer(f32, a)
    return ffi.cast("float *", a.ctypes.data)


def attention(
    q: np.ndarray,
    kt: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    scale: float,
    op: int,
    threads: int,
    out: np.ndarray | None = None,
) -> np.ndarray | None:
    """``softmax(q @ kt op scale + mask) @ v`` (``op``: 1 divide, 2 multiply) on ``threads``
    threads, into ``out`` when it is a C-contiguous float32 array of the result's shape; None
    where this path does not apply (see the module docstring)."""
    if not _fits(q, kt, v) or q.size == 0 or kt.size == 0:
        return None
    gemm = sgemm_address()
    built = _lib() if gemm else None
    if built is None or not blas_single():
        return None
    ffi, lib, f32 = built
    s, d, t, dv = q.shape[-2], q.shape[-1], kt.shape[-1], v.shape[-1]
    lead4 = (1,) * (4 - q.ndim) + q.shape[:-2] + (s,)  # the scores' rows as (d0, d1, d2)
    scores = np.empty(q.shape[:-2] + (s, t), _F32)
    view = rows.mask_view(ffi, mask, scores.shape)
    if view is None:
        return None
    mptr, ms, _kept = view
    shape = q.shape[:-2] + (s, dv)
    if out is None or out.shape != shape or out.dtype != _F32 or not out.flags.c_contiguous:
        out = np.empty(shape, _F32)
    if any(np.may_share_memory(out, a) for a in (q, kt, v)):
        out = np.empty(shape, _F32)
    scale, op = rows.exact_op(float(scale), op)
    buf = ffi.from_buffer
    lib.ac_attention(
        math.prod(q.shape[:-2]), lead4[1], s, d, t, dv,
        _pointer(ffi, f32, q), _strides(ffi, q), buf(f32, kt), _pointer(ffi, f32, v),
        _strides(ffi, v), mptr,
        ms[0], ms[1], ms[2], ms[3], float(scale), op,
        buf(f32, scores, require_writable=True), buf(f32, out, require_writable=True),
        gemm, threads, pool.address() if threads > 1 else 0,
    )  # fmt: skip
    return out
