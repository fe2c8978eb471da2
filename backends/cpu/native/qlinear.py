"""8-bit products and their requantization in one C call: ``QLinearMatMul``, ``QGemm``,
``MatMulInteger`` and ``DequantMatMul`` (the QDQ fusion), and the element-wise quantized ops
around them (``QuantizeLinear``, ``DequantizeLinear``, ``DynamicQuantizeLinear``,
``QLinearAdd``, ``QLinearMul``), per tensor, from generated C (``codegen/build.py``).

Why: the quantized models people run are small (a 16 x 32 MLP), where numpy's path spent
about 50 us per product on scalar arithmetic of scales and zero points, and oneDNN's int8
primitive about as much in its fixed cost (decision 053 has the figures). Here a product
``(A - za) @ (B - zb)`` is summed exactly in 32-bit integers (wrapping modulo 2**32 where the
true sum leaves int32, as ONNX allows) from weights centered once per node into int16
(``centered``), and each row's sums are requantized while still in cache.

Numerics are those of the numpy kernels they replace, operation for operation (IEEE float32
or float64 as noted per mode, ``-ffp-contract=off``, ``nearbyint`` in the default rounding
mode: half to even), so a C call and the numpy path give the same bits; the tests check that.

Modes of ``ac_qmm`` (``acc`` the exact integer sum, ``c`` an int32 bias per column):

* 0, int32: ``acc`` (``MatMulInteger``);
* 1, float32: ``f32(acc + c) * f32(smul * scale[j]) (+ bias[j])`` (``QGemm`` without
  ``y_scale``, ``DequantMatMul``: ``smul`` 1, which changes no bit; the dynamic product of
  ``DynamicQuantMatMul``: ``smul`` the activations' scale);
* 2, 8-bit through float32: ``clip(rint(f32(acc + c) * scale[j] / ys) + yzp)`` (``QGemm``);
* 3, 8-bit through float64: ``clip(rint(f64(acc) * f64(scale[j]) / ys) + yzp)``
  (``QLinearMatMul``).

Every function returns None where it does not apply (no compiler, ``ANYCHIP_NATIVE=0``,
other dtypes or forms) and the caller keeps its numpy path.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.codegen.build import loader

__all__ = [
    "available",
    "centered",
    "Product",
    "quantize",
    "dequantize",
    "dynamic_quantize",
    "qbinary",
    "MAX_K",
]

#: The longest reduction summed here: beyond it a product belongs to oneDNN anyway, and
#: four int16 products summed before the wrapping add stay far inside int32.
MAX_K = 1 << 16

_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
#include <math.h>

static inline int32_t ac_ld(const uint8_t *a, long i, int sgn) {
    return sgn ? (int32_t)(int8_t)a[i] : (int32_t)a[i];
}

static inline double ac_clamp(double q, double lo, double hi) {
    return q < lo ? lo : (q > hi ? hi : q);
}

/* The weights' packed layout: blocks of AC_W columns; in each, for every pair of rows
   (2q, 2q + 1), AC_W pairs (b[2q, j], b[2q + 1, j]); zeros past k and n. One vpmaddwd then
   sums two products for AC_W columns: exact, (a - za) and (b - zb) being within +-255. */
#if defined(__AVX512BW__)
#include <immintrin.h>
#define AC_W 16
#elif defined(__AVX2__)
#include <immintrin.h>
#define AC_W 8
#else
#define AC_W 8
#endif

long ac_qpack_size(long k, long n) {
    return ((n + AC_W - 1) / AC_W) * ((k + 1) / 2) * AC_W * 2;
}

void ac_qpack(long k, long n, const int16_t *bc, int16_t *p) {
    const long kp = (k + 1) / 2, nb = (n + AC_W - 1) / AC_W;
    for (long jb = 0; jb < nb; jb++)
        for (long q = 0; q < kp; q++)
            for (long jj = 0; jj < AC_W; jj++)
                for (long t = 0; t < 2; t++) {
                    const long r = 2 * q + t, j = jb * AC_W + jj;
                    p[((jb * kp + q) * AC_W + jj) * 2 + t] = r < k && j < n ? bc[r * n + j] : 0;
                }
}

/* acc[0:n] = sum_t (a[t] - za) * (b - zb)[t, 0:n], wrapping modulo 2**32; ap: (k + 1) / 2
   scratch values, acc rounded up to whole blocks. */
static void ac_q_row(const uint8_t *a, int sgn, int32_t za, long k, long n,
                     const int16_t *p, int32_t *ap, uint32_t *acc) {
    const long kp = (k + 1) / 2, nb = (n + AC_W - 1) / AC_W, step = kp * AC_W * 2;
    for (long q = 0; q < kp; q++) {
        const int32_t v0 = ac_ld(a, 2 * q, sgn) - za;
        const int32_t v1 = 2 * q + 1 < k ? ac_ld(a, 2 * q + 1, sgn) - za : 0;
        const uint32_t lo16 = (uint16_t)(int16_t)v0, hi16 = (uint16_t)(int16_t)v1;
        ap[q] = (int32_t)(lo16 | hi16 << 16);
    }
    long jb = 0;
#if defined(__AVX512BW__)
    for (; jb + 4 <= nb; jb += 4) {
        const int16_t *p0 = p + jb * step;
        __m512i c0 = _mm512_setzero_si512(), c1 = c0, c2 = c0, c3 = c0;
        for (long q = 0; q < kp; q++) {
            const __m512i va = _mm512_set1_epi32(ap[q]);
            const int16_t *b = p0 + q * 32;
            c0 = _mm512_add_epi32(c0, _mm512_madd_epi16(_mm512_loadu_si512(b), va));
            c1 = _mm512_add_epi32(c1, _mm512_madd_epi16(_mm512_loadu_si512(b + step), va));
            c2 = _mm512_add_epi32(c2, _mm512_madd_epi16(_mm512_loadu_si512(b + 2 * step), va));
            c3 = _mm512_add_epi32(c3, _mm512_madd_epi16(_mm512_loadu_si512(b + 3 * step), va));
        }
        _mm512_storeu_si512(acc + jb * 16, c0);
        _mm512_storeu_si512(acc + jb * 16 + 16, c1);
        _mm512_storeu_si512(acc + jb * 16 + 32, c2);
        _mm512_storeu_si512(acc + jb * 16 + 48, c3);
    }
    for (; jb < nb; jb++) {
        const int16_t *p0 = p + jb * step;
        __m512i c0 = _mm512_setzero_si512();
        for (long q = 0; q < kp; q++)
            c0 = _mm512_add_epi32(
                c0, _mm512_madd_epi16(_mm512_loadu_si512(p0 + q * 32), _mm512_set1_epi32(ap[q])));
        _mm512_storeu_si512(acc + jb * 16, c0);
    }
#elif defined(__AVX2__)
    for (; jb + 4 <= nb; jb += 4) {
        const int16_t *p0 = p + jb * step;
        __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0;
        for (long q = 0; q < kp; q++) {
            const __m256i va = _mm256_set1_epi32(ap[q]);
            const int16_t *b = p0 + q * 16;
            const __m256i b0 = _mm256_loadu_si256((const __m256i *)b);
            const __m256i b1 = _mm256_loadu_si256((const __m256i *)(b + step));
            const __m256i b2 = _mm256_loadu_si256((const __m256i *)(b + 2 * step));
            const __m256i b3 = _mm256_loadu_si256((const __m256i *)(b + 3 * step));
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(b0, va));
            c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(b1, va));
            c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(b2, va));
            c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(b3, va));
        }
        _mm256_storeu_si256((__m256i *)(acc + jb * 8), c0);
        _mm256_storeu_si256((__m256i *)(acc + jb * 8 + 8), c1);
        _mm256_storeu_si256((__m256i *)(acc + jb * 8 + 16), c2);
        _mm256_storeu_si256((__m256i *)(acc + jb * 8 + 24), c3);
    }
    for (; jb < nb; jb++) {
        const int16_t *p0 = p + jb * step;
        __m256i c0 = _mm256_setzero_si256();
        for (long q = 0; q < kp; q++)
            c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(
                _mm256_loadu_si256((const __m256i *)(p0 + q * 16)), _mm256_set1_epi32(ap[q])));
        _mm256_storeu_si256((__m256i *)(acc + jb * 8), c0);
    }
#endif
    for (; jb < nb; jb++) {
        const int16_t *p0 = p + jb * step;
        uint32_t *c = acc + jb * AC_W;
        for (long jj = 0; jj < AC_W; jj++) c[jj] = 0;
        for (long q = 0; q < kp; q++) {
            const int32_t lo = (int16_t)(ap[q] & 0xffff), hi = (int16_t)((uint32_t)ap[q] >> 16);
            const int16_t *b = p0 + q * AC_W * 2;
            for (long jj = 0; jj < AC_W; jj++)
                c[jj] += (uint32_t)(b[2 * jj] * lo + b[2 * jj + 1] * hi);
        }
    }
}

/* The second step of modes 2 and 3 with a bias: the 8-bit code q dequantized
   (p2: scale, zero point), plus the bias, quantized again (p2: scale, zero point, range). */
static inline float ac_then_add(float q, float bias, const float *p2) {
    const float w = (q - p2[1]) * p2[0] + bias;
    const float q2 = nearbyintf(w / p2[2]) + p2[3];
    return q2 < p2[4] ? p2[4] : (q2 > p2[5] ? p2[5] : q2);
}

static inline float ac_clampf(float q, float lo, float hi) {
    return q < lo ? lo : (q > hi ? hi : q);
}

/* One row's epilogue (module docstring), in loops without branches inside so that gcc
   vectorizes them; q: n floats of scratch. */
static void ac_epilogue(long n, const uint32_t *r, const int32_t *c, int mode,
                        const float *scale, int cols, const float *bias, double ys, double yzp,
                        double lo, double hi, const float *bias2, const float *p2, float smul,
                        float *q, void *out) {
    if (mode == 0) {
        int32_t *y = (int32_t *)out;
        if (c) for (long j = 0; j < n; j++) y[j] = (int32_t)(r[j] + (uint32_t)c[j]);
        else for (long j = 0; j < n; j++) y[j] = (int32_t)r[j];
        return;
    }
    if (mode == 3) {
        if (cols) {
            for (long j = 0; j < n; j++) {
                const double v = (double)(int32_t)r[j] * (double)scale[j];
                q[j] = (float)ac_clamp(nearbyint(v / ys) + yzp, lo, hi);
            }
        } else {
            const double s0 = (double)scale[0];
            for (long j = 0; j < n; j++) {
                const double v = (double)(int32_t)r[j] * s0;
                q[j] = (float)ac_clamp(nearbyint(v / ys) + yzp, lo, hi);
            }
        }
    } else {
        if (c) for (long j = 0; j < n; j++) q[j] = (float)(int32_t)(r[j] + (uint32_t)c[j]);
        else for (long j = 0; j < n; j++) q[j] = (float)(int32_t)r[j];
        if (cols) {
            for (long j = 0; j < n; j++) q[j] = q[j] * (smul * scale[j]);
        } else {
            const float s0 = smul * scale[0];
            for (long j = 0; j < n; j++) q[j] = q[j] * s0;
        }
        if (mode == 1) {
            float *y = (float *)out;
            if (bias) for (long j = 0; j < n; j++) y[j] = q[j] + bias[j];
            else for (long j = 0; j < n; j++) y[j] = q[j];
            return;
        }
        const float fys = (float)ys, fzp = (float)yzp, flo = (float)lo, fhi = (float)hi;
        for (long j = 0; j < n; j++) q[j] = ac_clampf(nearbyintf(q[j] / fys) + fzp, flo, fhi);
    }
    if (bias2) for (long j = 0; j < n; j++) q[j] = ac_then_add(q[j], bias2[j], p2);
    uint8_t *y = (uint8_t *)out;
    for (long j = 0; j < n; j++) y[j] = (uint8_t)(int32_t)q[j];
}

int ac_qmm(long m, long k, long n, const uint8_t *a, int a_sgn, const int32_t *za_rows,
           int32_t za, const int16_t *bp, const int32_t *raw, const int32_t *c,
           int mode, const float *scale, int scale_cols, const float *bias, double ys,
           double yzp, double lo, double hi, const float *bias2, const float *p2, float smul,
           void *out) {
    const long width = ((n + AC_W - 1) / AC_W) * AC_W;
    uint32_t *acc = (uint32_t *)malloc(sizeof(uint32_t) * width);
    float *q = (float *)malloc(sizeof(float) * width);
    int32_t *ap = (int32_t *)malloc(sizeof(int32_t) * ((k + 1) / 2 + 1));
    if (!acc || !ap || !q) {
        free(acc);
        free(ap);
        free(q);
        return -1;
    }
    const long size = mode == 0 ? 4 : (mode == 1 ? 4 : 1);
    for (long i = 0; i < m; i++) {
        const uint32_t *r;
        if (raw) {
            r = (const uint32_t *)(raw + i * n);
        } else {
            ac_q_row(a + i * k, a_sgn, za_rows ? za_rows[i] : za, k, n, bp, ap, acc);
            r = acc;
        }
        ac_epilogue(n, r, c, mode, scale, scale_cols, bias, ys, yzp, lo, hi, bias2, p2, smul,
                    q, (char *)out + i * n * size);
    }
    free(acc);
    free(ap);
    free(q);
    return 0;
}

/* QuantizeLinear per tensor, float32: clip(rint(x / s) + zp). NaN gives -1 (numpy's path). */
int ac_quant(long count, const float *x, float s, float zp, float lo, float hi, uint8_t *y) {
    int bad = 0;
    for (long i = 0; i < count; i++) {
        float q = nearbyintf(x[i] / s) + zp;
        bad |= q != q;
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = (uint8_t)(int32_t)q;
    }
    return bad ? -1 : 0;
}

/* DequantizeLinear per tensor to float32: (x - zp) * s. */
void ac_dequant(long count, const uint8_t *x, int sgn, float zp, float s, float *y) {
    for (long i = 0; i < count; i++) y[i] = ((float)ac_ld(x, i, sgn) - zp) * s;
}

/* DynamicQuantizeLinear: range, scale and zero point in float32 as the spec's formula; -1
   where the input holds a NaN (numpy's path says what happens then). */
int ac_dynq(long count, const float *x, uint8_t *y, float *scale, uint8_t *zp) {
    float lo = 0.0f, hi = 0.0f;
    int bad = 0;
    for (long i = 0; i < count; i++) {
        const float v = x[i];
        bad |= v != v;
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
    }
    if (bad) return -1;
    const float s = (hi - lo) / 255.0f;
    *scale = s;
    if (s == 0.0f) {
        *zp = 0;
        for (long i = 0; i < count; i++) y[i] = 0;
        return 0;
    }
    float z = 0.0f - lo / s;
    z = nearbyintf(z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z));
    *zp = (uint8_t)(int32_t)z;
    for (long i = 0; i < count; i++) {
        float q = nearbyintf(x[i] / s) + z;
        q = q < 0.0f ? 0.0f : (q > 255.0f ? 255.0f : q);
        y[i] = (uint8_t)(int32_t)q;
    }
    return 0;
}

/* QLinearAdd (op 0) / QLinearMul (op 1): b repeats every nb elements of a (nb divides n). */
void ac_qbin(int op, long n, const uint8_t *a, int a_sgn, float sa, float za, long nb,
             const uint8_t *b, int b_sgn, float sb, float zb, float sc, float zc, float lo,
             float hi, uint8_t *y) {
    for (long i = 0; i < n; i++) {
        const float u = ((float)ac_ld(a, i, a_sgn) - za) * sa;
        const float v = ((float)ac_ld(b, i % nb, b_sgn) - zb) * sb;
        float q = nearbyintf((op ? u * v : u + v) / sc) + zc;
        q = q < lo ? lo : (q > hi ? hi : q);
        y[i] = (uint8_t)(int32_t)q;
    }
}
"""
_CDEF = """
long ac_qpack_size(long k, long n);
void ac_qpack(long k, long n, const int16_t *bc, int16_t *p);
int ac_qmm(long m, long k, long n, const uint8_t *a, int a_sgn, const int32_t *za_rows,
    int32_t za, const int16_t *bp, const int32_t *raw, const int32_t *c, int mode,
    const float *scale, int scale_cols, const float *bias, double ys, double yzp, double lo,
    double hi, const float *bias2, const float *p2, float smul, void *out);
int ac_quant(long count, const float *x, float s, float zp, float lo, float hi, uint8_t *y);
void ac_dequant(long count, const uint8_t *x, int sgn, float zp, float s, float *y);
int ac_dynq(long count, const float *x, uint8_t *y, float *scale, uint8_t *zp);
void ac_qbin(int op, long n, const uint8_t *a, int a_sgn, float sa, float za, long nb,
    const uint8_t *b, int b_sgn, float sb, float zb, float sc, float zc, float lo, float hi,
    uint8_t *y);
"""
_lib, forget = loader(_SOURCE, _CDEF, "ac_qmm")
_U8, _S8 = np.dtype(np.uint8), np.dtype(np.int8)
_F32, _I32 = np.dtype(np.float32), np.dtype(np.int32)
_RANGE = {_U8: (0.0, 255.0), _S8: (-128.0, 127.0)}


