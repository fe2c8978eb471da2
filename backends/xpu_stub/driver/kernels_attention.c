/*
 * kernels_attention.c: scaled dot-product attention, softmax(Q Kt * c (or / c)) V, in blocks of
 * query rows whose scores stay in cache.
 *
 * Attention: bufs [q, kt, v, y]  iargs [batches, S, D, T, E, divide]  fargs [c]   (float32)
 *            q is batches x S x D, kt batches x D x T (the keys already transposed, as the
 *            graphs write it), v batches x T x E, y batches x S x E, all dense row-major.
 *
 * The unfused nodes (MatMul, Mul or Div, Softmax, MatMul) write and read a batches x S x T
 * scores tensor four times (16 MiB for GPT-2's 8 heads at sequence 512). Here each work item,
 * BLOCK query rows of one batch, computes its BLOCK x T scores into a per-thread buffer (L2),
 * scales them and normalizes each row (max, exp and sum, multiply by 1 / sum: the Softmax
 * kernel's steps), and multiplies by v right away. Both products are the blocked sgemm on one
 * thread (sgemm.c); the items are split over the device's threads (xpu_parallel.c), and each
 * is computed the same way whatever the split, so results do not depend on the thread count.
 */
#include "sgemm.h"
#include "xpu_internal.h"
#include "xpu_vmath.h"

#include <math.h>
#include <stdlib.h>

#define BLOCK 48 /* query rows per item: a multiple of every micro-kernel's MR (12, 6, 4) */

static int check_attention(const xpu_args *a) {
    int st = xpu_check_counts(a, 4, 6, 1);
    if (st != XPU_OK) {
        return st;
    }
    int64_t b = a->i[0], S = a->i[1], D = a->i[2], T = a->i[3], E = a->i[4];
    int64_t shapes[4][3] = {{b, S, D}, {b, D, T}, {b, T, E}, {b, S, E}};
    for (int k = 0; k < 4 && st == XPU_OK; k++) {
        int64_t numel;
        st = xpu_check_numel(a, 3, shapes[k], &numel);
        if (st == XPU_OK) {
            st = xpu_check_dense(a, k, numel, 4);
        }
    }
    return st;
}

typedef struct att_ctx {
    const float *q, *kt, *v;
    float *y;
    int64_t S, D, T, E, blocks;
    float c;
    bool divide;
} att_ctx;

/* Scales one row of scores in place and turns it into its softmax. */
static void softmax_row(float *restrict s, int64_t T, float c, bool divide) {
    if (divide) {
        for (int64_t k = 0; k < T; k++) {
            s[k] = s[k] / c;
        }
    } else {
        for (int64_t k = 0; k < T; k++) {
            s[k] = s[k] * c;
        }
    }
    float m = xpu_maxf(s, T);
    for (int64_t k = 0; k < T; k++) {
        s[k] = xpu_expf(s[k] - m);
    }
    float inv = 1.0f / xpu_sumf(s, T);
    for (int64_t k = 0; k < T; k++) {
        s[k] *= inv;
    }
}

static void one_block(const att_ctx *c, int64_t item, float *scores, float *work) {
    int64_t batch = item / c->blocks, r0 = item % c->blocks * BLOCK;
    int64_t rows = c->S - r0 < BLOCK ? c->S - r0 : BLOCK;
    int64_t S = c->S, D = c->D, T = c->T, E = c->E;
    const float *q = c->q + (batch * S + r0) * D, *kt = c->kt + batch * D * T;
    const float *v = c->v + batch * T * E;
    xpu_sgemm g1 = {rows, T, D, q, D, 1, kt, T, 1, scores, T};
    xpu_sgemm_serial(&g1, work);
    for (int64_t r = 0; r < rows; r++) {
        softmax_row(scores + r * T, T, c->c, c->divide);
    }
    xpu_sgemm g2 = {rows, E, T, scores, T, 1, v, E, 1, c->y + (batch * S + r0) * E, E};
    xpu_sgemm_serial(&g2, work);
}

/* Fallback when the block buffers cannot be allocated (a kernel cannot fail after launch):
 * each query row by the online softmax, accumulating into its own row of y, no memory. */
static void one_row_online(const att_ctx *c, int64_t batch, int64_t i) {
    int64_t S = c->S, D = c->D, T = c->T, E = c->E;
    const float *q = c->q + (batch * S + i) * D, *kt = c->kt + batch * D * T;
    const float *v = c->v + batch * T * E;
    float *y = c->y + (batch * S + i) * E;
    float m = -INFINITY, sum = 0.0f;
    for (int64_t e = 0; e < E; e++) {
        y[e] = 0.0f;
    }
    for (int64_t j = 0; j < T; j++) {
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            s += q[d] * kt[d * T + j];
        }
        s = c->divide ? s / c->c : s * c->c;
        if (s > m) {
            float r = xpu_expf(m - s);
            sum *= r;
            for (int64_t e = 0; e < E; e++) {
                y[e] *= r;
            }
            m = s;
        }
        float p = xpu_expf(s - m);
        sum += p;
        for (int64_t e = 0; e < E; e++) {
            y[e] += p * v[j * E + e];
        }
    }
    for (int64_t e = 0; e < E; e++) {
        y[e] /= sum;
    }
}

static void attention_items(void *vc, int64_t lo, int64_t hi) {
    const att_ctx *c = vc;
    xpu_sgemm g1 = {BLOCK, c->T, c->D, NULL, c->D, 1, NULL, c->T, 1, NULL, c->T};
    xpu_sgemm g2 = {BLOCK, c->E, c->T, NULL, c->T, 1, NULL, c->E, 1, NULL, c->E};
    size_t w1 = xpu_sgemm_work_floats(&g1), w2 = xpu_sgemm_work_floats(&g2);
    size_t floats = (size_t)(BLOCK * c->T) + (w1 > w2 ? w1 : w2);
    float *buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    for (int64_t item = lo; item < hi; item++) {
        if (buf != NULL) {
            one_block(c, item, buf, buf + BLOCK * c->T);
            continue;
        }
        int64_t batch = item / c->blocks, r0 = item % c->blocks * BLOCK;
        for (int64_t i = r0; i < c->S && i < r0 + BLOCK; i++) {
            one_row_online(c, batch, i);
        }
    }
    free(buf);
}

static void run_attention(const xpu_args *a) {
    int64_t S = a->i[1];
    att_ctx c = {
        (const float *)a->ptr[0],
        (const float *)a->ptr[1],
        (const float *)a->ptr[2],
        (float *)a->ptr[3],
        S,
        a->i[2],
        a->i[3],
        a->i[4],
        (S + BLOCK - 1) / BLOCK,
        (float)a->f[0],
        a->i[5] != 0,
    };
    int64_t items = a->i[0] * c.blocks;
    if (items == 0 || c.E == 0) {
        return;
    }
    double per_item = 2.0 * BLOCK * (double)c.T * (double)(c.D + c.E);
    xpu_parallel_for(items, per_item, attention_items, &c);
}

static const xpu_kernel_def kernels[] = {
    {"Attention", check_attention, run_attention},
};

const xpu_kernel_def *xpu_attention_kernels(int *count) {
    *count = (int)(sizeof kernels / sizeof kernels[0]);
    return kernels;
}
