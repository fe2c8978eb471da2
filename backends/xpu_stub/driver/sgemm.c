/*
 * sgemm.c: the float32 product Y = A' B' behind MatMul and Gemm, on one thread.
 *
 * A' (M x K) and B' (K x N) are read through (row, column) element strides, so a transposed
 * operand costs nothing extra; Y is row-major with leading dimension ldy.
 *
 * Blocking (the Goto / BLIS scheme), loops outermost first:
 *
 *   jc: columns of Y in panels of NC      pack B' panel (KC x NC), stays in L3
 *   pc:   K in slices of KC
 *   ic:     rows of Y in blocks of MC     pack A' block (MC x KC), stays in L2
 *   jr:       NR columns at a time        one packed B micro-panel (KC x NR) stays in L1
 *   ir:         MR rows at a time         micro-kernel
 *
 * The micro-kernel keeps an MR x NR tile of Y in vector registers; each of its KC steps loads
 * NR/VW vectors of B, broadcasts MR values of A and issues MR * NR/VW fused multiply-adds.
 * Packing lays A out as MR-row micro-panels (MR values per k step) and B as NR-column
 * micro-panels (NR values per k step), zero-padded to whole tiles, so the micro-kernel reads
 * both with unit stride and never branches on edges; an edge tile is computed into a scratch
 * tile and only its valid part is written. The first K slice stores into Y, later ones add.
 *
 * A product with few rows (matrix-vector and nearly so) skips packing: B's rows are streamed
 * once and each row of Y accumulates in place (packing B would cost as much as the product);
 * with B stored transposed each element is a dot product of two contiguous rows.
 *
 * Tile sizes by instruction set (chosen at compile time, -march=native):
 *   AVX-512: 12 x 32 (24 of 32 zmm registers accumulate)
 *   AVX2+FMA: 6 x 16 (12 of 16 ymm registers accumulate)
 *   otherwise: 4 x 4 scalar, portable C.
 */
#include "sgemm.h"

#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
#include <immintrin.h>
#endif

/* ---- vector layer: VW floats per vector ---------------------------------------------------- */