_ENV_DATA = getattr(os.environ, "_data", None)
_NATIVE = os.environ.encodekey("ANYCHIP_NATIVE") if _ENV_DATA is not None else None
_OFF = os.environ.encodevalue("0") if _ENV_DATA is not None else None


def _get() -> Any | None:
    # from the environment mapping's own dict: os.environ.get costs 0.75 us (codegen/build.py)
    off = (
        _ENV_DATA.get(_NATIVE) == _OFF
        if _ENV_DATA is not None
        else (os.environ.get("ANYCHIP_NATIVE") == "0")
    )
    return None if off else _lib()


def available() -> bool:
    """Whether the C here is built (a compiler, ``ANYCHIP_NATIVE`` not 0)."""
    return _get() is not None


def _is8(a: np.ndarray) -> bool:
    return a.dtype in _RANGE


def _ptr(ffi: Any, a: np.ndarray, kind: str = "uint8_t[]", write: bool = False) -> Any:
    return ffi.from_buffer(kind, a, require_writable=write)


def centered(b: np.ndarray, zb: np.ndarray | None, trans_b: bool = False) -> np.ndarray | None:
    """``b - zb`` (``b.T - zb`` with ``trans_b``) as C-contiguous int16 ``[K, N]``, ``zb``
    common or per column; None for other forms (8-bit 2-D ``b`` only)."""
    if not _is8(b) or b.ndim != 2:
        return None
    w = (b.T if trans_b else b).astype(np.int16)
    n = w.shape[1]
    if zb is not None:
        z = np.asarray(zb)
        if z.dtype.kind not in "iu" or z.size not in (1, n):
            return None
        w -= z.astype(np.int16).reshape(1, -1) if z.size == n else z.astype(np.int16).reshape(())
    return np.ascontiguousarray(w)


