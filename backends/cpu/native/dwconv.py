"""Depthwise 2-D convolution (``group == C == M``) in C, float32, channels-last in and out.

MobileNet's and ShuffleNet's 3x3 depthwise convolutions took 2-4x onnxruntime's time through
oneDNN's ``brdgmm_dw`` kernel (issue 14). Here each output pixel is a sum over the taps of
``x[iy, ix, c] * w[tap, c]`` with the channels innermost: the source is the NHWC buffer behind
an NCHW view (``onednn/_prim.from_channels_last``); the weights as ``[KH * KW, C]``, the bias
and the geometry are prepared once per node. Along each output row, 64 channels at a time,
four output pixels by four 16-float vectors of accumulators stay in AVX-512 registers across
the taps (a 3x3, dilation-1, stride 1 or 2 block loads each source vector once); at the left
and right pads one pixel at a time skips the taps in the padding, and channels past a
multiple of 64 go 16 at a time, the last under a mask. Bias, the residual ``Z`` (added after
the bias, as oneDNN's ``sum`` post-op) and the activation (Relu, LeakyRelu, Clip: ordered
compares, which keep NaN) are applied before the one store.

Each output is computed the same way whatever the split, so one and two threads give the
same bits: blocks of output rows (batch items times rows) go to the threads of
``backends/cpu/native/pool.py`` (the caller takes blocks too) from ``PARALLEL_FMAS`` multiply-adds
on,
while ``pool.try_parallel()`` allows. ``depthwise`` returns None (the caller runs oneDNN)
without a compiler or AVX-512 (the portable C loops, kept for the build, were not measured
faster), for another layout, dtype or activation, a kernel over ``MAX_KERNEL``, and for the
shapes where oneDNN measured faster (``MIN_CHANNELS``). ``ANYCHIP_DWCONV=0`` turns it off
(for measuring against oneDNN in one process).
"""

from __future__ import annotations

import os

import numpy as np

from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.native.copies import to_planar
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader

__all__ = [
    "depthwise",
    "applies",
    "switched_off",
    "forget",
    "RUNS",
    "MAX_KERNEL",
    "PARALLEL_FMAS",
    "MIN_CHANNELS",
    "MIN_WIDTH",
    "MAX_WIDTH",
]

