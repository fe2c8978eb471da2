/*
 * kernels_copy.c: the strided copy that Transpose, Slice, Concat and Expand are made of.
 *
 * Copy: bufs [src, dst]
 *       iargs [elsize, ndim, shape[ndim], src_strides[ndim], src_offset,
 *              dst_strides[ndim], dst_offset]
 *       dst[dst_offset + sum(idx * dst_strides)] = src[src_offset + sum(idx * src_strides)]
 *       for every index of `shape`; offsets and strides count elements of `elsize` bytes
 *       (1, 2, 4 or 8: the kernel moves bits, so it serves every dtype). Strides may be
 *       negative (reversed slices) or 0 (broadcast reads). src and dst must differ.
 *
 * Transpose permutes the source strides, Slice starts at an offset with step-scaled strides,
 * Concat copies each input into an offset window of the output, Expand reads with 0 strides.
 */
#include "xpu_internal.h"

#include <string.h>

static int check_copy(const xpu_args *a) {
    if (a->ni < 2) {
        return xpu_check_counts(a, 2, 4, 0);
    }
    int st = xpu_check_ndim(a, a->i[1]);
    if (st != XPU_OK) {
        return st;
    }
    int nd = (int)a->i[1];
    st = xpu_check_counts(a, 2, 4 + 3 * nd, 0);
    if (st != XPU_OK) {
        return st;
    }
    int64_t es = a->i[0];
    if (es != 1 && es != 2 && es != 4 && es != 8) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "kernel Copy: element size %lld is not 1, 2, 4 or 8 bytes", (long long)es);
    }
    if (a->ptr[0] != NULL && a->ptr[0] == a->ptr[1]) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "kernel Copy: source and destination are the same buffer; copy "
                        "through a temporary buffer");
    }
    const int64_t *shape = a->i + 2;
    int64_t numel;
    st = xpu_check_numel(a, nd, shape, &numel);
    if (st == XPU_OK) {
        st = xpu_check_strided(a, 0, nd, shape, a->i + 2 + nd, a->i[2 + 2 * nd], (size_t)es);
    }
    if (st == XPU_OK) {
        st = xpu_check_strided(a, 1, nd, shape, a->i + 3 + 2 * nd, a->i[3 + 3 * nd],
                               (size_t)es);
    }
    return st;
}

#define COPY_LOOP(T)                                                                           \
    do {                                                                                       \
        const T *S = (const T *)a->ptr[0];                                                     \
        T *D = (T *)a->ptr[1];                                                                 \
        if (nd == 0) {                                                                         \
            D[doff] = S[soff];                                                                 \
            break;                                                                             \
        }                                                                                      \
        int64_t idx[XPU_MAX_DIMS] = {0};                                                       \
        int64_t inner = shape[nd - 1], si = ss[nd - 1], di = ds[nd - 1];                       \
        do {                                                                                   \
            int64_t s = soff, d = doff;                                                        \
            for (int k = 0; k < nd - 1; k++) {                                                 \
                s += idx[k] * ss[k];                                                           \
                d += idx[k] * ds[k];                                                           \
            }                                                                                  \
            if (si == 1 && di == 1) {                                                          \
                memcpy(D + d, S + s, (size_t)inner * sizeof(T));                               \
            } else {                                                                           \
                for (int64_t j = 0; j < inner; j++) {                                          \
                    D[d + j * di] = S[s + j * si];                                             \
                }                                                                              \
            }                                                                                  \
        } while (xpu_next_index(nd - 1, shape, idx));                                          \
    } while (0)

static void run_copy(const xpu_args *a) {
    int nd = (int)a->i[1];
    const int64_t *shape = a->i + 2, *ss = a->i + 2 + nd, *ds = a->i + 3 + 2 * nd;
    int64_t soff = a->i[2 + 2 * nd], doff = a->i[3 + 3 * nd];
    for (int k = 0; k < nd; k++) {
        if (shape[k] == 0) {
            return;
        }
    }
    switch (a->i[0]) {
    case 1:
        COPY_LOOP(uint8_t);
        break;
    case 2:
        COPY_LOOP(uint16_t);
        break;
    case 4:
        COPY_LOOP(uint32_t);
        break;
    default:
        COPY_LOOP(uint64_t);
        break;
    }
}

static const xpu_kernel_def kernels[] = {
    {"Copy", check_copy, run_copy},
};

const xpu_kernel_def *xpu_copy_kernels(int *count) {
    *count = (int)(sizeof kernels / sizeof kernels[0]);
    return kernels;
}
