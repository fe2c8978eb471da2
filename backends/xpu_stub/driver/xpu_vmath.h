/*
 * xpu_vmath.h: float32 functions written so that gcc -O3 vectorizes the loops calling them
 * (no libm calls, no branches: selects), for the row kernels (Softmax, LayerNormalization).
 *
 * xpu_expf: exp(x) = 2^n * e^r with n = round(x / ln 2), r = x - n ln 2 (ln 2 split in two
 * for an exact product), e^r by its degree-6 Taylor/Horner polynomial on |r| <= ln2 / 2
 * (a few ulp), 2^n built in the exponent bits. x below -87.33654 (results under FLT_MIN, where
 * libm gives subnormals) gives 0, above 88.72283 +inf; NaN stays NaN.
 */
#ifndef ANYCHIP_XPU_VMATH_H
#define ANYCHIP_XPU_VMATH_H

#include <math.h>
#include <stdint.h>

static inline float xpu_expf(float x) {
    const float log2e = 1.44269504088896341f, ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    float xc = x > 88.72283f ? 88.72283f : x;
    xc = xc < -87.33654f ? -87.33654f : xc;
    /* round to nearest by adding and subtracting 1.5 * 2^23 (floorf would not vectorize) */
    float n = fmaf(xc, log2e, 12582912.0f) - 12582912.0f;
    float r = fmaf(n, -ln2_hi, xc);
    r = fmaf(n, -ln2_lo, r);
    /* fused multiply-adds (fmaf is a builtin: no errno, vectorized): half the operations of
     * separate products and sums, and one rounding each */
    float p = 1.0f / 720.0f;
    p = fmaf(p, r, 1.0f / 120.0f);
    p = fmaf(p, r, 1.0f / 24.0f);
    p = fmaf(p, r, 1.0f / 6.0f);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    /* 2^n as two factors 2^h 2^(n-h), each a normal float for n in [-126, 128] */
    int32_t ni = (int32_t)n, h = ni / 2;
    union {
        int32_t i;
        float f;
    } s1 = {.i = (h + 127) << 23}, s2 = {.i = (ni - h + 127) << 23};
    float y = p * s1.f * s2.f;
    y = x < -87.33654f ? 0.0f : y;
    y = x > 88.72283f ? __builtin_inff() : y;
    return x != x ? x : y;
}

/* tanh: for |x| < 0.625 the odd polynomial of Cephes' tanhf (relative error ~1e-7), else
 * sign(x) (1 - 2 / (exp(2|x|) + 1)); exact +-1 beyond |x| = 9 (where float32 rounds to it). */
static inline float xpu_tanhf(float x) {
    float ax = x < 0.0f ? -x : x;
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = p * z + 2.06390887954e-2f;
    p = p * z - 5.37397155531e-2f;
    p = p * z + 1.33314422036e-1f;
    p = p * z - 3.33332819422e-1f;
    float small = x + x * z * p;
    float big = 1.0f - 2.0f / (xpu_expf(2.0f * (ax > 9.0f ? 9.0f : ax)) + 1.0f);
    big = ax > 9.0f ? 1.0f : big;
    big = x < 0.0f ? -big : big;
    return ax < 0.625f ? small : big;
}

/* 1 / (1 + exp(-x)), through exp(-|x|) so that nothing overflows. */
static inline float xpu_sigmoidf(float x) {
    float e = xpu_expf(x < 0.0f ? x : -x);
    float r = 1.0f / (1.0f + e);
    return x < 0.0f ? e * r : r;
}

/* Sum of x[0, n) with 16 independent partial sums (a fixed order, so the same on every
 * thread count; vectorized as 16 lanes), combined pairwise. */
static inline float xpu_sumf(const float *x, int64_t n) {
    float acc[16] = {0};
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        for (int l = 0; l < 16; l++) {
            acc[l] += x[k + l];
        }
    }
    for (int l = 0; k < n; k++, l++) {
        acc[l] += x[k];
    }
    for (int w = 8; w > 0; w /= 2) {
        for (int l = 0; l < w; l++) {
            acc[l] += acc[l + w];
        }
    }
    return acc[0];
}

/* Largest of x[0, n) (-inf when n == 0; NaN elements are skipped, the caller's exp of them
 * propagates NaN), with 16 partial maxima like xpu_sumf. */
static inline float xpu_maxf(const float *x, int64_t n) {
    float acc[16];
    for (int l = 0; l < 16; l++) {
        acc[l] = -INFINITY;
    }
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) {
        for (int l = 0; l < 16; l++) {
            acc[l] = x[k + l] > acc[l] ? x[k + l] : acc[l];
        }
    }
    for (int l = 0; k < n; k++, l++) {
        acc[l] = x[k] > acc[l] ? x[k] : acc[l];
    }
    for (int w = 8; w > 0; w /= 2) {
        for (int l = 0; l < w; l++) {
            acc[l] = acc[l + w] > acc[l] ? acc[l + w] : acc[l];
        }
    }
    return acc[0];
}

#endif