class Product:
    """The product of 8-bit ``a [..., M, K]`` by centered weights ``bc [K, N]``
    (``centered``), or by a given exact int32 product ``raw [M', N]`` (oneDNN's, for large
    sizes), with the epilogue of ``mode`` (module docstring): ``scale`` float32 ``[N]`` or
    one value, ``c`` int32 ``[N]``, ``bias`` float32 ``[N]``, 8-bit results of ``out_dtype``.
    ``then_add`` (modes 2 and 3): ``(bias2, ds, dz, s2, z2)``: each 8-bit result ``q``
    dequantized, ``(q - dz) * ds``, plus ``bias2`` float32 ``[N]``, quantized again,
    ``clip(rint(w / s2) + z2)`` to ``z2``'s type, all in float32 (``QLinearAdd`` after
    ``QLinearMatMul``; QDQ's ``DequantizeLinear``, ``Add``, ``QuantizeLinear``).

    Made once per node while its constants stay the same (kernels keep it), so a call
    converts nothing but ``a`` and its zero point: about 2 us of Python around the C.
    """

    __slots__ = ("n", "k", "mode", "dtype", "keep", "args", "lib")

    def __init__(
        self,
        bc: np.ndarray | None,
        n: int,
        mode: int,
        *,
        scale: np.ndarray | float | None = None,
        c: np.ndarray | None = None,
        bias: np.ndarray | None = None,
        ys: float = 1.0,
        yzp: np.ndarray | None = None,
        out_dtype: np.dtype | None = None,
        then_add: tuple | None = None,
    ) -> None:
        self.lib = lib = _get()
        self.n, self.mode, self.k = n, mode, -1 if bc is None else bc.shape[0]
        self.dtype = {0: _I32, 1: _F32}.get(mode, np.dtype(out_dtype or _U8))
        sc = np.ones(1, _F32) if scale is None else np.ascontiguousarray(scale, _F32).reshape(-1)
        if bias is not None:
            bias = np.ascontiguousarray(bias, _F32).reshape(-1)
        if c is not None:
            c = np.ascontiguousarray(c, _I32).reshape(-1)
        ok = lib is not None and sc.size in (1, n) and self.dtype in (_I32, _F32, *_RANGE)
        ok = ok and (c is None or c.size == n) and (bias is None or bias.size == n)
        ok = ok and (bc is None or (bc.dtype == np.int16 and bc.shape[1] == n))
        bias2, p2 = None, None
        if then_add is not None and ok:
            bias2 = np.ascontiguousarray(then_add[0], _F32).reshape(-1)
            z2 = np.asarray(then_add[4])
            ok = mode in (2, 3) and bias2.size == n and z2.dtype in _RANGE and z2.size == 1
            if ok:
                ds, dz, s2 = (float(np.asarray(v).item()) for v in then_add[1:4])
                p2 = np.array([ds, dz, s2, float(z2.item()), *_RANGE[z2.dtype]], _F32)
        if not ok:
            self.lib = None
            return
        ffi, c_lib, _ = lib
        packed = None
        if bc is not None:  # the C's packed layout (ac_qpack)
            packed = np.zeros(max(1, c_lib.ac_qpack_size(bc.shape[0], n)), np.int16)
            bc = np.ascontiguousarray(bc)
            dst = _ptr(ffi, packed, "int16_t[]", True)
            c_lib.ac_qpack(bc.shape[0], n, _ptr(ffi, bc, "int16_t[]"), dst)
        self.keep = (packed, sc, c, bias, bias2, p2)  # what the pointers below point into
        lo, hi = _RANGE.get(self.dtype, (0.0, 0.0))
        if then_add is not None:
            self.dtype = np.asarray(then_add[4]).dtype
        z = 0.0 if yzp is None else float(np.asarray(yzp).item())
        self.args = (
            ffi.NULL if packed is None else _ptr(ffi, packed, "int16_t[]"),
            ffi.NULL if c is None else _ptr(ffi, c, "int32_t[]"),
            _ptr(ffi, sc, "float[]"), int(sc.size > 1),
            ffi.NULL if bias is None else _ptr(ffi, bias, "float[]"), float(ys), z, lo, hi,
            ffi.NULL if bias2 is None else _ptr(ffi, bias2, "float[]"),
            ffi.NULL if p2 is None else _ptr(ffi, p2, "float[]"),
        )  # fmt: skip

    def __call__(
        self,
        a: np.ndarray,
        za: np.ndarray | None,
        raw: np.ndarray | None = None,
        smul: float = 1.0,
    ) -> np.ndarray | None:
        """The result for ``a`` (zero point ``za``: one value or one per row), or None;
        mode 1 scales by ``f32(smul * scale[j])`` (a dynamic scale times the weights')."""
        lib = self.lib
        if lib is None or a.dtype not in _RANGE or a.ndim < 2:
            return None
        k, n = a.shape[-1], self.n
        m = a.size // k if k else 0
        if m == 0 or k == 0 or (raw is None and (k != self.k or k > MAX_K)):
            return None
        if raw is not None and (raw.dtype != _I32 or raw.shape[-1] != n or raw.size != m * n):
            return None
        ffi, c_lib, _ = lib
        rows, z = ffi.NULL, 0
        if za is not None:
            if za.size == 1:
                z = int(za.item())
            elif za.size == m and za.dtype.kind in "iu":
                rows = _ptr(ffi, np.ascontiguousarray(za, _I32), "int32_t[]")
            else:
                return None
        bc, c, sc, cols, bias, ys, yzp, lo, hi, bias2, p2 = self.args
        out = np.empty(a.shape[:-1] + (n,), self.dtype)
        done = c_lib.ac_qmm(
            m, k, n, _ptr(ffi, np.ascontiguousarray(a)), int(a.dtype == _S8), rows, z,
            bc if raw is None else ffi.NULL,
            ffi.NULL if raw is None else _ptr(ffi, np.ascontiguousarray(raw), "int32_t[]"),
            c, self.mode, sc, cols, bias, ys, yzp, lo, hi, bias2, p2, smul,
            _ptr(ffi, out, write=True),
        )  # fmt: skip
        return None if done < 0 else out