#if defined(__AVX512F__)
#define VW 16
#define MR 12
#define NV 2
typedef __m512 vf;
static inline vf v_load(const float *p) { return _mm512_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm512_storeu_ps(p, x); }
static inline vf v_bcast(float x) { return _mm512_set1_ps(x); }
static inline vf v_zero(void) { return _mm512_setzero_ps(); }
static inline vf v_add(vf a, vf b) { return _mm512_add_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
#define VW 8
#define MR 6
#define NV 2
typedef __m256 vf;
static inline vf v_load(const float *p) { return _mm256_loadu_ps(p); }
static inline void v_store(float *p, vf x) { _mm256_storeu_ps(p, x); }
static inline vf v_bcast(float x) { return _mm256_set1_ps(x); }
static inline vf v_zero(void) { return _mm256_setzero_ps(); }
static inline vf v_add(vf a, vf b) { return _mm256_add_ps(a, b); }
static inline vf v_fma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
#else
#define VW 1
#define MR 4
#define NV 4
typedef float vf;
static inline vf v_load(const float *p) { return *p; }
static inline void v_store(float *p, vf x) { *p = x; }
static inline vf v_bcast(float x) { return x; }
static inline vf v_zero(void) { return 0.0f; }
static inline vf v_add(vf a, vf b) { return a + b; }
static inline vf v_fma(vf a, vf b, vf c) { return a * b + c; }
#endif

#define NR (NV * VW)
#define KC 256          /* B micro-panel KC x NR: 32 KiB with AVX-512, 16 KiB with AVX2 */
#define MC (MR * 16)    /* A block MC x KC: 192 KiB with AVX-512, 96 KiB with AVX2 */
#define NC (NR * 128)   /* B panel KC x NC: 4 MiB with AVX-512 */
#define SMALL_M (MR > 4 ? 4 : MR - 1) /* up to this many rows: the unpacked path */
#define UNROLL _Pragma("GCC unroll 16")

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int64_t xpu_sgemm_split_unit(const xpu_sgemm *g, bool along_n) {
    if (along_n) {
        return g->M <= SMALL_M ? VW * 4 : NR;
    }
    return MR;
}

int64_t xpu_sgemm_small_m(void) { return SMALL_M; }

/* ---- micro-kernel ------------------------------------------------------------------------- */

/* c[MR x NR] (row stride ldc) = (or += when add) packed A micro-panel x packed B micro-panel. */
static void micro_kernel(int64_t kc, const float *restrict a, const float *restrict b,
                         float *restrict c, int64_t ldc, bool add) {
    vf acc[MR][NV];
    UNROLL for (int r = 0; r < MR; r++) {
        UNROLL for (int v = 0; v < NV; v++) { acc[r][v] = v_zero(); }
    }
    for (int64_t p = 0; p < kc; p++) {
        vf bv[NV];
        UNROLL for (int v = 0; v < NV; v++) { bv[v] = v_load(b + v * VW); }
        UNROLL for (int r = 0; r < MR; r++) {
            vf av = v_bcast(a[r]);
            UNROLL for (int v = 0; v < NV; v++) { acc[r][v] = v_fma(av, bv[v], acc[r][v]); }
        }
        a += MR;
        b += NR;
    }
    UNROLL for (int r = 0; r < MR; r++) {
        UNROLL for (int v = 0; v < NV; v++) {
            float *dst = c + r * ldc + v * VW;
            v_store(dst, add ? v_add(acc[r][v], v_load(dst)) : acc[r][v]);
        }
    }
}

/* The same product with A' read in place (element (r, p) of the tile at a[r * ars + p * acs])
 * instead of from a packed micro-panel: the same fused multiply-adds in the same order, so
 * the result is bit for bit the packed kernel's. For rows < MR the missing rows repeat the
 * last valid one (read in bounds; their results land in the scratch tile and are dropped). */
static void micro_kernel_direct(int64_t kc, int64_t rows, const float *restrict a, int64_t ars,
                                int64_t acs, const float *restrict b, float *restrict c,
                                int64_t ldc, bool add) {
    const float *row[MR];
    UNROLL for (int r = 0; r < MR; r++) { row[r] = a + (r < rows ? r : rows - 1) * ars; }
    vf acc[MR][NV];
    UNROLL for (int r = 0; r < MR; r++) {
        UNROLL for (int v = 0; v < NV; v++) { acc[r][v] = v_zero(); }
    }
    for (int64_t p = 0; p < kc; p++) {
        vf bv[NV];
        UNROLL for (int v = 0; v < NV; v++) { bv[v] = v_load(b + v * VW); }
        int64_t off = p * acs;
        UNROLL for (int r = 0; r < MR; r++) {
            vf av = v_bcast(row[r][off]);
            UNROLL for (int v = 0; v < NV; v++) { acc[r][v] = v_fma(av, bv[v], acc[r][v]); }
        }
        b += NR;
    }
    UNROLL for (int r = 0; r < MR; r++) {
        UNROLL for (int v = 0; v < NV; v++) {
            float *dst = c + r * ldc + v * VW;
            v_store(dst, add ? v_add(acc[r][v], v_load(dst)) : acc[r][v]);
        }
    }
}

/* ---- packing ------------------------------------------------------------------------------ */

/* mc x kc of A' (strides rs, cs) into MR-row micro-panels, zero rows past mc. */
static void pack_a(int64_t mc, int64_t kc, const float *a, int64_t rs, int64_t cs, float *dst) {
    for (int64_t i0 = 0; i0 < mc; i0 += MR) {
        int64_t rows = min64(MR, mc - i0);
        for (int64_t r = 0; r < MR; r++) {
            const float *src = a + (i0 + r) * rs;
            for (int64_t p = 0; p < kc; p++) {
                dst[p * MR + r] = r < rows ? src[p * cs] : 0.0f;
            }
        }
        dst += MR * kc;
    }
}

/* kc x nc of B' (strides rs, cs) into NR-column micro-panels, zero columns past nc. */
static void pack_b(int64_t kc, int64_t nc, const float *b, int64_t rs, int64_t cs, float *dst) {
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        int64_t cols = min64(NR, nc - j0);
        for (int64_t p = 0; p < kc; p++) {
            const float *src = b + p * rs + j0 * cs;
            if (cs == 1 && cols == NR) {
                memcpy(dst, src, NR * sizeof(float));
            } else {
                for (int64_t c = 0; c < NR; c++) {
                    dst[c] = c < cols ? src[c * cs] : 0.0f;
                }
            }
            dst += NR;
        }
    }
}