_SOURCE = r"""
#include <math.h>
#define AC_V 16
#define AC_CB 64 /* channels a pass along a row */
struct ac_dw {
    const float *x, *w, *b, *z; float *y;
    long c, h, wi, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, rows, total;
    int act; float p0, p1;
};

#if defined(__AVX512F__) && !defined(AC_DW_PORTABLE)
#include <immintrin.h>
int ac_dw_simd(void) { return 1; }

/* A full load where the mask is all ones (known once inlined). */
static inline __attribute__((always_inline)) __m512 ac_ld(__mmask16 m, const float *p) {
    return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}

/* np_ output pixels (4 away from the pads, else 1) from source column ix0, taps kh in
   [k0, k1) and kw in [j0, j1), nb vectors of channels from c0 (the last one under mask m),
   the same sums in the same order whether k3s (below) is set or not;
   then bias, Z, the activation (ordered compares: NaN stays NaN) and one store. */
static inline __attribute__((always_inline)) void ac_dw_px(
        const struct ac_dw *a, const float *xb, long iy0, long k0, long k1, long ix0,
        long j0, long j1, long c0, int nb, __mmask16 m, int np_, int k3s, float *y,
        const float *z) {
    __m512 acc[4][4];
    const long c = a->c, step = a->sw * c;
    _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) {
        const __m512 bias = ac_ld(q == nb - 1 ? m : 0xFFFF, a->b + c0 + 16 * q);
        _Pragma("GCC unroll 4") for (int p = 0; p < np_; p++) acc[p][q] = bias;
    }
    if (k3s) { /* kw 3, dilation 1, stride k3s: each source vector loaded once */
        for (long u = k0; u < k1; u++) {
            const float *xr = xb + ((iy0 + u * a->dh) * a->wi + ix0) * c + c0;
            const float *wr = a->w + u * 3 * c + c0;
            _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) {
                const __mmask16 mq = q == nb - 1 ? m : 0xFFFF;
                const __m512 w0 = ac_ld(mq, wr + 16 * q), w1 = ac_ld(mq, wr + c + 16 * q);
                const __m512 w2 = ac_ld(mq, wr + 2 * c + 16 * q);
                _Pragma("GCC unroll 16") for (int i = 0; i < (np_ - 1) * k3s + 3; i++) {
                    const __m512 xv = ac_ld(mq, xr + i * c + 16 * q);
                    _Pragma("GCC unroll 4") for (int p = 0; p < np_; p++) {
                        const int t = i - p * k3s;
                        if (t == 0) acc[p][q] = _mm512_fmadd_ps(xv, w0, acc[p][q]);
                        if (t == 1) acc[p][q] = _mm512_fmadd_ps(xv, w1, acc[p][q]);
                        if (t == 2) acc[p][q] = _mm512_fmadd_ps(xv, w2, acc[p][q]);
                    }
                }
            }
        }
    } else {
        for (long u = k0; u < k1; u++) {
            const float *xr = xb + (iy0 + u * a->dh) * a->wi * c + c0;
            const float *wr = a->w + u * a->kw * c + c0;
            _Pragma("GCC unroll 3") for (long t = j0; t < j1; t++) {
                const float *xp = xr + (ix0 + t * a->dw) * c;
                _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) {
                    const __mmask16 mq = q == nb - 1 ? m : 0xFFFF;
                    const __m512 wv = ac_ld(mq, wr + t * c + 16 * q);
                    _Pragma("GCC unroll 4") for (int p = 0; p < np_; p++)
                        acc[p][q] = _mm512_fmadd_ps(
                            ac_ld(mq, xp + p * step + 16 * q), wv, acc[p][q]);
                }
            }
        }
    }
    const __m512 zero = _mm512_setzero_ps(), p0 = _mm512_set1_ps(a->p0);
    const __m512 p1 = _mm512_set1_ps(a->p1);
    _Pragma("GCC unroll 4") for (int p = 0; p < np_; p++)
        _Pragma("GCC unroll 4") for (int q = 0; q < nb; q++) {
            const __mmask16 mq = q == nb - 1 ? m : 0xFFFF;
            const long o = p * c + c0 + 16 * q;
            __m512 v = acc[p][q];
            if (z) v = _mm512_add_ps(v, ac_ld(mq, z + o));
            if (a->act == 1)
                v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
            if (a->act == 2)
                v = _mm512_mask_mul_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), v, p0);
            if (a->act == 3) {
                v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, p0, _CMP_LT_OQ), p0);
                v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, p1, _CMP_GT_OQ), p1);
            }
            if (mq == 0xFFFF) _mm512_storeu_ps(y + o, v);
            else _mm512_mask_storeu_ps(y + o, mq, v);
        }
}

/* Channels c0 to c0 + nv (at most 64) of np_ pixels: four full vectors at once, else
   one vector at a time, the last under a mask. */
static inline __attribute__((always_inline)) void ac_dw_blk(
        const struct ac_dw *a, const float *xb, long iy0, long k0, long k1, long ix0,
        long j0, long j1, long c0, long nv, int np_, int k3s, float *y, const float *z) {
    if (nv == AC_CB) {
        ac_dw_px(a, xb, iy0, k0, k1, ix0, j0, j1, c0, AC_CB / 16, 0xFFFF, np_, k3s, y, z);
        return;
    }
    for (long d = 0; d < nv; d += 16) {
        const long left = nv - d;
        const __mmask16 m = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1u);
        ac_dw_px(a, xb, iy0, k0, k1, ix0, j0, j1, c0 + d, 1, m, np_, k3s, y, z);
    }
}
#else
int ac_dw_simd(void) { return 0; }

static inline float ac_dw_act(float v, int act, float p0, float p1) {
    if (act == 1) return v < 0.0f ? 0.0f : v;
    if (act == 2) return v < 0.0f ? v * p0 : v;
    if (act == 3) return v < p0 ? p0 : (v > p1 ? p1 : v);
    return v;
}

/* Bias, Z, activation and the store of nv channels of np_ pixels (pixel stride c). */
static inline __attribute__((always_inline)) void ac_dw_out(
        const struct ac_dw *a, float acc[][AC_V], int np_, long nv, float *y, const float *z) {
    for (int p = 0; p < np_; p++)
        for (long j = 0; j < nv; j++) {
            float v = acc[p][j];
            if (z) v = v + z[p * a->c + j];
            y[p * a->c + j] = ac_dw_act(v, a->act, a->p0, a->p1);
        }
}

/* np_ output pixels (np_ = 8 or 4 away from the pads, else 1) from source column ix0, taps
   kh in [k0, k1) and kw in [j0, j1), channels c0 to c0 + nv. */
static inline __attribute__((always_inline)) void ac_dw_px(
        const struct ac_dw *a, const float *xb, long iy0, long k0, long k1, long ix0,
        long j0, long j1, long c0, long nv, int np_, float *y, const float *z) {
    float acc[4][AC_V];
    const long c = a->c, step = a->sw * c;
    for (int p = 0; p < np_; p++)
        for (long j = 0; j < nv; j++) acc[p][j] = a->b[c0 + j];
    for (long u = k0; u < k1; u++) {
        const float *xr = xb + (iy0 + u * a->dh) * a->wi * c + c0;
        const float *wr = a->w + u * a->kw * c + c0;
        for (long t = j0; t < j1; t++) {
            const float *xp = xr + (ix0 + t * a->dw) * c, *wp = wr + t * c;
            for (int p = 0; p < np_; p++)
                for (long j = 0; j < nv; j++)
                    acc[p][j] = fmaf(xp[p * step + j], wp[j], acc[p][j]);
        }
    }
    ac_dw_out(a, acc, np_, nv, y + c0, z ? z + c0 : 0);
}

/* Channels c0 to c0 + nv (at most 64) of np_ pixels, AC_V at a time. */
static inline __attribute__((always_inline)) void ac_dw_blk(
        const struct ac_dw *a, const float *xb, long iy0, long k0, long k1, long ix0,
        long j0, long j1, long c0, long nv, int np_, int k3s, float *y, const float *z) {
    (void)k3s;
    for (long d = 0; d < nv; d += AC_V)
        ac_dw_px(a, xb, iy0, k0, k1, ix0, j0, j1, c0 + d, nv - d < AC_V ? nv - d : AC_V, np_,
                 y, z);
}

#endif

/* The taps [lo, hi) of a window starting at i0 (step d) that fall inside [0, n). */
static void ac_dw_range(long i0, long d, long k, long n, long *lo, long *hi) {
    long a = 0, b = k;
    while (a < b && i0 + a * d < 0) a++;
    while (b > a && i0 + (b - 1) * d >= n) b--;
    *lo = a; *hi = b;
}

/* Channels c0 to c0 + nv of output row r (batch item r / oh, row r % oh): four pixels at
   a time away from the left and right pads, else one. */
static void ac_dw_row(const struct ac_dw *a, long r, long c0, long nv) {
    const long c = a->c, bi = r / a->oh, oy = r % a->oh;
    const float *xb = a->x + bi * a->h * a->wi * c;
    float *y = a->y + r * a->ow * c;
    const float *z = a->z ? a->z + r * a->ow * c : 0;
    const long iy0 = oy * a->sh - a->ph, span = (a->kw - 1) * a->dw;
    long k0, k1;
    ac_dw_range(iy0, a->dh, a->kh, a->h, &k0, &k1);
    for (long ox = 0; ox < a->ow;) {
        const long ix0 = ox * a->sw - a->pw;
        const float *zp = z ? z + ox * c : 0;
        if (ox + 4 <= a->ow && ix0 >= 0 && ix0 + 3 * a->sw + span < a->wi) {
            const int k3 = a->kw == 3 && a->dw == 1;
            if (k3 && a->sw == 1)
                ac_dw_blk(a, xb, iy0, k0, k1, ix0, 0, 3, c0, nv, 4, 1, y + ox * c, zp);
            else if (k3 && a->sw == 2)
                ac_dw_blk(a, xb, iy0, k0, k1, ix0, 0, 3, c0, nv, 4, 2, y + ox * c, zp);
            else
                ac_dw_blk(a, xb, iy0, k0, k1, ix0, 0, a->kw, c0, nv, 4, 0, y + ox * c, zp);
            ox += 4;
            continue;
        }
        long j0, j1;
        ac_dw_range(ix0, a->dw, a->kw, a->wi, &j0, &j1);
        ac_dw_blk(a, xb, iy0, k0, k1, ix0, j0, j1, c0, nv, 1, 0, y + ox * c, zp);
        ox += 1;
    }
}

/* Rows [i * rows, (i + 1) * rows), AC_CB channels at a time along each row. */
static void ac_dw_block(void *p, long i) {
    const struct ac_dw *a = (const struct ac_dw *)p;
    const long end = (i + 1) * a->rows < a->total ? (i + 1) * a->rows : a->total;
    for (long r = i * a->rows; r < end; r++)
        for (long c0 = 0; c0 < a->c; c0 += AC_CB)
            ac_dw_row(a, r, c0, a->c - c0 < AC_CB ? a->c - c0 : AC_CB);
}

void ac_dwconv(const float *x, const float *w, const float *b, const float *z, float *y,
               const long *g, int act, float p0, float p1, int nthreads, uintptr_t pool) {
    /* g: n, c, h, wi, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw */
    const long total = g[0] * g[4];
    long rows = total; /* on the pool: about four blocks a thread, so a late thread takes fewer */
    if (nthreads > 1 && pool) rows = total / (4 * (long)nthreads);
    if (rows < 1) rows = 1;
    struct ac_dw a = {x, w, b, z, y, g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9],
                      g[10], g[11], g[12], g[13], rows, total, act, p0, p1};
    const long blocks = (total + rows - 1) / rows;
    if (blocks > 1) ((ac_pool_fn)pool)(ac_dw_block, &a, blocks, nthreads);
    else ac_dw_block(&a, 0);
}
"""
_CDEF = """int ac_dw_simd(void);
void ac_dwconv(const float *x, const float *w, const float *b, const float *z, float *y,
    const long *g, int act, float p0, float p1, int nthreads, uintptr_t pool)"""

