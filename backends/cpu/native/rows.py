"""Row kernels in C: softmax (with attention's scale and mask) and layer normalization over
the last axis, float32, built once through ``build.load`` with the element-wise prelude.

numpy runs these as five to eight passes over the data, each a ufunc call of 3-10 us on the
small rows of transformer exports: the tiny BERT's attention softmax over ``[1, 2, 128, 128]``
took 66 us in numpy, its LayerNormalization over ``[1, 128, 32]`` 30 us.

Same arithmetic as the numpy kernels, in their order: sums are numpy's pairwise sum (eight
accumulators, blocks of 128, halves rounded down to a multiple of 8) added to a zero, so a
layer norm's statistics and output are bit-identical to numpy's; maxima propagate NaN as
``np.max``; softmax's ``exp`` is ``ac_expf_le0``, the prelude's ``ac_expf`` for arguments
at most 0 with fused multiply-adds (within 4 ulp of numpy's). Without a
compiler, ``softmax_rows`` and ``layer_norm_rows`` return None and the callers use numpy.
From ``native.fused.PARALLEL_WORK`` on, blocks of rows go to the threads of
``backends/cpu/native/pool.py``
(as many as the OpenMP count, ``backends/cpu/native/omp.py``); each row is computed whole by one
thread,
so the results do not depend on the thread count.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import numpy as np

from anychip.backends.cpu.native.fused import threads_for
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader
from anychip.codegen.c_emitter import C_PRELUDE

__all__ = [
    "softmax_rows",
    "layer_norm_rows",
    "skip_layer_norm_rows",
    "mask_view",
    "exact_op",
    "forget",
]

_SOURCE = r"""
/* numpy's pairwise sum (loops_utils.h), of a[i] or of a[i] * a[i]. */
#define AC_PSUM(NAME, T)                                                        \
static float NAME(const float *a, long n) {                                    \
    if (n < 8) {                                                                \
        float res = 0.0f;                                                       \
        for (long i = 0; i < n; i++) res += T(a[i]);                            \
        return res;                                                             \
    }                                                                           \
    if (n <= 128) {                                                             \
        float r[8];                                                             \
        for (int k = 0; k < 8; k++) r[k] = T(a[k]);                             \
        long i = 8;                                                             \
        for (; i < n - (n % 8); i += 8)                                         \
            for (int k = 0; k < 8; k++) r[k] += T(a[i + k]);                    \
        float res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7])); \
        for (; i < n; i++) res += T(a[i]);                                      \
        return res;                                                             \
    }                                                                           \
    long n2 = n / 2;                                                            \
    n2 -= n2 % 8;                                                               \
    return NAME(a, n2) + NAME(a + n2, n - n2);                                  \
}
#define AC_ID(v) (v)
#define AC_SQ(v) ((v) * (v))
AC_PSUM(ac_psum, AC_ID)
AC_PSUM(ac_psum_sq, AC_SQ)

/* max of a row, NaN if any element is NaN (np.max). gcc keeps a select reduction scalar
   without fast-math, so the lanes are GCC vector extensions (clang has them too): a compare
   gives 0 / -1 per lane, the blend is bitwise. */
typedef float ac_vf __attribute__((vector_size(32)));
typedef int32_t ac_vi __attribute__((vector_size(32)));
static float ac_rowmax(const float *a, long n) {
    ac_vf m = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
               -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    ac_vi nan = {0, 0, 0, 0, 0, 0, 0, 0};
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        ac_vf v;
        memcpy(&v, a + i, sizeof v);
        ac_vi gt = v > m;
        nan |= v != v;
        m = (ac_vf)(((ac_vi)v & gt) | ((ac_vi)m & ~gt));
    }
    float r = -INFINITY;
    int isnan = 0;
    for (int k = 0; k < 8; k++) {
        r = m[k] > r ? m[k] : r;
        isnan |= nan[k];
    }
    for (; i < n; i++) {
        r = a[i] > r ? a[i] : r;
        isnan |= a[i] != a[i];
    }
    return isnan ? NAN : r;
}

/* Softmax of one row of n: yr = softmax(xr op c + mr), op: 0 none, 1 divide, 2 multiply;
   the mask row mr (NULL: none) has its elements mj apart (0: one value per row). yr may be
   xr. */
