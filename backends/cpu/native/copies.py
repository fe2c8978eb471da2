"""Layout copies of the CNNs in C, float32: ShuffleNet's channel shuffle from a plain (NCHW)
tensor straight into a channels-last buffer, and its one-group mirror ``to_planar`` (a
channels-last tensor into a plain buffer, for a numpy reader after a oneDNN pool), on the
threads of ``backends/cpu/native/pool.py`` when the copy is large enough.

``Y[:, i * g + t] = X[:, t * m + i]`` (``m = C / g``) written as NHWC: for each tile of 8
pixels by 8 output channels, eight 8-float runs of the source planes go through an 8x8
register transpose (AVX where the compiler targets it, else scalar) and land as eight 8-float
runs of the destination rows; channels past a multiple of 8 and the last pixels of a plane
are copied one by one. A copy, so the result is bit-identical (NaN payloads included)
whatever the split: blocks of tiles go to the pool's threads (``codegen.threads_for``).

It stands before oneDNN's reorder between two strided 5-D descriptors (``onednn/shuffle.py``).
At one thread (medians of 100, us, oneDNN / this, 4 groups): 112x56x56 121 / 109, 136x28x28
45 / 36, 272x14x14 21 / 22, 544x7x7 23 / 14. Without a compiler ``shuffle_channels_last``
returns None and the caller keeps oneDNN's reorder.

``to_planar`` runs the same kernel on the buffer's ``[H*W, C]`` rows (one group), where
numpy's strided ``copyto`` was twice as slow (1 thread, us, numpy / this: 64x56x56 158 / 86,
24x56x56 45 / 24) and oneDNN's reorder no faster (2 threads, team of one, us, oneDNN / this:
64x56x56 60 / 65, 64x55x55 79 / 64, 24x56x56 63 / 27, 128x28x28 39 / 35).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.native.fused import threads_for
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader

__all__ = [
    "shuffle_channels_last",
    "to_planar",
    "concat_channels_last",
    "forget",
    "COPY_WORK",
    "CONCAT_WORK",
    "PLANAR_MIN",
]

_SOURCE = r"""
#include <string.h>
/* Output channel k of the shuffle reads source channel (k % g) * (c / g) + k / g. */
static inline long ac_sh_src(long k, long c, long g) { return (k % g) * (c / g) + k / g; }