#: Largest kernel side run here (7x7 and under were tested; larger ones stay on oneDNN).
MAX_KERNEL = 7
#: Multiply-adds from which the rows go to the pool's threads (a 512x14x14 3x3 is 0.9M).
PARALLEL_FMAS = 1 << 18
#: Where this kernel runs, from in-session times (one process, oneDNN and this alternated, one
#: thread, us oneDNN / this): under ``MIN_CHANNELS`` channels it stays on oneDNN (32@112 s1
#: 219 / 241), and at stride 1 only for outputs ``MIN_WIDTH`` to ``MAX_WIDTH`` wide (512@14
#: 93-104 / 85-94; 1024@7 79 / 88, 256@28 147 / 160, 128@56 185 / 243). Every stride-2 shape
#: measured gained (64@112 206 / 172, 128@56 131 / 115, 256@28 97 / 82, 512@14 80 / 62).
MIN_CHANNELS, MIN_WIDTH, MAX_WIDTH = 64, 8, 16
#: Calls that ran the C kernel (tests read it).
RUNS = {"dwconv": 0}
_RELU, _CLIP = 32, 46  # oneDNN's eltwise_relu and eltwise_clip (onednn/_lib.C)
_F32 = np.dtype(np.float32)

_lib, _forget = loader(SOURCE_DECL + _SOURCE, _CDEF, "ac_dwconv")
#: The same source with its portable loops only (no AVX-512 intrinsics), for ``PORTABLE``.
_portable, _forget_portable = loader(
    "#define AC_DW_PORTABLE 1\n" + SOURCE_DECL + _SOURCE, _CDEF, "ac_dwconv"
)
#: Run the portable loops, on any CPU (tests: they are what a CPU without AVX-512 would run;
#: in use such CPUs stay on oneDNN, the portable loops never measured faster).
PORTABLE = False


