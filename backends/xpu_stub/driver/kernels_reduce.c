/*
 * kernels_reduce.c: Softmax, LogSoftmax and the Reduce family.
 *
 * Softmax, LogSoftmax: bufs [x, y]  iargs [dtype, outer, axis_len, inner]   (float32)
 *         x and y are contiguous [outer, axis_len, inner]; each (outer, inner) line is
 *         normalised along axis_len after subtracting its maximum, so exp never overflows.
 *         Along the last axis (inner == 1, the usual case) rows are split over the device's
 *         threads and each is three vectorized passes (max; exp into y with xpu_expf and a
 *         16-lane sum; scale), all in float32; other axes take the strided double path.
 * LayerNormalization:
 *         bufs [x, scale, bias or 0, y]  iargs [dtype, rows, len]  fargs [epsilon]   (float32)
 *         each row of len elements: y = (x - mean) / sqrt(var + epsilon) * scale + bias,
 *         mean and (biased) variance in float32 with 16-lane sums; scale and bias hold len
 *         elements (the caller expands a broadcast one). Rows split over the threads.
 * ReduceSum, ReduceMean, ReduceMax, ReduceMin:
 *         bufs [x, y]  iargs [dtype, ndim, shape[ndim], reduce_mask[ndim]]
 *         x is contiguous with `shape`; y is contiguous over the kept dimensions (keepdims
 *         only changes the shape the caller reports, not the layout). Sums accumulate in
 *         double (float32) or wrapping uint64 (int64). Over an empty set: Sum 0, Mean NaN,
 *         Max -inf / INT64_MIN, Min +inf / INT64_MAX, as the ONNX spec says for Max and Min.
 */
#include "xpu_internal.h"
#include "xpu_vmath.h"

#include <math.h>

/* ---- Softmax ----------------------------------------------------------------------------- */

static int check_softmax(const xpu_args *a) {
    int st = xpu_check_counts(a, 2, 4, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], false);
    }
    int64_t numel = 0;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, 3, a->i + 1, &numel);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 0, numel, 4);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 1, numel, 4);
    }
    return st;
}

static void softmax_impl(const xpu_args *a, bool log_out) {
    const float *x = (const float *)a->ptr[0];
    float *y = (float *)a->ptr[1];
    int64_t outer = a->i[1], len = a->i[2], inner = a->i[3];
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t in = 0; in < inner; in++) {
            const float *xs = x + o * len * inner + in;
            float *ys = y + o * len * inner + in;
            float m = -INFINITY;
            for (int64_t k = 0; k < len; k++) {
                m = xs[k * inner] > m ? xs[k * inner] : m;
            }
            double sum = 0.0;
            for (int64_t k = 0; k < len; k++) {
                sum += exp((double)xs[k * inner] - m);
            }
            if (log_out) {
                float ls = (float)log(sum);
                for (int64_t k = 0; k < len; k++) {
                    ys[k * inner] = (xs[k * inner] - m) - ls;
                }
            } else {
                for (int64_t k = 0; k < len; k++) {
                    ys[k * inner] = (float)(exp((double)xs[k * inner] - m) / sum);
                }
            }
        }
    }
}

typedef struct rows_ctx {
    const float *x, *scale, *bias;
    float *y;
    int64_t len;
    bool log_out;
    float epsilon;
} rows_ctx;

static void softmax_rows(void *vc, int64_t lo, int64_t hi) {
    const rows_ctx *c = vc;
    int64_t len = c->len;
    for (int64_t row = lo; row < hi; row++) {
        const float *restrict x = c->x + row * len;
        float *restrict y = c->y + row * len;
        float m = xpu_maxf(x, len);
        for (int64_t k = 0; k < len; k++) {
            y[k] = xpu_expf(x[k] - m);
        }
        float sum = xpu_sumf(y, len);
        if (c->log_out) {
            float ls = logf(sum);
            for (int64_t k = 0; k < len; k++) {
                y[k] = (x[k] - m) - ls;
            }
        } else {
            float inv = 1.0f / sum;
            for (int64_t k = 0; k < len; k++) {
                y[k] *= inv;
            }
        }
    }
}