def _value(v: np.ndarray | None) -> float:
    """A scale or zero point of one value as a Python float (0 for none)."""
    return 0.0 if v is None else float(v.item())


def _per_tensor(*params: np.ndarray | None) -> bool:
    return all(p is None or (isinstance(p, np.ndarray) and p.size == 1) for p in params)


def quantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """``QuantizeLinear`` of float32 ``x`` per tensor (one float32 scale, an 8-bit zero point
    or none: uint8); None elsewhere or where ``x`` holds a NaN."""
    lib = _get()
    if lib is None or x.dtype != _F32 or not _per_tensor(s, zp) or s.dtype != _F32:
        return None
    dt = _U8 if zp is None else zp.dtype
    if dt not in _RANGE:
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    out = np.empty(x.shape, dt)
    lo, hi = _RANGE[dt]
    done = c_lib.ac_quant(
        xc.size, _ptr(ffi, xc, "float[]"), _value(s), _value(zp), lo, hi,
        _ptr(ffi, out, write=True),
    )  # fmt: skip
    return None if done else out


def dequantize(x: np.ndarray, s: np.ndarray, zp: np.ndarray | None) -> np.ndarray | None:
    """``DequantizeLinear`` of 8-bit ``x`` per tensor to float32; None for other forms."""
    lib = _get()
    if lib is None or x.dtype not in _RANGE or not _per_tensor(s, zp) or s.dtype != _F32:
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    out = np.empty(x.shape, _F32)
    y = _ptr(ffi, out, "float[]", True)
    c_lib.ac_dequant(xc.size, _ptr(ffi, xc), int(x.dtype == _S8), _value(zp), _value(s), y)
    return out


