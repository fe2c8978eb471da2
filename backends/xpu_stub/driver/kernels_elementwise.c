/*
 * kernels_elementwise.c: unary and broadcasting binary kernels, and Cast.
 *
 * Unary:  bufs [x, y]     iargs [dtype, n]                 y[i] = f(x[i]); x may equal y
 * Binary: bufs [a, b, y]  iargs [dtype, ndim, shape[ndim], a_strides[ndim], b_strides[ndim]]
 *         y is contiguous with `shape`; a and b are read through element strides, 0 on a
 *         broadcast dimension, so numpy broadcasting is the caller's stride computation.
 * Cast:   bufs [x, y]     iargs [src_dtype, dst_dtype, n]
 *
 * Integer arithmetic wraps (two's complement, like numpy) instead of overflowing into C's
 * undefined behaviour. Integer Div truncates toward zero (C and onnxruntime semantics);
 * division by zero gives 0 rather than a trap, because a kernel cannot fail after launch.
 */
#include "xpu_internal.h"

#include <math.h>

/* ---- scalar operations ------------------------------------------------------------------- */

static inline float f_relu(float x) { return x < 0.0f ? 0.0f : x; }
static inline float f_neg(float x) { return -x; }
static inline float f_abs(float x) { return fabsf(x); }
static inline float f_exp(float x) { return expf(x); }
static inline float f_log(float x) { return logf(x); }
static inline float f_sqrt(float x) { return sqrtf(x); }
static inline float f_tanh(float x) { return tanhf(x); }
static inline float f_erf(float x) { return erff(x); }
static inline float f_reciprocal(float x) { return 1.0f / x; }

/* Split by sign so that exp never overflows. */
static inline float f_sigmoid(float x) {
    if (x >= 0.0f) {
        return 1.0f / (1.0f + expf(-x));
    }
    float e = expf(x);
    return e / (1.0f + e);
}

static inline float f_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

static inline float f_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

static inline int64_t i_relu(int64_t x) { return x < 0 ? 0 : x; }
static inline int64_t i_neg(int64_t x) { return (int64_t)(0u - (uint64_t)x); }
static inline int64_t i_abs(int64_t x) { return x < 0 ? i_neg(x) : x; }

static inline float f_add(float x, float y) { return x + y; }
static inline float f_sub(float x, float y) { return x - y; }
static inline float f_mul(float x, float y) { return x * y; }
static inline float f_div(float x, float y) { return x / y; }
static inline float f_pow(float x, float y) { return powf(x, y); }
/* NaN propagates, as numpy.maximum / numpy.minimum and onnxruntime do. */
static inline float f_max(float x, float y) { return (isnan(x) || x > y) ? x : y; }
static inline float f_min(float x, float y) { return (isnan(x) || x < y) ? x : y; }

static inline int64_t i_add(int64_t x, int64_t y) { return (int64_t)((uint64_t)x + (uint64_t)y); }
static inline int64_t i_sub(int64_t x, int64_t y) { return (int64_t)((uint64_t)x - (uint64_t)y); }
static inline int64_t i_mul(int64_t x, int64_t y) { return (int64_t)((uint64_t)x * (uint64_t)y); }
static inline int64_t i_max(int64_t x, int64_t y) { return x > y ? x : y; }
static inline int64_t i_min(int64_t x, int64_t y) { return x < y ? x : y; }

static inline int64_t i_div(int64_t x, int64_t y) {
    if (y == 0) {
        return 0;
    }
    if (y == -1) {
        return i_neg(x); /* INT64_MIN / -1 traps in C; numpy wraps */
    }
    return x / y;
}

/* Exponentiation by squaring; negative exponents give the truncated reciprocal. */
static inline int64_t i_pow(int64_t x, int64_t y) {
    if (y < 0) {
        return x == 1 ? 1 : x == -1 ? ((y & 1) ? -1 : 1) : 0;
    }
    uint64_t result = 1, base = (uint64_t)x;
    while (y > 0) {
        if (y & 1) {
            result *= base;
        }
        base *= base;
        y >>= 1;
    }
    return (int64_t)result;
}

/* ---- unary ------------------------------------------------------------------------------- */