#ifdef __AVX__
#include <immintrin.h>
/* dst[j * ld + k] = src[k][j] for j, k < 8: unpack pairs, shuffle quads, swap lanes. */
static inline void ac_sh_tile(const float *const *src, float *dst, long ld) {
    __m256 r0 = _mm256_loadu_ps(src[0]), r1 = _mm256_loadu_ps(src[1]);
    __m256 r2 = _mm256_loadu_ps(src[2]), r3 = _mm256_loadu_ps(src[3]);
    __m256 r4 = _mm256_loadu_ps(src[4]), r5 = _mm256_loadu_ps(src[5]);
    __m256 r6 = _mm256_loadu_ps(src[6]), r7 = _mm256_loadu_ps(src[7]);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
    _mm256_storeu_ps(dst + 0 * ld, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + 1 * ld, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ld, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ld, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ld, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ld, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ld, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ld, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#else
static inline void ac_sh_tile(const float *const *src, float *dst, long ld) {
    for (int j = 0; j < 8; j++)
        for (int k = 0; k < 8; k++) dst[j * ld + k] = src[k][j];
}
#endif

struct ac_sh_args { const float *x; float *y; long c, hw, g, block, tiles; };

/* Pixels p0 to p1 of batch item b, one element at a time. */
static void ac_sh_pixels(const struct ac_sh_args *a, long b, long p0, long p1) {
    const float *x = a->x + b * a->c * a->hw;
    float *y = a->y + b * a->c * a->hw;
    for (long p = p0; p < p1; p++)
        for (long k = 0; k < a->c; k++) y[p * a->c + k] = x[ac_sh_src(k, a->c, a->g) * a->hw + p];
}

/* Block t of tiles; tile q is (batch item q / per, 8 pixels from 8 * (q % per)), the last of
   an item holding its hw % 8 remaining pixels. */
static void ac_sh_block(void *p, long t) {
    const struct ac_sh_args *a = (const struct ac_sh_args *)p;
    const long per = a->hw / 8 + 1, c8 = a->c - a->c % 8;
    const long end = (t + 1) * a->block < a->tiles ? (t + 1) * a->block : a->tiles;
    for (long q = t * a->block; q < end; q++) {
        const long b = q / per, s = q % per;
        if (s == per - 1) {
            ac_sh_pixels(a, b, s * 8, a->hw);
            continue;
        }
        const float *x = a->x + b * a->c * a->hw + s * 8;
        float *y = a->y + (b * a->hw + s * 8) * a->c;
        const float *src[8];
        for (long k = 0; k < c8; k += 8) {
            for (int j = 0; j < 8; j++) src[j] = x + ac_sh_src(k + j, a->c, a->g) * a->hw;
            ac_sh_tile(src, y + k, a->c);
        }
        for (long k = c8; k < a->c; k++)
            for (int j = 0; j < 8; j++) y[j * a->c + k] = x[ac_sh_src(k, a->c, a->g) * a->hw + j];
    }
}

void ac_shuffle_cl(const float *x, float *y, long n, long c, long hw, long g, int nthreads,
                   uintptr_t pool) {
    const long tiles = n * (hw / 8 + 1);
    const long block = tiles / (8 * (long)(nthreads > 1 ? nthreads : 1)) + 1;
    struct ac_sh_args a = {x, y, c, hw, g, block, tiles};
    if (nthreads > 1 && pool && tiles > block) {
        ((ac_pool_fn)pool)(ac_sh_block, &a, (tiles + block - 1) / block, nthreads);
        return;
    }
    for (long t = 0; t * block < tiles; t++) ac_sh_block(&a, t);
}

/* A channel Concat of channels-last tensors: row r (one pixel) of the destination, ctot
   floats, is row r of each source (width[i] floats) one after another. A block of rows per
   chunk, each source's rows read in order. */
struct ac_cat_args {
    const float *const *src;
    const long *width;
    long k, rows, ctot, block;
    float *y;
};

static void ac_cat_block(void *p, long t) {
    const struct ac_cat_args *a = (const struct ac_cat_args *)p;
    const long r0 = t * a->block, r1 = r0 + a->block < a->rows ? r0 + a->block : a->rows;
    long off = 0;
    for (long i = 0; i < a->k; i++) {
        const long w = a->width[i];
        const float *s = a->src[i] + r0 * w;
        float *y = a->y + r0 * a->ctot + off;
        for (long r = r0; r < r1; r++, s += w, y += a->ctot)
            memcpy(y, s, (size_t)w * sizeof(float));
        off += w;
    }
}

void ac_concat_cl(const float *const *src, const long *width, long k, float *y, long rows,
                  long ctot, int nthreads, uintptr_t pool) {
    const long chunks = nthreads > 1 && pool ? 4 * (long)nthreads : 1;
    const long block = (rows + chunks - 1) / chunks;
    struct ac_cat_args a = {src, width, k, rows, ctot, block > 0 ? block : 1, y};
    if (chunks > 1 && rows > block) {
        ((ac_pool_fn)pool)(ac_cat_block, &a, (rows + a.block - 1) / a.block, nthreads);
        return;
    }
    ac_cat_block(&a, 0);
}
"""

_CDEF = """
void ac_shuffle_cl(const float *x, float *y, long n, long c, long hw, long g, int nthreads,
                   uintptr_t pool);
void ac_concat_cl(const float *const *src, const long *width, long k, float *y, long rows,
                  long ctot, int nthreads, uintptr_t pool)
"""
#: Work per element copied, in ``native.fused.PARALLEL_WORK``'s units: from 2^17 elements (a
#: 136x28x28 tensor is 106,624, 112x56x56 351,232) the copy goes to the pool's threads.
COPY_WORK = 16
#: The same for ``concat_channels_last`` (a plain copy, no transpose): from 2^18 elements on
#: the pool (2 threads, us, numpy on one thread / this on the pool: 2 x 64 x 55 x 55 57.4 /
#: 35.9, 2 x 128 x 27 x 27 22.6 / 28.1).
CONCAT_WORK = 8
#: Elements from which ``to_planar`` copies (1 thread, us, numpy's ``copyto`` / this:
#: 64x56x56 158 / 86, 24x56x56 45 / 24, 13x7x9 1 / 4).
PLANAR_MIN = 1 << 13

_lib, _forget = loader(SOURCE_DECL + _SOURCE, _CDEF, "ac_shuffle_cl")


def forget() -> None:
    """Look for the compiler again on the next call."""
    _forget()


def shuffle_channels_last(x: np.ndarray, group: int) -> np.ndarray | None:
    """ShuffleNet's channel shuffle of the C-contiguous float32 NCHW ``x`` (``Y[:, i * g + t]
    = X[:, t * m + i]``, ``m = C / g``) as the NCHW view of a new channels-last buffer; None
    without a compiler or where that does not hold (another rank or dtype, not C-contiguous,
    empty, ``group`` not dividing the channels)."""
    if x.dtype != np.float32 or x.ndim != 4 or not x.flags.c_contiguous or x.size == 0:
        return None
    n, c, h, w = x.shape
    if group < 1 or c % group:
        return None
    lib = _lib()
    if lib is None:
        return None
    ffi, lc, f32 = lib
    buf = _replay.empty((n, h, w, c))  # np.empty, or the recorder's (backends/cpu/replay/record.py)
    args = (
        ffi.from_buffer(f32, x), ffi.from_buffer(f32, buf, require_writable=True),
        n, c, h * w, group, *threads_for(x.size * COPY_WORK),
    )  # fmt: skip
    lc.ac_shuffle_cl(*args)
    if _replay.ACTIVE:
        _replay.note(lc.ac_shuffle_cl, args)
    return buf.transpose(0, 3, 1, 2)


def to_planar(x: np.ndarray, out: np.ndarray) -> bool:
    """``out`` (C-contiguous float32 NCHW) = ``x``, the NCHW view of a channels-last float32
    buffer: the same tile transpose, the buffer's ``[H*W, C]`` rows becoming ``[C, H*W]``
    (the shuffle with one group and the roles of the axes swapped). False (nothing written)
    without a compiler, under ``PLANAR_MIN`` elements (numpy's strided copy is faster there)
    or where that does not hold."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.ndim != 4 or x.size < PLANAR_MIN:
        return False
    if out.shape != x.shape or not out.flags.c_contiguous:
        return False
    n, c, h, w = x.shape
    buf = x.transpose(0, 2, 3, 1)
    if not buf.flags.c_contiguous:
        return False
    lib = _lib()
    if lib is None:
        return False
    ffi, lc, f32 = lib
    args = (
        ffi.from_buffer(f32, buf), ffi.from_buffer(f32, out, require_writable=True),
        n, h * w, c, 1, *threads_for(x.size * COPY_WORK),
    )  # fmt: skip
    lc.ac_shuffle_cl(*args)
    if _replay.ACTIVE:
        _replay.note(lc.ac_shuffle_cl, args)
    return True


def concat_channels_last(arrays: list[np.ndarray], y: np.ndarray) -> bool:
    """``y`` = the channel Concat of ``arrays``, where ``y`` and every one of them is the NCHW
    view of a channels-last float32 buffer (``y``'s rows of ``C`` floats are the sources'
    rows one after another), on the pool's threads: blocks of pixels, one ``memcpy`` per
    source and pixel. Only with the pool (``CONCAT_WORK``): on one thread numpy's strided
    ``copyto`` is as fast (us, numpy / this: 2 x 64 x 55 x 55 60.5 / 57.2, 2 x 192 x 13 x 13
    7.7 / 11.7). False (nothing written) on one thread, without a compiler or where that
    does not hold."""
    buf = y.transpose(0, 2, 3, 1)
    if y.dtype != np.float32 or y.ndim != 4 or not buf.flags.c_contiguous or y.size == 0:
        return False
    threads = threads_for(y.size * CONCAT_WORK)
    if threads[0] <= 1:
        return False
    srcs = [a.transpose(0, 2, 3, 1) for a in arrays]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in srcs):
        return False
    if sum(a.shape[3] for a in srcs) != y.shape[1]:
        return False
    if any(a.shape[:3] != buf.shape[:3] for a in srcs):
        return False
    lib = _lib()
    if lib is None:
        return False
    ffi, lc, f32 = lib
    views = [ffi.from_buffer(f32, a) for a in srcs]
    args = (
        ffi.new("float *[]", views), ffi.new("long[]", [a.shape[3] for a in srcs]), len(srcs),
        ffi.from_buffer(f32, buf, require_writable=True), buf.size // buf.shape[3],
        buf.shape[3], *threads,
    )  # fmt: skip
    lc.ac_concat_cl(*args)
    if _replay.ACTIVE:
        _replay.note(_call, (lc.ac_concat_cl, args, views))
    return True


def _call(fn: Any, args: tuple, keep: list) -> None:
    """``fn(*args)`` again; ``keep`` holds the buffers behind the pointers in ``args``."""
    fn(*args)
