"""One row times a weight matrix (a batch-1 classifier, a fully connected layer): ``x @ W``
or ``x @ W.T`` streamed from memory in C, in blocks of the output on the pool's threads.

In a model such a product reads its weights from memory, not cache: the rest of the run
evicts them. numpy sends a ``[1, K] @ [K, N]`` product to OpenBLAS's sgemm with one row,
which packs the weights it reads, or to sgemv; neither streams them at the memory's rate here.
This kernel reads each weight once, in address order: for ``W [N, K]`` (Gemm's ``transB``)
four rows at a time, each row's dot product in two 8-wide FMA accumulators; for ``W [K, N]``
four rows of ``W`` at a time into a block of ``y`` that stays in L1. With the caches flushed
before each call (32 MB written), medians, us, numpy / this: at one thread 4096x25088 (VGG-19's
fc6) 21824 / 14899, 4096x9216 (AlexNet's) 7532 / 5956, 4096x4096 2952 / 3027, 1000x1024
184-234 / 242-263 (so ``onednn/matmul.GEMV_WEIGHTS`` keeps it to the largest); at two threads
against two blocks of numpy's sgemv 15013 / 12428, 5172 / 4458, and within 8% either way for
4096x4096, 1000x1024 and 1000x544.

Each output is a sum in a different order from OpenBLAS's (within float32 rounding of it);
NaN and infinities propagate as in any IEEE sum of products. ``gemv`` returns None where it
does not apply (no compiler, other dtypes or layouts, more than one row, an output over an
input) and the caller runs numpy.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.native.linear import SPANS_DECL, into
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.codegen.build import loader

__all__ = ["gemv", "forget"]

_SOURCE = (
    SOURCE_DECL
    + SPANS_DECL  # ac_apart, ac_block (blocks of the output, multiples of 16)
    + r"""
#ifdef __FMA__
#include <immintrin.h>
static inline float ac_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
#endif

/* y[i] = W[i, :] . x for rows r0 to r1 of W [n, k]. */
static void ac_rows(const float *w, const float *x, float *y, long k, long r0, long r1) {
    long i = r0;
#ifdef __FMA__
    for (; i + 4 <= r1; i += 4) {
        const float *w0 = w + i * k, *w1 = w0 + k, *w2 = w1 + k, *w3 = w2 + k;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        long j = 0;
        for (; j + 16 <= k; j += 16) {
            const __m256 xa = _mm256_loadu_ps(x + j), xb = _mm256_loadu_ps(x + j + 8);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), xa, a0);
            b0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j + 8), xb, b0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), xa, a1);
            b1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j + 8), xb, b1);
            a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), xa, a2);
            b2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j + 8), xb, b2);
            a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), xa, a3);
            b3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j + 8), xb, b3);
        }
        float s0 = ac_hsum(_mm256_add_ps(a0, b0)), s1 = ac_hsum(_mm256_add_ps(a1, b1));
        float s2 = ac_hsum(_mm256_add_ps(a2, b2)), s3 = ac_hsum(_mm256_add_ps(a3, b3));
        for (; j < k; j++) {
            s0 += w0[j] * x[j]; s1 += w1[j] * x[j]; s2 += w2[j] * x[j]; s3 += w3[j] * x[j];
        }
        y[i] = s0; y[i + 1] = s1; y[i + 2] = s2; y[i + 3] = s3;
    }
#endif
    for (; i < r1; i++) {
        const float *wr = w + i * k;
        float s = 0.0f;
        for (long j = 0; j < k; j++) s += wr[j] * x[j];
        y[i] = s;
    }
}