static int check_unary_impl(const xpu_args *a, bool allow_int64) {
    int st = xpu_check_counts(a, 2, 2, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], allow_int64);
    }
    if (st == XPU_OK) {
        size_t es = xpu_dtype_size(a->i[0]);
        st = xpu_check_dense(a, 0, a->i[1], es);
        if (st == XPU_OK) {
            st = xpu_check_dense(a, 1, a->i[1], es);
        }
    }
    return st;
}

static int check_unary_float(const xpu_args *a) { return check_unary_impl(a, false); }
static int check_unary_any(const xpu_args *a) { return check_unary_impl(a, true); }

#define UNARY_FLOAT(NAME, FN)                                                                  \
    static void run_##NAME(const xpu_args *a) {                                                \
        const float *x = (const float *)a->ptr[0];                                             \
        float *y = (float *)a->ptr[1];                                                         \
        for (int64_t k = 0; k < a->i[1]; k++) {                                                \
            y[k] = FN(x[k]);                                                                   \
        }                                                                                      \
    }

#define UNARY_ANY(NAME, FFN, IFN)                                                              \
    static void run_##NAME(const xpu_args *a) {                                                \
        if (a->i[0] == XPU_DTYPE_INT64) {                                                      \
            const int64_t *x = (const int64_t *)a->ptr[0];                                     \
            int64_t *y = (int64_t *)a->ptr[1];                                                 \
            for (int64_t k = 0; k < a->i[1]; k++) {                                            \
                y[k] = IFN(x[k]);                                                              \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        const float *x = (const float *)a->ptr[0];                                             \
        float *y = (float *)a->ptr[1];                                                         \
        for (int64_t k = 0; k < a->i[1]; k++) {                                                \
            y[k] = FFN(x[k]);                                                                  \
        }                                                                                      \
    }

UNARY_ANY(relu, f_relu, i_relu)
UNARY_ANY(neg, f_neg, i_neg)
UNARY_ANY(abs, f_abs, i_abs)
UNARY_FLOAT(exp, f_exp)
UNARY_FLOAT(log, f_log)
UNARY_FLOAT(sqrt, f_sqrt)
UNARY_FLOAT(tanh, f_tanh)
UNARY_FLOAT(sigmoid, f_sigmoid)
UNARY_FLOAT(erf, f_erf)
UNARY_FLOAT(reciprocal, f_reciprocal)
UNARY_FLOAT(gelu, f_gelu)
UNARY_FLOAT(gelu_tanh, f_gelu_tanh)

/* ---- binary with broadcasting ------------------------------------------------------------ */

static int check_binary(const xpu_args *a) {
    if (a->ni < 2) {
        return xpu_check_counts(a, 3, 2, 0);
    }
    int st = xpu_check_ndim(a, a->i[1]);
    if (st != XPU_OK) {
        return st;
    }
    int nd = (int)a->i[1];
    st = xpu_check_counts(a, 3, 2 + 3 * nd, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], true);
    }
    const int64_t *shape = a->i + 2;
    int64_t numel = 0;
    if (st == XPU_OK) {
        st = xpu_check_numel(a, nd, shape, &numel);
    }
    if (st != XPU_OK || numel == 0) {
        return st;
    }
    size_t es = xpu_dtype_size(a->i[0]);
    st = xpu_check_strided(a, 0, nd, shape, a->i + 2 + nd, 0, es);
    if (st == XPU_OK) {
        st = xpu_check_strided(a, 1, nd, shape, a->i + 2 + 2 * nd, 0, es);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 2, numel, es);
    }
    return st;
}

/* The outer dimensions walk an odometer; the innermost one is a plain strided loop. */
#define BINARY_LOOP(T, FN)                                                                     \
    do {                                                                                       \
        const T *A = (const T *)a->ptr[0];                                                     \
        const T *B = (const T *)a->ptr[1];                                                     \
        T *Y = (T *)a->ptr[2];                                                                 \
        if (nd == 0) {                                                                         \
            Y[0] = FN(A[0], B[0]);                                                             \
            break;                                                                             \
        }                                                                                      \
        int64_t idx[XPU_MAX_DIMS] = {0};                                                       \
        int64_t inner = shape[nd - 1], sa = as[nd - 1], sb = bs[nd - 1], out = 0;              \
        do {                                                                                   \
            int64_t oa = 0, ob = 0;                                                            \
            for (int d = 0; d < nd - 1; d++) {                                                 \
                oa += idx[d] * as[d];                                                          \
                ob += idx[d] * bs[d];                                                          \
            }                                                                                  \
            for (int64_t j = 0; j < inner; j++) {                                              \
                Y[out++] = FN(A[oa + j * sa], B[ob + j * sb]);                                 \
            }                                                                                  \
        } while (xpu_next_index(nd - 1, shape, idx));                                          \
    } while (0)