def forget() -> None:
    """Look for the compiler again on the next call."""
    _forget()
    _forget_portable()


def _activation(act: tuple[int, float, float] | None) -> tuple[int, float, float] | None:
    """The kernel's (kind, p0, p1) for oneDNN's (alg, alpha, beta), or None (not here)."""
    if act is None:
        return 0, 0.0, 0.0
    alg, alpha, beta = act
    if alg == _RELU:
        return (1, 0.0, 0.0) if alpha == 0.0 else (2, float(alpha), 0.0)
    if alg == _CLIP:
        return 3, float(alpha), float(beta)
    return None


def switched_off() -> bool:
    """Whether ``ANYCHIP_DWCONV=0`` turns this path off (read on every call)."""
    return os.environ.get("ANYCHIP_DWCONV") == "0"


def applies(x: np.ndarray, w: np.ndarray, group: int) -> bool:
    """Whether ``depthwise`` may run this convolution: float32 4-D, ``group == C == M``,
    a channels-last ``x``, a kernel of at most ``MAX_KERNEL`` a side, the switch on."""
    if x.ndim != 4 or w.ndim != 4 or x.dtype is not _F32 or w.dtype is not _F32:
        return False
    c = x.shape[1]
    if group != c or w.shape[:2] != (c, 1) or c < 2 or max(w.shape[2:]) > MAX_KERNEL:
        return False
    if switched_off():
        return False
    return x.transpose(0, 2, 3, 1).flags.c_contiguous