static inline void ac_softmax_row(const float *xr, float *yr, const float *mr, long mj, long n,
                                  float c, int op) {
    if (mr && mj == 1 && op == 1) {  /* attention's case in one pass, the same roundings */
        for (long j = 0; j < n; j++) yr[j] = xr[j] / c + mr[j];
        mr = 0;
    } else if (mr && mj == 1 && op == 2) {
        for (long j = 0; j < n; j++) yr[j] = xr[j] * c + mr[j];
        mr = 0;
    } else if (op == 1) for (long j = 0; j < n; j++) yr[j] = xr[j] / c;
    else if (op == 2) for (long j = 0; j < n; j++) yr[j] = xr[j] * c;
    else if (yr != xr) for (long j = 0; j < n; j++) yr[j] = xr[j];
    if (mr) {
        if (mj == 1) for (long j = 0; j < n; j++) yr[j] = yr[j] + mr[j];
        else for (long j = 0; j < n; j++) yr[j] = yr[j] + mr[j * mj];
    }
    float m = ac_rowmax(yr, n);
    /* x - m in [-inf, 0] and no NaN: the prelude's ac_expf_fin, without ac_expf_le0's NaN
       selects (the same bits; the tiny BERT's masked softmax 26.3 -> 22.0 us) */
    if (m > -INFINITY && m < INFINITY)
        for (long j = 0; j < n; j++) yr[j] = ac_expf_fin(yr[j] - m);
    else
        for (long j = 0; j < n; j++) yr[j] = ac_expf_le0(yr[j] - m);
    float s = 0.0f + ac_psum(yr, n);
    for (long j = 0; j < n; j++) yr[j] = yr[j] / s;
}

/* Rows (flat over (i0, i1, i2) < (d0, d1, d2)) r0 to r1 of n, the mask row of row r at
   i0*m0 + i1*m1 + i2*m2: the indices are stepped, not divided out per row (three integer
   divisions a row took a fifth of the tiny BERT's masked softmax). */
struct ac_softmax_args {
    long d1, d2, n, m0, m1, m2, mj, block, rows;
    const float *x, *mask;
    float *y, c;
    int op;
};
static void ac_softmax_range(const struct ac_softmax_args *a, long r0, long r1) {
    long i2 = r0 % a->d2, i1 = (r0 / a->d2) % a->d1, i0 = r0 / (a->d1 * a->d2);
    for (long r = r0; r < r1; r++) {
        const float *mr = a->mask ? a->mask + i0 * a->m0 + i1 * a->m1 + i2 * a->m2 : 0;
        ac_softmax_row(a->x + r * a->n, a->y + r * a->n, mr, a->mj, a->n, a->c, a->op);
        if (++i2 == a->d2) {
            i2 = 0;
            if (++i1 == a->d1) {
                i1 = 0;
                i0++;
            }
        }
    }
}
static void ac_softmax_block(void *p, long b) {
    const struct ac_softmax_args *a = (const struct ac_softmax_args *)p;
    const long end = (b + 1) * a->block < a->rows ? (b + 1) * a->block : a->rows;
    ac_softmax_range(a, b * a->block, end);
}

/* Every row; on nthreads threads of the pool (backends/cpu/native/pool.py) in blocks of rows, about
   eight per thread, taken as each thread comes free. */
void ac_softmax(long d0, long d1, long d2, long n, const float *x, float *y,
                const float *mask, long m0, long m1, long m2, long mj, float c, int op,
                int nthreads, uintptr_t pool) {
    const long rows = d0 * d1 * d2;
    const long block = rows / (8 * (long)(nthreads > 1 ? nthreads : 1)) + 1;
    struct ac_softmax_args a = {d1, d2, n, m0, m1, m2, mj, block, rows, x, mask, y, c, op};
    if (nthreads > 1 && pool) {
        ((ac_pool_fn)pool)(ac_softmax_block, &a, (rows + block - 1) / block, nthreads);
        return;
    }
    ac_softmax_range(&a, 0, rows);
}

/* LayerNormalization of row r of n: the numpy kernel's steps; its mean and inv_std. With
   ``skip``, of x + skip (SkipLayerNormalization), the sum written to ``total`` first: the
   unfused Add's roundings. */