#define BINARY(NAME, FFN, IFN)                                                                 \
    static void run_##NAME(const xpu_args *a) {                                                \
        int nd = (int)a->i[1];                                                                 \
        const int64_t *shape = a->i + 2, *as = a->i + 2 + nd, *bs = a->i + 2 + 2 * nd;         \
        for (int d = 0; d < nd; d++) {                                                         \
            if (shape[d] == 0) {                                                               \
                return;                                                                        \
            }                                                                                  \
        }                                                                                      \
        if (a->i[0] == XPU_DTYPE_INT64) {                                                      \
            BINARY_LOOP(int64_t, IFN);                                                         \
        } else {                                                                               \
            BINARY_LOOP(float, FFN);                                                           \
        }                                                                                      \
    }

BINARY(add, f_add, i_add)
BINARY(sub, f_sub, i_sub)
BINARY(mul, f_mul, i_mul)
BINARY(div, f_div, i_div)
BINARY(pow, f_pow, i_pow)
BINARY(max, f_max, i_max)
BINARY(min, f_min, i_min)

/* ---- cast -------------------------------------------------------------------------------- */

static int check_cast(const xpu_args *a) {
    int st = xpu_check_counts(a, 2, 3, 0);
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[0], true);
    }
    if (st == XPU_OK) {
        st = xpu_check_dtype(a, a->i[1], true);
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 0, a->i[2], xpu_dtype_size(a->i[0]));
    }
    if (st == XPU_OK) {
        st = xpu_check_dense(a, 1, a->i[2], xpu_dtype_size(a->i[1]));
    }
    return st;
}

/* Out-of-range and NaN floats become INT64_MIN, what x86 hardware and numpy give. */
static inline int64_t f_to_i(float x) {
    return (isnan(x) || x >= 9.2233720368547758e18f || x < -9.2233720368547758e18f)
               ? INT64_MIN
               : (int64_t)x;
}

static void run_cast(const xpu_args *a) {
    int64_t n = a->i[2];
    if (a->i[0] == a->i[1]) {
        const char *x = a->ptr[0];
        char *y = a->ptr[1];
        for (int64_t k = 0; k < n * (int64_t)xpu_dtype_size(a->i[0]); k++) {
            y[k] = x[k];
        }
    } else if (a->i[0] == XPU_DTYPE_FLOAT32) {
        const float *x = (const float *)a->ptr[0];
        int64_t *y = (int64_t *)a->ptr[1];
        for (int64_t k = 0; k < n; k++) {
            y[k] = f_to_i(x[k]);
        }
    } else {
        const int64_t *x = (const int64_t *)a->ptr[0];
        float *y = (float *)a->ptr[1];
        for (int64_t k = 0; k < n; k++) {
            y[k] = (float)x[k];
        }
    }
}

/* ---- table ------------------------------------------------------------------------------- */

static const xpu_kernel_def kernels[] = {
    {"Relu", check_unary_any, run_relu},
    {"Neg", check_unary_any, run_neg},
    {"Abs", check_unary_any, run_abs},
    {"Exp", check_unary_float, run_exp},
    {"Log", check_unary_float, run_log},
    {"Sqrt", check_unary_float, run_sqrt},
    {"Tanh", check_unary_float, run_tanh},
    {"Sigmoid", check_unary_float, run_sigmoid},
    {"Erf", check_unary_float, run_erf},
    {"Reciprocal", check_unary_float, run_reciprocal},
    {"Gelu", check_unary_float, run_gelu},
    {"GeluTanh", check_unary_float, run_gelu_tanh},
    {"Add", check_binary, run_add},
    {"Sub", check_binary, run_sub},
    {"Mul", check_binary, run_mul},
    {"Div", check_binary, run_div},
    {"Pow", check_binary, run_pow},
    {"Max", check_binary, run_max},
    {"Min", check_binary, run_min},
    {"Cast", check_cast, run_cast},
};

const xpu_kernel_def *xpu_elementwise_kernels(int *count) {
    *count = (int)(sizeof kernels / sizeof kernels[0]);
    return kernels;
}
