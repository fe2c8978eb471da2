/*
 * kernels_linalg.c: MatMul (batched, broadcast batch dimensions) and Gemm.
 *
 * MatMul: bufs [a, b, y]
 *         iargs [dtype, bnd, bshape[bnd], a_bstrides[bnd], b_bstrides[bnd], M, K, N]
 *         Each batch of a is a contiguous row-major M x K matrix starting at the element
 *         offset sum(idx * a_bstrides) (0 strides broadcast); b likewise K x N; y is the
 *         contiguous [bshape..., M, N] result. float32 and int64.
 * Gemm:   bufs [A, B, C or 0, Y]
 *         iargs [dtype, M, N, K, transA, transB, c_stride_m, c_stride_n]  fargs [alpha, beta]
 *         Y = alpha * A' B' + beta * C, A' = transA ? A^T : A (A stored K x M or M x K), same
 *         for B; C is read through (c_stride_m, c_stride_n), 0 on a broadcast axis. float32.
 *
 * float32 products go to the blocked, multi-threaded sgemm (sgemm.c, sgemm_threads.c); a
 * batched MatMul whose B is shared by every batch and whose A is dense runs as one tall
 * product. int64 runs plain i-k-j loops (the innermost loop streams rows of B and Y).
 */
#include "sgemm.h"
#include "xpu_internal.h"

/* ---- MatMul ------------------------------------------------------------------------------ */

static int check_matmul(const xpu_args *a) {
    if (a->ni < 2) {
        return xpu_check_counts(a, 3, 5, 0);
    }
    int st = xpu_check_ndim(a, a->i[1] + 2);
    if (st != XPU_OK) {
        return st;
    }
    int bnd = (int)a->i[1];
    st = xpu_check_counts(a, 3, 5 + 3 * bnd, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], true);
    }
    if (st != XPU_OK) {
        return st;
    }
    const int64_t *mkn = a->i + 2 + 3 * bnd;
    int64_t shape[XPU_MAX_DIMS], sa[XPU_MAX_DIMS], sb[XPU_MAX_DIMS], ysh[XPU_MAX_DIMS];
    for (int d = 0; d < bnd; d++) {
        shape[d] = ysh[d] = a->i[2 + d];
        sa[d] = a->i[2 + bnd + d];
        sb[d] = a->i[2 + 2 * bnd + d];
    }
    int64_t numel;
    ysh[bnd] = mkn[0];
    ysh[bnd + 1] = mkn[2];
    st = xpu_check_numel(a, bnd + 2, ysh, &numel);
    if (st != XPU_OK) {
        return st;
    }
    shape[bnd] = mkn[0]; /* a: M x K */
    shape[bnd + 1] = mkn[1];
    sa[bnd] = mkn[1];
    sa[bnd + 1] = 1;
    int64_t n_a;
    st = xpu_check_numel(a, bnd + 2, shape, &n_a);
    if (st == XPU_OK) {
        st = xpu_check_strided(a, 0, bnd + 2, shape, sa, 0, xpu_dtype_size(a->i[0]));
    }
    shape[bnd] = mkn[1]; /* b: K x N */
    shape[bnd + 1] = mkn[2];
    sb[bnd] = mkn[2];
    sb[bnd + 1] = 1;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, bnd + 2, shape, &n_a);
    }
    if (st == XPU_OK) {
        st = xpu_check_strided(a, 1, bnd + 2, shape, sb, 0, xpu_dtype_size(a->i[0]));
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 2, numel, xpu_dtype_size(a->i[0]));
    }
    return st;
}

/* int64: wrapping products accumulated as uint64_t, whose bits equal numpy's int64 result. */
static void matmul_int64(const xpu_args *a, int bnd, const int64_t *bshape, const int64_t *as,
                         const int64_t *bs, int64_t M, int64_t K, int64_t N) {
    const uint64_t *A = (const uint64_t *)a->ptr[0];
    const uint64_t *B = (const uint64_t *)a->ptr[1];
    uint64_t *Y = (uint64_t *)a->ptr[2];
    int64_t idx[XPU_MAX_DIMS] = {0};
    do {
        int64_t oa = 0, ob = 0;
        for (int d = 0; d < bnd; d++) {
            oa += idx[d] * as[d];
            ob += idx[d] * bs[d];
        }
        for (int64_t i = 0; i < M; i++) {
            uint64_t *row = Y + i * N;
            for (int64_t j = 0; j < N; j++) {
                row[j] = 0;
            }
            for (int64_t k = 0; k < K; k++) {
                uint64_t av = A[oa + i * K + k];
                const uint64_t *brow = B + ob + k * N;
                for (int64_t j = 0; j < N; j++) {
                    row[j] += av * brow[j];
                }
            }
        }
        Y += M * N;
    } while (xpu_next_index(bnd, bshape, idx));
}

/* True when every batch shares one B and A's batches lie back to back: then the batched
 * product is a single (batches * M) x K by K x N one. */