static inline void ac_layer_norm_row(long r, long n, const float *x, const float *skip,
                                     float *total, const float *scale, const float *bias,
                                     float eps, float *y, float *mean, float *inv_std) {
    const float count = (float)n;
    const float *xr = x + r * n;
    float *yr = y + r * n;
    if (skip) {  /* the sum in total's row, or (no total) in y's, normalized there */
        float *tr = total ? total + r * n : yr;
        const float *kr = skip + r * n;
        for (long j = 0; j < n; j++) tr[j] = xr[j] + kr[j];
        xr = tr;
    }
    float mu = (0.0f + ac_psum(xr, n)) / count;
    for (long j = 0; j < n; j++) yr[j] = xr[j] - mu;
    float var = (0.0f + ac_psum_sq(yr, n)) / count;
    float inv = 1.0f / sqrtf(var + eps);
    if (bias) for (long j = 0; j < n; j++) yr[j] = yr[j] * inv * scale[j] + bias[j];
    else for (long j = 0; j < n; j++) yr[j] = yr[j] * inv * scale[j];
    if (mean) mean[r] = mu;
    if (inv_std) inv_std[r] = inv;
}

struct ac_layer_norm_args {
    long n, block, rows;
    const float *x, *skip, *scale, *bias;
    float eps, *y, *total, *mean, *inv_std;
};
static void ac_layer_norm_block(void *p, long b) {
    const struct ac_layer_norm_args *a = (const struct ac_layer_norm_args *)p;
    const long end = (b + 1) * a->block < a->rows ? (b + 1) * a->block : a->rows;
    for (long r = b * a->block; r < end; r++)
        ac_layer_norm_row(r, a->n, a->x, a->skip, a->total, a->scale, a->bias, a->eps, a->y,
                          a->mean, a->inv_std);
}

void ac_layer_norm(long rows, long n, const float *x, const float *skip, const float *scale,
                   const float *bias, float eps, float *y, float *total, float *mean,
                   float *inv_std, int nthreads, uintptr_t pool) {
    if (nthreads > 1 && pool) {
        const long block = rows / (8 * (long)nthreads) + 1;
        struct ac_layer_norm_args a = {n, block, rows, x, skip, scale, bias, eps, y, total,
                                       mean, inv_std};
        ((ac_pool_fn)pool)(ac_layer_norm_block, &a, (rows + block - 1) / block, nthreads);
        return;
    }
    for (long r = 0; r < rows; r++)
        ac_layer_norm_row(r, n, x, skip, total, scale, bias, eps, y, mean, inv_std);
}
"""

_CDEF = """
void ac_softmax(long d0, long d1, long d2, long n, const float *x, float *y,
                const float *mask, long m0, long m1, long m2, long mj, float c, int op,
                int nthreads, uintptr_t pool);
void ac_layer_norm(long rows, long n, const float *x, const float *skip, const float *scale,
                   const float *bias, float eps, float *y, float *total, float *mean,
                   float *inv_std, int nthreads, uintptr_t pool)