/* ---- blocked product ---------------------------------------------------------------------- */

/* Writes the rows x cols corner of a computed tile into y (or adds it). */
static void write_edge(const float *tile, int64_t rows, int64_t cols, float *y, int64_t ldy,
                       bool add) {
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t c = 0; c < cols; c++) {
            y[r * ldy + c] = add ? y[r * ldy + c] + tile[r * NR + c] : tile[r * NR + c];
        }
    }
}

/* Y block (mc x nc) from a packed A block and a packed B panel: the jr and ir loops. */
static void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const float *pa, const float *pb,
                         float *y, int64_t ldy, bool add) {
    float tile[MR * NR] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        int64_t cols = min64(NR, nc - j0);
        for (int64_t i0 = 0; i0 < mc; i0 += MR) {
            int64_t rows = min64(MR, mc - i0);
            const float *a = pa + i0 * kc, *b = pb + j0 * kc;
            float *c = y + i0 * ldy + j0;
            if (rows == MR && cols == NR) {
                micro_kernel(kc, a, b, c, ldy, add);
            } else {
                micro_kernel(kc, a, b, tile, NR, false);
                write_edge(tile, rows, cols, c, ldy, add);
            }
        }
    }
}

/* macro_kernel with A' read in place (micro_kernel_direct): for narrow products, where each
 * element of A' is used by one or two column tiles and packing it would cost as much as the
 * multiply-adds (attention's probabilities @ V: N = the head size, 32 or 64). */
static void macro_kernel_direct(int64_t mc, int64_t nc, int64_t kc, const float *a, int64_t ars,
                                int64_t acs, const float *pb, float *y, int64_t ldy, bool add) {
    float tile[MR * NR] __attribute__((aligned(64)));
    for (int64_t j0 = 0; j0 < nc; j0 += NR) {
        int64_t cols = min64(NR, nc - j0);
        for (int64_t i0 = 0; i0 < mc; i0 += MR) {
            int64_t rows = min64(MR, mc - i0);
            const float *ai = a + i0 * ars, *b = pb + j0 * kc;
            float *c = y + i0 * ldy + j0;
            if (rows == MR && cols == NR) {
                micro_kernel_direct(kc, MR, ai, ars, acs, b, c, ldy, add);
            } else {
                micro_kernel_direct(kc, rows, ai, ars, acs, b, tile, NR, false);
                write_edge(tile, rows, cols, c, ldy, add);
            }
        }
    }
}

/* Products at most this many columns wide read A' in place (see macro_kernel_direct). */
#define DIRECT_N (2 * NR)

static void zero_y(const xpu_sgemm *g) {
    for (int64_t i = 0; i < g->M; i++) {
        memset(g->Y + i * g->ldy, 0, (size_t)g->N * sizeof(float));
    }
}

/* Plain loops: the last resort when the packing buffers cannot be allocated. */
static void naive(const xpu_sgemm *g) {
    for (int64_t i = 0; i < g->M; i++) {
        for (int64_t j = 0; j < g->N; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < g->K; p++) {
                acc += g->A[i * g->rsa + p * g->csa] * g->B[p * g->rsb + j * g->csb];
            }
            g->Y[i * g->ldy + j] = acc;
        }
    }
}

/* Few rows, A' rows and B' columns contiguous (B stored transposed, as Gemm's transB and
 * every fully connected layer exported from PyTorch have it): each element is a dot product
 * of two contiguous rows, with 16 partial sums (vectorized); B is read once, in order.
 * Packing B' would read it one element per cache line (AlexNet's 9216 x 4096 FC layer: 130 ms
 * instead of 8). */
static bool dot_rows(const xpu_sgemm *g) {
    return g->M <= SMALL_M && g->rsb == 1 && g->csb != 1 && g->csa == 1;
}