static void softmax_dispatch(const xpu_args *a, bool log_out) {
    if (a->i[3] != 1) {
        softmax_impl(a, log_out);
        return;
    }
    rows_ctx c = {(const float *)a->ptr[0], NULL, NULL, (float *)a->ptr[1], a->i[2], log_out, 0};
    xpu_parallel_for(a->i[1], 8.0 * (double)a->i[2], softmax_rows, &c);
}

static void run_softmax(const xpu_args *a) { softmax_dispatch(a, false); }
static void run_log_softmax(const xpu_args *a) { softmax_dispatch(a, true); }

/* ---- LayerNormalization ------------------------------------------------------------------ */

static int check_layernorm(const xpu_args *a) {
    int st = xpu_check_counts(a, 4, 3, 1);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], false);
    }
    int64_t numel = 0;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, 2, a->i + 1, &numel);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 0, numel, 4);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 1, a->i[2], 4);
    }
    if (st == XPU_OK && a->ptr[2] != NULL) {
        st = xpu_check_dense(a, 2, a->i[2], 4);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 3, numel, 4);
    }
    return st;
}

static void layernorm_rows(void *vc, int64_t lo, int64_t hi) {
    const rows_ctx *c = vc;
    int64_t len = c->len;
    const float *restrict scale = c->scale, *restrict bias = c->bias;
    for (int64_t row = lo; row < hi; row++) {
        const float *restrict x = c->x + row * len;
        float *restrict y = c->y + row * len;
        float mean = xpu_sumf(x, len) / (float)len;
        for (int64_t k = 0; k < len; k++) {
            float d = x[k] - mean;
            y[k] = d * d;
        }
        float rstd = 1.0f / sqrtf(xpu_sumf(y, len) / (float)len + c->epsilon);
        if (bias != NULL) {
            for (int64_t k = 0; k < len; k++) {
                y[k] = (x[k] - mean) * rstd * scale[k] + bias[k];
            }
        } else {
            for (int64_t k = 0; k < len; k++) {
                y[k] = (x[k] - mean) * rstd * scale[k];
            }
        }
    }
}

static void run_layernorm(const xpu_args *a) {
    rows_ctx c = {(const float *)a->ptr[0], (const float *)a->ptr[1], (const float *)a->ptr[2],
                  (float *)a->ptr[3], a->i[2], false, (float)a->f[0]};
    if (a->i[2] > 0) {
        xpu_parallel_for(a->i[1], 6.0 * (double)a->i[2], layernorm_rows, &c);
    }
}

/* ---- Reduce ------------------------------------------------------------------------------ */

enum { R_SUM, R_MEAN, R_MAX, R_MIN };

static int check_reduce_impl(const xpu_args *a, bool allow_int64) {
    if (a->ni < 2) {
        return xpu_check_counts(a, 2, 2, 0);
    }
    int st = xpu_check_ndim(a, a->i[1]);
    if (st != XPU_OK) {
        return st;
    }
    int nd = (int)a->i[1];
    st = xpu_check_counts(a, 2, 2 + 2 * nd, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], allow_int64);
    }
    int64_t numel = 0, kept[XPU_MAX_DIMS], out_numel = 0;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, nd, a->i + 2, &numel);
    }
    for (int d = 0; d < nd; d++) {
        kept[d] = a->i[2 + nd + d] ? 1 : a->i[2 + d];
    }
    if (st == XPU_OK) {
        st = xpu_check_numel(a, nd, kept, &out_numel);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 0, numel, xpu_dtype_size(a->i[0]));
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 1, out_numel, xpu_dtype_size(a->i[0]));
    }
    return st;
}

static int check_reduce_any(const xpu_args *a) { return check_reduce_impl(a, true); }
static int check_reduce_float(const xpu_args *a) { return check_reduce_impl(a, false); }