"""
#: Work per element, in ``native.fused.PARALLEL_WORK``'s units: softmax's exp and five passes;
#: layer norm's two sums and three passes.
SOFTMAX_WORK, LAYER_NORM_WORK = 20, 8

_F32 = np.dtype(np.float32)
_lib, _forget = loader(C_PRELUDE + SOURCE_DECL + _SOURCE, _CDEF, "ac_softmax")


def forget() -> None:
    """Look for the compiler again on the next call."""
    _forget()


def _ok(a: np.ndarray) -> bool:
    return a.dtype == _F32 and a.flags.c_contiguous


@lru_cache(maxsize=256)
def exact_op(scale: float, op: int) -> tuple[float, int]:
    """``(scale, op)`` with a division by a power of two (in float32's normal range, both
    ways) made the multiplication by its inverse: the same correctly rounded results (both
    round the same real number), at half a pass's cost (attention's scale is sqrt(head
    size), 4 or 8 in the tiny and base exports)."""
    if op == 1 and scale > 0.0:
        mant, exp = math.frexp(scale)
        if mant == 0.5 and -125 <= exp <= 126:
            return 1.0 / scale, 2
    return scale, op


@lru_cache(maxsize=1024)
def _mask_strides(
    mshape: tuple[int, ...], mstrides: tuple[int, ...], shape: tuple[int, ...]
) -> tuple[int, int, int, int] | None:
    """A mask's strides in elements as broadcast to ``shape``, padded to four; None where it
    does not broadcast or a stride is not whole floats."""
    strides = [0, 0, 0, 0]
    k = 3
    for dim, stride, want in zip(mshape[::-1], mstrides[::-1], shape[::-1]):
        if dim != want and dim != 1:
            return None
        if dim != 1:
            if stride % 4:
                return None
            strides[k] = stride // 4
        k -= 1
    return strides[0], strides[1], strides[2], strides[3]


def mask_view(ffi: Any, mask: np.ndarray | None, shape: tuple[int, ...]) -> tuple | None:
    """``(pointer, strides, kept)`` for the C row kernels' mask broadcast to ``shape`` (rank
    4 at most): the mask's data pointer and its strides in elements as broadcast to
    ``shape``, padded to four (0 where broadcast), and what the caller holds through the
    call. ``(NULL, zeros, None)`` without a mask; None where the C does not apply (not
    float32, of higher rank, not broadcasting to ``shape``, or strides not whole floats).
    Worked out here (and remembered per shape) rather than by ``np.broadcast_to`` (3 us) and
    ``.ctypes`` (1 us): the tiny BERT's softmax spent 6 us of its 45 on them."""
    if mask is None:
        return ffi.NULL, (0, 0, 0, 0), None
    if mask.dtype != _F32 or mask.ndim > len(shape):
        return None
    strides = _mask_strides(mask.shape, mask.strides, shape)
    if strides is None:
        return None
    if mask.flags.c_contiguous:
        return ffi.from_buffer("float[]", mask), strides, mask
    return ffi.cast("const float *", mask.ctypes.data), strides, mask


def softmax_rows(
    x: np.ndarray,
    out: np.ndarray,
    mask: np.ndarray | None = None,
    scale: float = 1.0,
    op: int = 0,
    note: bool = False,
) -> bool:
    """``out = softmax(x op scale + mask)`` over the last axis (``op``: 0 none, 1 divide,
    2 multiply); ``out`` may be ``x``. False (nothing written) where the C does not apply:
    no compiler, not float32 or not C-contiguous, rank over 4, or a mask that does not
    broadcast to ``x`` or is not float32. ``note``: the C call is noted for a replay (the
    caller seals)."""
    if x.ndim == 0 or x.ndim > 4 or not (_ok(x) and _ok(out)) or out.shape != x.shape:
        return False
    lib = _lib()
    if lib is None:
        return False
    ffi, c, f32 = lib
    lead = (1,) * (4 - x.ndim) + x.shape[:-1]
    view = mask_view(ffi, mask, x.shape)
    if view is None:
        return False
    mptr, ms, _kept = view
    n = x.shape[-1]
    if n == 0 or x.size == 0:
        return True
    scale, op = exact_op(float(scale), op)
    args = (
        lead[0], lead[1], lead[2], n,
        ffi.from_buffer(f32, x), ffi.from_buffer(f32, out, require_writable=True),
        mptr, ms[0], ms[1], ms[2], ms[3], float(scale), op, *threads_for(x.size * SOFTMAX_WORK),
    )  # fmt: skip
    c.ac_softmax(*args)
    if note and _replay.ACTIVE:
        if mask is not None:
            _replay.hold(mask)  # the mask pointer's array, alive as long as the trace
        _replay.note(c.ac_softmax, args)
    return True


def layer_norm_rows(
    x: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None,
    eps: float,
    axis: int,
    out: np.ndarray | None = None,
    stats: bool = True,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None] | None:
    """LayerNormalization of float32 ``x`` over the axes from ``axis`` on, with ``scale``
    (and ``bias``) of the normalized axes' own shape: ``(y, mean, inv_std)`` as the numpy
    kernel returns them (``stats`` false: None for the two, not computed into memory), or
    None where the C does not apply. ``y`` is ``out`` when it is a C-contiguous float32
    array of ``x``'s shape (it may be ``x``: each row is read whole before it is written)."""
    done = _layer_norm(x, None, scale, bias, eps, axis, out, stats, False)
    return None if done is None else done[:3]