_PREP: dict[tuple, tuple] = {}


def _nhwc(shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """The NHWC storage shape of an NCHW shape."""
    return shape[0], shape[2], shape[3], shape[1]


def _prepared(x_shape: tuple, w: np.ndarray, b: np.ndarray | None, geo: tuple) -> tuple:
    """(the geometry as a ``long[]``, the weights as [KH * KW, C], the bias or zeros) of a node,
    as the kernel takes them, made
    once: a session calls with the same initializers every run (their Python cost is paid
    with cold caches there). The entry holds ``w`` and ``b``, so their ids stay theirs."""
    key = (x_shape, id(w), id(b), geo)
    hit = _PREP.get(key)
    if hit is not None and hit[0] is w and hit[1] is b:
        return hit[2:]
    y_shape, _, (kh, kw), (strides, dil, begin, _end) = geo
    n, c, h, wi = x_shape
    wt = np.ascontiguousarray(w.reshape(c, kh * kw).T)
    bias = np.zeros(c, np.float32) if b is None else np.ascontiguousarray(b, np.float32)
    ffi, _, f32 = _lib()
    g = ffi.new("long[]", [n, c, h, wi, *y_shape[2:], kh, kw, *strides, *begin, *dil])
    if len(_PREP) >= 256:
        _PREP.clear()
    _PREP[key] = (w, b, g, ffi.from_buffer(f32, wt), ffi.from_buffer(f32, bias))
    return _PREP[key][2:]


def depthwise(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    act: tuple[int, float, float] | None,
    geo: tuple,
    channels_last: bool,
    out: np.ndarray | None = None,
    team: int = 0,
) -> np.ndarray | None:
    """``act(conv(x, w) + b + z)`` for a depthwise ``x`` that ``applies``; ``geo`` is
    ``onednn/conv._geometry``'s. Returns the NCHW view of a new channels-last buffer with
    ``channels_last``, else a C-contiguous array (``out`` when it fits); None where this path
    does not run (module docstring). ``team``: the threads given (a caller that left oneDNN on
    one OpenMP thread for a small convolution, ``_lib.team_for``, passes the threads it was
    given; 0: ``omp.max_threads()``)."""
    kind = _activation(act)  # the caller checked applies(x, w, group)
    if kind is None:
        return None
    if z is not None and (z.dtype is not _F32 or not z.transpose(0, 2, 3, 1).flags.c_contiguous):
        return None
    lib = _portable() if PORTABLE else _lib()
    if lib is None or not (PORTABLE or lib[1].ac_dw_simd()):
        return None  # no compiler, or no AVX-512: the portable loops were not measured faster
    y_shape, _, (kh, kw), (strides, dil, begin, _end) = geo
    c, ow = x.shape[1], y_shape[3]
    if c < MIN_CHANNELS or strides == (1, 1) and not MIN_WIDTH <= ow <= MAX_WIDTH:
        return None
    g, wp, bp = _prepared(x.shape, w, b, geo)
    buf = _replay.empty(
        _nhwc(y_shape)
    )  # np.empty, or the recorder's (backends/cpu/replay/record.py)
    threads = 1
    if buf.size * kh * kw >= PARALLEL_FMAS and pool.try_parallel():
        threads = team or omp.max_threads()
    ffi, lc, f32 = lib
    fb = ffi.from_buffer
    zp = ffi.NULL if z is None else fb(f32, z.transpose(0, 2, 3, 1))
    args = (
        fb(f32, x.transpose(0, 2, 3, 1)), wp, bp, zp,
        fb(f32, buf, require_writable=True), g,
        kind[0], kind[1], kind[2], threads, pool.address() if threads > 1 else 0,
    )  # fmt: skip
    lc.ac_dwconv(*args)
    RUNS["dwconv"] += 1
    y = buf.transpose(0, 3, 1, 2)
    if _replay.ACTIVE:
        _replay.note(lc.ac_dwconv, args)
    if channels_last:
        if _replay.ACTIVE:  # the one call: all it did
            _replay.seal()
        return y
    fit = out is not None and out.shape == y_shape and out.dtype is _F32
    res = out if fit and out.flags.c_contiguous else np.empty(y_shape, np.float32)
    if not to_planar(y, res):
        np.copyto(res, y)
    return res
