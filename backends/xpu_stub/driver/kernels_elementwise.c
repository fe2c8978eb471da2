/*
 * kernels_elementwise.c: unary and broadcasting binary kernels, and Cast.
 *
 * Unary:  bufs [x, y]     iargs [dtype, n]                 y[i] = f(x[i]); x may equal y
 * Binary: bufs [a, b, y]  iargs [dtype, ndim, shape[ndim], a_strides[ndim], b_strides[ndim]]
 *         y is contiguous with `shape`; a and b are read through element strides, 0 on a
 *         broadcast dimension, so numpy broadcasting is the caller's stride computation.
 * Cast:   bufs [x, y]     iargs [src_dtype, dst_dtype, n]
 *
 * Exp, Tanh, Sigmoid and the tanh Gelu use xpu_vmath.h (vectorized, within a few ulp of
 * libm); Log, Erf, Pow and the erf Gelu call libm. Large tensors are split over the threads.
 *
 * Integer arithmetic wraps (two's complement, like numpy) instead of overflowing into C's
 * undefined behaviour. Integer Div truncates toward zero (C and onnxruntime semantics);
 * division by zero gives 0 rather than a trap, because a kernel cannot fail after launch.
 */
#include "xpu_internal.h"
#include "xpu_vmath.h"

#include <math.h>

/* ---- scalar operations ------------------------------------------------------------------- */

static inline float f_relu(float x) { return x < 0.0f ? 0.0f : x; }
static inline float f_neg(float x) { return -x; }
static inline float f_abs(float x) { return fabsf(x); }
static inline float f_exp(float x) { return xpu_expf(x); }
static inline float f_log(float x) { return logf(x); }
static inline float f_sqrt(float x) { return sqrtf(x); }
static inline float f_tanh(float x) { return xpu_tanhf(x); }
static inline float f_erf(float x) { return erff(x); }
static inline float f_reciprocal(float x) { return 1.0f / x; }

static inline float f_sigmoid(float x) { return xpu_sigmoidf(x); }

static inline float f_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }

static inline float f_gelu_tanh(float x) {
    const float c = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + xpu_tanhf(c * (x + 0.044715f * x * x * x)));
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

/* Unary kernels split [0, n) over the device's threads (xpu_parallel.c); each range is one
 * plain loop that gcc vectorizes where the function allows. */
typedef struct unary_ctx {
    const void *x;
    void *y;
} unary_ctx;

#define UNARY_RANGE(NAME, T, FN)                                                               \
    static void NAME(void *vc, int64_t lo, int64_t hi) {                                       \
        const unary_ctx *c = vc;                                                               \
        const T *x = (const T *)c->x;                                                          \
        T *y = (T *)c->y;                                                                      \
        for (int64_t k = lo; k < hi; k++) {                                                    \
            y[k] = FN(x[k]);                                                                   \
        }                                                                                      \
    }