/* For every output element (kept-dimension odometer), fold the reduced sub-block. */
static void reduce_impl(const xpu_args *a, int op) {
    int nd = (int)a->i[1];
    const int64_t *shape = a->i + 2, *mask = a->i + 2 + nd;
    int64_t kshape[XPU_MAX_DIMS], kstride[XPU_MAX_DIMS], rshape[XPU_MAX_DIMS];
    int64_t rstride[XPU_MAX_DIMS], count = 1, stride = 1;
    int nk = 0, nr = 0;
    for (int d = nd - 1; d >= 0; d--) {
        if (mask[d]) {
            rshape[nr] = shape[d];
            rstride[nr++] = stride;
            count *= shape[d];
        } else {
            kshape[nk] = shape[d];
            kstride[nk++] = stride;
        }
        stride *= shape[d];
    }
    /* Collected innermost first; flip to row-major order for the odometers. */
    for (int d = 0; d < nk / 2; d++) {
        int64_t t = kshape[d];
        kshape[d] = kshape[nk - 1 - d];
        kshape[nk - 1 - d] = t;
        t = kstride[d];
        kstride[d] = kstride[nk - 1 - d];
        kstride[nk - 1 - d] = t;
    }
    for (int d = 0; d < nr / 2; d++) {
        int64_t t = rshape[d];
        rshape[d] = rshape[nr - 1 - d];
        rshape[nr - 1 - d] = t;
        t = rstride[d];
        rstride[d] = rstride[nr - 1 - d];
        rstride[nr - 1 - d] = t;
    }
    for (int d = 0; d < nk; d++) {
        if (kshape[d] == 0) {
            return; /* no output elements */
        }
    }
    bool is_int = a->i[0] == XPU_DTYPE_INT64;
    int64_t kidx[XPU_MAX_DIMS] = {0}, out = 0;
    do {
        int64_t base = 0;
        for (int d = 0; d < nk; d++) {
            base += kidx[d] * kstride[d];
        }
        double facc = op == R_MAX ? -INFINITY : op == R_MIN ? INFINITY : 0.0;
        uint64_t uacc = 0;
        int64_t iacc = op == R_MAX ? INT64_MIN : INT64_MAX;
        if (count > 0) {
            int64_t ridx[XPU_MAX_DIMS] = {0};
            do {
                int64_t off = base;
                for (int d = 0; d < nr; d++) {
                    off += ridx[d] * rstride[d];
                }
                if (is_int) {
                    int64_t v = ((const int64_t *)a->ptr[0])[off];
                    if (op == R_SUM) {
                        uacc += (uint64_t)v;
                    } else if (op == R_MAX) {
                        iacc = v > iacc ? v : iacc;
                    } else {
                        iacc = v < iacc ? v : iacc;
                    }
                } else {
                    float v = ((const float *)a->ptr[0])[off];
                    if (op == R_SUM || op == R_MEAN) {
                        facc += v;
                    } else if (isnan(v) || isnan(facc)) {
                        facc = NAN; /* NaN propagates, as in numpy.max */
                    } else if (op == R_MAX) {
                        facc = v > facc ? v : facc;
                    } else {
                        facc = v < facc ? v : facc;
                    }
                }
            } while (xpu_next_index(nr, rshape, ridx));
        }
        if (is_int) {
            ((int64_t *)a->ptr[1])[out++] = op == R_SUM ? (int64_t)uacc : iacc;
        } else {
            if (op == R_MEAN) {
                facc = facc / (double)count;
            }
            ((float *)a->ptr[1])[out++] = (float)facc;
        }
    } while (xpu_next_index(nk, kshape, kidx));
}

static void run_reduce_sum(const xpu_args *a) { reduce_impl(a, R_SUM); }
static void run_reduce_mean(const xpu_args *a) { reduce_impl(a, R_MEAN); }
static void run_reduce_max(const xpu_args *a) { reduce_impl(a, R_MAX); }
static void run_reduce_min(const xpu_args *a) { reduce_impl(a, R_MIN); }

/* ---- table ------------------------------------------------------------------------------- */

static const xpu_kernel_def kernels[] = {
    {"Softmax", check_softmax, run_softmax},
    {"LogSoftmax", check_softmax, run_log_softmax},
    {"LayerNormalization", check_layernorm, run_layernorm},
    {"ReduceSum", check_reduce_any, run_reduce_sum},
    {"ReduceMean", check_reduce_float, run_reduce_mean},
    {"ReduceMax", check_reduce_any, run_reduce_max},
    {"ReduceMin", check_reduce_any, run_reduce_min},
};

const xpu_kernel_def *xpu_reduce_kernels(int *count) {
    *count = (int)(sizeof kernels / sizeof kernels[0]);
    return kernels;
}