/* y[c0:c1] = x @ W[:, c0:c1] for W [k, n]: four rows of W at a time into y's block. */
static void ac_cols(const float *w, const float *x, float *y, long k, long n, long c0,
                    long c1) {
    float *yb = y + c0;
    const long m = c1 - c0;
    for (long j = 0; j < m; j++) yb[j] = 0.0f;
    long i = 0;
    for (; i + 4 <= k; i += 4) {
        const float *w0 = w + i * n + c0, *w1 = w0 + n, *w2 = w1 + n, *w3 = w2 + n;
        const float x0 = x[i], x1 = x[i + 1], x2 = x[i + 2], x3 = x[i + 3];
        long j = 0;
#ifdef __FMA__
        const __m256 v0 = _mm256_set1_ps(x0), v1 = _mm256_set1_ps(x1);
        const __m256 v2 = _mm256_set1_ps(x2), v3 = _mm256_set1_ps(x3);
        for (; j + 8 <= m; j += 8) {
            __m256 a = _mm256_loadu_ps(yb + j);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + j), v0, a);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + j), v1, a);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + j), v2, a);
            a = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + j), v3, a);
            _mm256_storeu_ps(yb + j, a);
        }
#endif
        for (; j < m; j++) yb[j] = yb[j] + w0[j] * x0 + w1[j] * x1 + w2[j] * x2 + w3[j] * x3;
    }
    for (; i < k; i++) {
        const float *wr = w + i * n + c0;
        const float xi = x[i];
        for (long j = 0; j < m; j++) yb[j] = yb[j] + wr[j] * xi;
    }
}

struct ac_gv { const float *x, *w; float *y; long n, k, parts; int tb; };

static void ac_gv_part(void *p, long i) {
    const struct ac_gv *s = (const struct ac_gv *)p;
    const long c0 = ac_block(s->n, s->parts, i), c1 = ac_block(s->n, s->parts, i + 1);
    if (c1 <= c0) return;
    if (s->tb) ac_rows(s->w, s->x, s->y, s->k, c0, c1);
    else ac_cols(s->w, s->x, s->y, s->k, s->n, c0, c1);
}

/* y [n] = x [k] @ W (tb 0: W [k, n]; tb 1: W [n, k], x @ W^T), or -1 (nothing written)
   where y overlaps an input. */
int ac_gemv(long n, long k, const float *x, const float *w, float *y, int tb, long parts,
            int nthreads, uintptr_t pool) {
    if (!(ac_apart(y, n, x, k) && ac_apart(y, n, w, k * n))) return -1;
    struct ac_gv s = {x, w, y, n, k, parts, tb};
    if (nthreads > 1 && parts > 1 && pool) ((ac_pool_fn)pool)(ac_gv_part, &s, parts, nthreads);
    else for (long i = 0; i < parts; i++) ac_gv_part(&s, i);
    return 0;
}
"""
)
_CDEF = """int ac_gemv(long n, long k, const float *x, const float *w, float *y, int tb, long parts,
    int nthreads, uintptr_t pool);"""
_F32 = np.dtype(np.float32)
_lib, _forget = loader(_SOURCE, _CDEF, "ac_gemv")


def forget() -> None:
    """Look for the compiler again on the next call."""
    _forget()


def gemv(
    x: np.ndarray, w: np.ndarray, out: np.ndarray | None, trans_b: bool, parts: int = 1
) -> np.ndarray | None:
    """``x @ w`` (``x @ w.T`` with ``trans_b``) for one row ``x`` (``[K]``, ``[1, K]``, ...,
    float32, C-contiguous) and a C-contiguous float32 2-D ``w``, in ``parts`` blocks of the
    output (on the pool's threads from two), into ``out`` when it is a C-contiguous float32
    array of the result's shape. None where this does not apply (module docstring)."""
    if not (x.dtype is _F32 and w.dtype is _F32 and w.ndim == 2 and x.flags.c_contiguous):
        return None
    if not w.flags.c_contiguous or x.size == 0 or x.ndim == 0 or x.size != x.shape[-1]:
        return None
    n, k = w.shape if trans_b else w.shape[::-1]
    if x.shape[-1] != k or n == 0 or parts < 1:
        return None
    lib = _lib()
    if lib is None:
        return None
    parts = min(parts, max(1, n // 16))
    shape = x.shape[:-1] + (n,)
    out = into(out, shape)
    ffi, c, f32 = lib
    buf = ffi.from_buffer
    done = c.ac_gemv(
        n, k, buf(f32, x), buf(f32, w), buf(f32, out, require_writable=True), int(trans_b),
        parts, parts, pool.address() if parts > 1 else 0,
    )  # fmt: skip
    return None if done < 0 else out