static bool folds_into_one(int bnd, const int64_t *bshape, const int64_t *as, const int64_t *bs,
                           int64_t mk) {
    int64_t dense = mk;
    for (int d = bnd - 1; d >= 0; d--) {
        if (bs[d] != 0 || (bshape[d] != 1 && as[d] != dense)) {
            return false;
        }
        dense *= bshape[d];
    }
    return true;
}

#define MATMUL_GROUP 256 /* products handed to the threads at once */

static void matmul_f32(const xpu_args *a, int bnd, const int64_t *bshape, const int64_t *as,
                       const int64_t *bs, int64_t M, int64_t K, int64_t N) {
    const float *A = (const float *)a->ptr[0], *B = (const float *)a->ptr[1];
    float *Y = (float *)a->ptr[2];
    xpu_sgemm probs[MATMUL_GROUP];
    if (folds_into_one(bnd, bshape, as, bs, M * K)) {
        int64_t rows = M;
        for (int d = 0; d < bnd; d++) {
            rows *= bshape[d];
        }
        probs[0] = (xpu_sgemm){rows, N, K, A, K, 1, B, N, 1, Y, N};
        xpu_sgemm_run(probs, 1);
        return;
    }
    int64_t idx[XPU_MAX_DIMS] = {0}, n = 0;
    bool more = true;
    while (more) {
        int64_t oa = 0, ob = 0;
        for (int d = 0; d < bnd; d++) {
            oa += idx[d] * as[d];
            ob += idx[d] * bs[d];
        }
        probs[n++] = (xpu_sgemm){M, N, K, A + oa, K, 1, B + ob, N, 1, Y, N};
        Y += M * N;
        more = xpu_next_index(bnd, bshape, idx);
        if (n == MATMUL_GROUP || !more) {
            xpu_sgemm_run(probs, n);
            n = 0;
        }
    }
}

static void run_matmul(const xpu_args *a) {
    int bnd = (int)a->i[1];
    const int64_t *bshape = a->i + 2, *as = a->i + 2 + bnd, *bs = a->i + 2 + 2 * bnd;
    int64_t M = a->i[2 + 3 * bnd], K = a->i[3 + 3 * bnd], N = a->i[4 + 3 * bnd];
    if (M == 0 || N == 0) {
        return;
    }
    for (int d = 0; d < bnd; d++) {
        if (bshape[d] == 0) {
            return;
        }
    }
    if (a->i[0] == XPU_DTYPE_INT64) {
        matmul_int64(a, bnd, bshape, as, bs, M, K, N);
    } else {
        matmul_f32(a, bnd, bshape, as, bs, M, K, N);
    }
}

/* ---- Gemm -------------------------------------------------------------------------------- */

static int check_gemm(const xpu_args *a) {
    int st = xpu_check_counts(a, 4, 8, 2);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], false);
    }
    if (st != XPU_OK) {
        return st;
    }
    int64_t M = a->i[1], N = a->i[2], K = a->i[3], mk, kn, mn;
    int64_t dims[2] = {M, K};
    st = xpu_check_numel(a, 2, dims, &mk);
    dims[0] = K;
    dims[1] = N;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, 2, dims, &kn);
    }
    dims[0] = M;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, 2, dims, &mn);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 0, mk, 4);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 1, kn, 4);
    }
    if (st == XPU_OK && a->ptr[2] != NULL) {
        st = xpu_check_strided(a, 2, 2, dims, a->i + 6, 0, 4);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 3, mn, 4);
    }
    return st;
}

static void run_gemm(const xpu_args *a) {
    const float *C = (const float *)a->ptr[2];
    float *Y = (float *)a->ptr[3];
    int64_t M = a->i[1], N = a->i[2], K = a->i[3];
    bool ta = a->i[4] != 0, tb = a->i[5] != 0;
    int64_t csm = a->i[6], csn = a->i[7];
    float alpha = (float)a->f[0], beta = (float)a->f[1];
    /* A is stored K x M when transposed, B N x K: the strides read A' and B' either way. */
    xpu_sgemm g = {M, N, K, (const float *)a->ptr[0], ta ? 1 : K, ta ? M : 1,
                   (const float *)a->ptr[1], tb ? 1 : N, tb ? K : 1, Y, N};
    xpu_sgemm_run(&g, 1);
    if (alpha == 1.0f && C == NULL) {
        return;
    }
    for (int64_t i = 0; i < M; i++) {
        float *row = Y + i * N;
        for (int64_t j = 0; j < N; j++) {
            float c = C != NULL ? beta * C[i * csm + j * csn] : 0.0f;
            row[j] = alpha * row[j] + c;
        }
    }
}

/* ---- table ------------------------------------------------------------------------------- */

static const xpu_kernel_def kernels[] = {
    {"MatMul", check_matmul, run_matmul},
    {"Gemm", check_gemm, run_gemm},
};

const xpu_kernel_def *xpu_linalg_kernels(int *count) {
    *count = (int)(sizeof kernels / sizeof kernels[0]);
    return kernels;
}