def dynamic_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``DynamicQuantizeLinear`` of float32 ``x``; None elsewhere or where ``x`` holds a NaN."""
    lib = _get()
    if lib is None or x.dtype != _F32:
        return None
    ffi, c_lib, _ = lib
    xc = np.ascontiguousarray(x)
    y = np.empty(x.shape, _U8)
    scale, zp = np.zeros((), _F32), np.zeros((), _U8)
    done = c_lib.ac_dynq(
        xc.size, _ptr(ffi, xc, "float[]"), _ptr(ffi, y, write=True),
        _ptr(ffi, scale, "float[]", True), _ptr(ffi, zp, write=True),
    )  # fmt: skip
    return None if done else (y, scale, zp)


def qbinary(
    op: int,
    a: np.ndarray,
    sa: np.ndarray,
    za: np.ndarray | None,
    b: np.ndarray,
    sb: np.ndarray,
    zb: np.ndarray | None,
    sc: np.ndarray,
    zc: np.ndarray | None,
) -> np.ndarray | None:
    """``QLinearAdd`` (op 0) or ``QLinearMul`` (op 1) per tensor, where one input's shape is
    the other's trailing dimensions (a bias, one value, the same shape); None elsewhere."""
    lib = _get()
    if lib is None or a.dtype not in _RANGE or b.dtype not in _RANGE:
        return None
    if not _per_tensor(sa, za, sb, zb, sc, zc) or not sa.dtype == sb.dtype == sc.dtype == _F32:
        return None
    dt = a.dtype if zc is None else zc.dtype  # the first input's type without one
    if dt not in _RANGE:
        return None
    if a.size < b.size:  # the bigger one first: + and * are commutative in IEEE arithmetic
        a, sa, za, b, sb, zb = b, sb, zb, a, sa, za
    if a.shape != b.shape and b.size != 1:
        tail = b.shape[_lead_ones(b.shape) :]
        if len(tail) > a.ndim or a.shape[a.ndim - len(tail) :] != tail or b.ndim > a.ndim:
            return None
    if b.size == 0 or b.ndim > a.ndim:
        return None
    ffi, c_lib, _ = lib
    ac, bc = np.ascontiguousarray(a), np.ascontiguousarray(b)
    out = np.empty(a.shape, dt)
    lo, hi = _RANGE[dt]
    c_lib.ac_qbin(
        op, ac.size, _ptr(ffi, ac), int(a.dtype == _S8), _value(sa), _value(za), bc.size,
        _ptr(ffi, bc), int(b.dtype == _S8), _value(sb), _value(zb), _value(sc), _value(zc),
        lo, hi, _ptr(ffi, out, write=True),
    )  # fmt: skip
    return out


def _lead_ones(shape: tuple[int, ...]) -> int:
    i = 0
    while i < len(shape) and shape[i] == 1:
        i += 1
    return i