#define UNARY_FLOAT(NAME, FN)                                                                  \
    UNARY_RANGE(NAME##_f32, float, FN)                                                         \
    static void run_##NAME(const xpu_args *a) {                                                \
        unary_ctx c = {a->ptr[0], a->ptr[1]};                                                  \
        xpu_parallel_for(a->i[1], 1.0, NAME##_f32, &c);                                        \
    }

#define UNARY_ANY(NAME, FFN, IFN)                                                              \
    UNARY_RANGE(NAME##_f32, float, FFN)                                                        \
    UNARY_RANGE(NAME##_i64, int64_t, IFN)                                                      \
    static void run_##NAME(const xpu_args *a) {                                                \
        unary_ctx c = {a->ptr[0], a->ptr[1]};                                                  \
        bool i64 = a->i[0] == XPU_DTYPE_INT64;                                                 \
        xpu_parallel_for(a->i[1], 1.0, i64 ? NAME##_i64 : NAME##_f32, &c);                     \
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

/* y's rows (all dimensions but the last) are split over the device's threads; each range
 * walks an odometer over its rows from the first one's index, and the last dimension is a loop
 * specialised for the common strides (both dense, one a broadcast scalar) so gcc vectorizes
 * it. */
typedef struct binary_ctx {
    const void *A, *B;
    void *Y;
    int nd;
    const int64_t *shape, *as, *bs;
} binary_ctx;

/* The multi-index of row `row` over shape[0, nd - 1). */
static void row_index(const binary_ctx *c, int64_t row, int64_t *idx) {
    for (int d = c->nd - 2; d >= 0; d--) {
        idx[d] = row % c->shape[d];
        row /= c->shape[d];
    }
}

#define BINARY_RANGE(NAME, T, FN)                                                              \
    static void NAME(void *vc, int64_t lo, int64_t hi) {                                       \
        const binary_ctx *c = vc;                                                              \
        int nd = c->nd;                                                                        \
        int64_t inner = c->shape[nd - 1], sa = c->as[nd - 1], sb = c->bs[nd - 1];              \
        int64_t idx[XPU_MAX_DIMS] = {0};                                                       \
        row_index(c, lo, idx);                                                                 \
        for (int64_t row = lo; row < hi; row++) {                                              \
            int64_t oa = 0, ob = 0;                                                            \
            for (int d = 0; d < nd - 1; d++) {                                                 \
                oa += idx[d] * c->as[d];                                                       \
                ob += idx[d] * c->bs[d];                                                       \
            }                                                                                  \
            const T *restrict a = (const T *)c->A + oa;                                        \
            const T *restrict b = (const T *)c->B + ob;                                        \
            T *restrict y = (T *)c->Y + row * inner;                                           \
            if (sa == 1 && sb == 1) {                                                          \
                for (int64_t j = 0; j < inner; j++) {                                          \
                    y[j] = FN(a[j], b[j]);                                                     \
                }                                                                              \
            } else if (sa == 1 && sb == 0) {                                                   \
                T bv = b[0];                                                                   \
                for (int64_t j = 0; j < inner; j++) {                                          \
                    y[j] = FN(a[j], bv);                                                       \
                }                                                                              \
            } else if (sa == 0 && sb == 1) {                                                   \
                T av = a[0];                                                                   \
                for (int64_t j = 0; j < inner; j++) {                                          \
                    y[j] = FN(av, b[j]);                                                       \
                }                                                                              \
            } else {                                                                           \
                for (int64_t j = 0; j < inner; j++) {                                          \
                    y[j] = FN(a[j * sa], b[j * sb]);                                           \
                }                                                                              \
            }                                                                                  \
            xpu_next_index(nd - 1, c->shape, idx);                                             \
        }                                                                                      \
    }

#define BINARY(NAME, FFN, IFN)                                                                 \
    BINARY_RANGE(NAME##_f32, float, FFN)                                                       \
    BINARY_RANGE(NAME##_i64, int64_t, IFN)                                                     \
    static void run_##NAME(const xpu_args *a) {                                                \
        int nd = (int)a->i[1];                                                                 \
        const int64_t *shape = a->i + 2;                                                       \
        bool i64 = a->i[0] == XPU_DTYPE_INT64;                                                 \
        if (nd == 0) {                                                                         \
            if (i64) {                                                                         \
                *(int64_t *)a->ptr[2] = IFN(*(int64_t *)a->ptr[0], *(int64_t *)a->ptr[1]);     \
            } else {                                                                           \
                *(float *)a->ptr[2] = FFN(*(float *)a->ptr[0], *(float *)a->ptr[1]);           \
            }                                                                                  \
            return;                                                                            \
        }                                                                                      \
        int64_t rows = 1;                                                                      \
        for (int d = 0; d < nd; d++) {                                                         \
            if (shape[d] == 0) {                                                               \
                return;                                                                        \
            }                                                                                  \
            rows *= d < nd - 1 ? shape[d] : 1;                                                 \
        }                                                                                      \
        binary_ctx c = {a->ptr[0], a->ptr[1], a->ptr[2], nd, shape, a->i + 2 + nd,             \
                        a->i + 2 + 2 * nd};                                                    \
        xpu_parallel_for(rows, (double)shape[nd - 1], i64 ? NAME##_i64 : NAME##_f32, &c);     \
    }

BINARY(add, f_add, i_add)
BINARY(sub, f_sub, i_sub)
BINARY(mul, f_mul, i_mul)
BINARY(div, f_div, i_div)
BINARY_RANGE(pow_f32, float, f_pow)
BINARY_RANGE(pow_i64, int64_t, i_pow)

/* x ** 2 and x ** 3 (a scalar exponent, as GELU's tanh form and squared norms write them) as
 * products, vectorized, like onnxruntime's Pow: powf per element is ~10 ns. */
static inline float f_square(float x, float y) { return (void)y, x * x; }
static inline float f_cube(float x, float y) { return (void)y, x * x * x; }
BINARY_RANGE(pow2_f32, float, f_square)
BINARY_RANGE(pow3_f32, float, f_cube)

static void run_pow(const xpu_args *a) {
    int nd = (int)a->i[1];
    const int64_t *shape = a->i + 2, *bs = a->i + 2 + 2 * nd;
    bool i64 = a->i[0] == XPU_DTYPE_INT64;
    if (nd == 0) {
        if (i64) {
            *(int64_t *)a->ptr[2] = i_pow(*(int64_t *)a->ptr[0], *(int64_t *)a->ptr[1]);
        } else {
            *(float *)a->ptr[2] = f_pow(*(float *)a->ptr[0], *(float *)a->ptr[1]);
        }
        return;
    }
    int64_t rows = 1;
    bool scalar_b = true;
    for (int d = 0; d < nd; d++) {
        if (shape[d] == 0) {
            return;
        }
        rows *= d < nd - 1 ? shape[d] : 1;
        scalar_b = scalar_b && (bs[d] == 0 || shape[d] == 1);
    }
    xpu_range_fn fn = i64 ? pow_i64 : pow_f32;
    if (!i64 && scalar_b) {
        float e = *(const float *)a->ptr[1];
        fn = e == 2.0f ? pow2_f32 : e == 3.0f ? pow3_f32 : fn;
    }
    binary_ctx c = {a->ptr[0], a->ptr[1], a->ptr[2], nd, shape, a->i + 2 + nd, bs};
    xpu_parallel_for(rows, (double)shape[nd - 1], fn, &c);
}
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