static void small_m_dots(const xpu_sgemm *g) {
    int64_t K = g->K;
    for (int64_t i = 0; i < g->M; i++) {
        const float *restrict a = g->A + i * g->rsa;
        for (int64_t j = 0; j < g->N; j++) {
            const float *restrict b = g->B + j * g->csb;
            float acc[16] = {0};
            int64_t k = 0;
            for (; k + 16 <= K; k += 16) {
                for (int l = 0; l < 16; l++) {
                    acc[l] += a[k + l] * b[k + l];
                }
            }
            for (int l = 0; k < K; k++, l++) {
                acc[l] += a[k] * b[k];
            }
            for (int w = 8; w > 0; w /= 2) {
                for (int l = 0; l < w; l++) {
                    acc[l] += acc[l + w];
                }
            }
            g->Y[i * g->ldy + j] = acc[0];
        }
    }
}

size_t xpu_sgemm_work_floats(const xpu_sgemm *g) {
    if ((g->M <= SMALL_M && g->csb == 1) || dot_rows(g)) {
        return 0;
    }
    int64_t kc = min64(g->K, KC);
    return (size_t)((round_up(min64(g->M, MC), MR) + round_up(min64(g->N, NC), NR)) * kc);
}

/* Few rows, B' rows contiguous: for each k, Y[i, :] += A'[i, k] * B'[k, :], VW*4 columns at a
 * time so the partial sums stay in registers while B's rows stream past. */
static void small_m(const xpu_sgemm *g) {
    int64_t n4 = g->N / (4 * VW) * (4 * VW);
    for (int64_t i = 0; i < g->M; i++) {
        const float *a = g->A + i * g->rsa;
        float *y = g->Y + i * g->ldy;
        for (int64_t j = 0; j < n4; j += 4 * VW) {
            vf acc[4] = {v_zero(), v_zero(), v_zero(), v_zero()};
            for (int64_t p = 0; p < g->K; p++) {
                vf av = v_bcast(a[p * g->csa]);
                const float *b = g->B + p * g->rsb + j;
                UNROLL for (int v = 0; v < 4; v++) { acc[v] = v_fma(av, v_load(b + v * VW), acc[v]); }
            }
            UNROLL for (int v = 0; v < 4; v++) { v_store(y + j + v * VW, acc[v]); }
        }
        for (int64_t j = n4; j < g->N; j++) {
            float acc = 0.0f;
            for (int64_t p = 0; p < g->K; p++) {
                acc += a[p * g->csa] * g->B[p * g->rsb + j];
            }
            y[j] = acc;
        }
    }
}

void xpu_sgemm_serial(const xpu_sgemm *g, float *work) {
    if (g->M == 0 || g->N == 0) {
        return;
    }
    if (g->K == 0) {
        zero_y(g);
        return;
    }
    if (g->M <= SMALL_M && g->csb == 1) {
        small_m(g);
        return;
    }
    if (dot_rows(g)) {
        small_m_dots(g);
        return;
    }
    if (work == NULL) {
        naive(g);
        return;
    }
    float *pa = work, *pb = work + round_up(min64(g->M, MC), MR) * min64(g->K, KC);
    for (int64_t jc = 0; jc < g->N; jc += NC) {
        int64_t nc = min64(NC, g->N - jc);
        for (int64_t pc = 0; pc < g->K; pc += KC) {
            int64_t kc = min64(KC, g->K - pc);
            pack_b(kc, nc, g->B + pc * g->rsb + jc * g->csb, g->rsb, g->csb, pb);
            for (int64_t ic = 0; ic < g->M; ic += MC) {
                int64_t mc = min64(MC, g->M - ic);
                const float *a = g->A + ic * g->rsa + pc * g->csa;
                float *y = g->Y + ic * g->ldy + jc;
                if (g->N <= DIRECT_N) {
                    macro_kernel_direct(mc, nc, kc, a, g->rsa, g->csa, pb, y, g->ldy, pc > 0);
                } else {
                    pack_a(mc, kc, a, g->rsa, g->csa, pa);
                    macro_kernel(mc, nc, kc, pa, pb, y, g->ldy, pc > 0);
                }
            }
        }
    }
}
