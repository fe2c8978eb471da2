"""The C of ``native/qlinear.py`` (its module docstring says what each function computes),
built by ``codegen/build.py`` (``-march=native``): the packed weights' layout and the
``vpmaddwd`` product (AVX-512BW, AVX2, else plain C), the requantizing epilogues, and the
per-tensor element-wise quantized ops.
"""

from __future__ import annotations

__all__ = ["SOURCE", "CDEF"]

SOURCE = r"""
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
           const float *smul_p, const uint8_t *za_p, void *out) {
    if (smul_p) smul = *smul_p; /* read at the call: a replay's new values */
    if (za_p) za = a_sgn ? (int32_t)(int8_t)*za_p : (int32_t)*za_p; /* a's type */
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

/* A 256-entry table of 8-bit codes applied to 8-bit x (int8 x indexed from -128). */
void ac_lut(long n, const uint8_t *x, int sgn, const uint8_t *table, uint8_t *y) {
    const uint8_t flip = sgn ? 0x80 : 0;
    for (long i = 0; i < n; i++) y[i] = table[x[i] ^ flip];
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
CDEF = """
long ac_qpack_size(long k, long n);
void ac_qpack(long k, long n, const int16_t *bc, int16_t *p);
int ac_qmm(long m, long k, long n, const uint8_t *a, int a_sgn, const int32_t *za_rows,
    int32_t za, const int16_t *bp, const int32_t *raw, const int32_t *c, int mode,
    const float *scale, int scale_cols, const float *bias, double ys, double yzp, double lo,
    double hi, const float *bias2, const float *p2, float smul, const float *smul_p,
    const uint8_t *za_p, void *out);
int ac_quant(long count, const float *x, float s, float zp, float lo, float hi, uint8_t *y);
void ac_dequant(long count, const uint8_t *x, int sgn, float zp, float s, float *y);
int ac_dynq(long count, const float *x, uint8_t *y, float *scale, uint8_t *zp);
void ac_lut(long n, const uint8_t *x, int sgn, const uint8_t *table, uint8_t *y);
void ac_qbin(int op, long n, const uint8_t *a, int a_sgn, float sa, float za, long nb,
    const uint8_t *b, int b_sgn, float sb, float zb, float sc, float zc, float lo, float hi,
    uint8_t *y);
"""