def skip_layer_norm_rows(
    x: np.ndarray,
    skip: np.ndarray,
    scale: np.ndarray,
    bias: np.ndarray | None,
    eps: float,
    stats: bool = True,
    total: bool = True,
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None, np.ndarray | None] | None:
    """SkipLayerNormalization over the last axis: ``(y, mean, inv_std, x + skip)``, the
    LayerNormalization of the sum as ``layer_norm_rows`` computes it (the sum rounded as the
    unfused Add rounds it); ``stats`` / ``total`` false: None in their places (the sum is
    then formed in ``y``'s rows). None where the C does not apply (``skip`` not of ``x``'s
    shape, or as ``layer_norm_rows``)."""
    if skip.shape != x.shape or not _ok(skip):
        return None
    return _layer_norm(x, skip, scale, bias, eps, x.ndim - 1, None, stats, total)


#: The scale and bias arrays of recent calls with their C pointers, by identity (each entry
#: holds its arrays, so an id is not reused while it is kept): a model's are constants, and
#: checking and binding them took a third of the tiny BERT's 11 us SkipLayerNormalization.
_PARAMS: dict[tuple[int, int, tuple[int, ...]], tuple] = {}
_PARAMS_KEEP = 64


def _params(
    scale: np.ndarray, bias: np.ndarray | None, norm: tuple[int, ...], ffi: Any, f32: Any
) -> Any:
    """``(scale, bias, scale's pointer, bias' pointer or NULL)`` when both hold one float32
    value per normalized element in order, else None."""
    key = (id(scale), id(bias), norm)
    hit = _PARAMS.get(key)
    if hit is not None and hit[0] is scale and hit[1] is bias:
        return hit
    n, k = math.prod(norm), len(norm)
    for p in (scale, bias):  # one value per normalized element, in their order
        if p is not None and not (_ok(p) and p.size == n and p.shape[p.ndim - k :] == norm):
            return None
    hit = (
        scale,
        bias,
        ffi.from_buffer(f32, scale),
        ffi.NULL if bias is None else ffi.from_buffer(f32, bias),
    )
    if len(_PARAMS) >= _PARAMS_KEEP:
        _PARAMS.pop(next(iter(_PARAMS), None), None)  # another thread may have popped it
    _PARAMS[key] = hit
    return hit


def _layer_norm(
    x: np.ndarray,
    skip: np.ndarray | None,
    scale: np.ndarray,
    bias: np.ndarray | None,
    eps: float,
    axis: int,
    out: np.ndarray | None,
    stats: bool = True,
    keep_total: bool = True,
) -> tuple | None:
    lib = _lib()
    if lib is None or x.size == 0 or not _ok(x):
        return None
    ffi, c, f32 = lib
    norm = x.shape[axis:]
    params = _params(scale, bias, norm, ffi, f32)
    if params is None:
        return None
    n = math.prod(norm)
    if out is None or out.shape != x.shape or not _ok(out):
        out = _replay.empty(x.shape)  # np.empty, or a recorder's (backends/cpu/replay/record.py)
    buf, null = ffi.from_buffer, ffi.NULL
    mean = inv = total = None
    if stats:
        stat = x.shape[:axis] + (1,) * len(norm)
        mean, inv = _replay.empty(stat), _replay.empty(stat)
    if skip is not None and keep_total:
        total = _replay.empty(x.shape)
    args = (
        x.size // n, n, buf(f32, x), null if skip is None else buf(f32, skip), params[2],
        params[3], eps, buf(f32, out, require_writable=True),
        null if total is None else buf(f32, total, require_writable=True),
        null if mean is None else buf(f32, mean, require_writable=True),
        null if inv is None else buf(f32, inv, require_writable=True),
        *threads_for(x.size * LAYER_NORM_WORK),
    )  # fmt: skip
    c.ac_layer_norm(*args)
    if _replay.ACTIVE:  # the one call: the callers (the normalization kernels) seal it
        _replay.note(c.ac_layer_norm, args)
    return out, mean, inv, total
