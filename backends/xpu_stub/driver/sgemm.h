/*
 * sgemm.h: the float32 matrix product shared by the MatMul and Gemm kernels.
 *
 * sgemm.c computes one product on one thread (blocked, register tiled); sgemm_threads.c runs
 * a list of products on the configured number of threads.
 */
#ifndef ANYCHIP_XPU_SGEMM_H
#define ANYCHIP_XPU_SGEMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Y = A' B': A'[i, k] = A[i * rsa + k * csa], B'[k, j] = B[k * rsb + j * csb], Y row-major. */
typedef struct xpu_sgemm {
    int64_t M, N, K;
    const float *A;
    int64_t rsa, csa;
    const float *B;
    int64_t rsb, csb;
    float *Y;
    int64_t ldy;
} xpu_sgemm;

/* Floats of packing workspace xpu_sgemm_serial needs for g (0: none). */
size_t xpu_sgemm_work_floats(const xpu_sgemm *g);

/* One product on the calling thread; `work` holds xpu_sgemm_work_floats(g) floats (NULL:
 * plain loops, used only when that allocation failed). */
void xpu_sgemm_serial(const xpu_sgemm *g, float *work);

/* The granularity (in rows, or in columns when along_n) at which g may be split: pieces cut
 * at multiples of it compute every element exactly as the whole product would. */
int64_t xpu_sgemm_split_unit(const xpu_sgemm *g, bool along_n);

/* Products of at most this many rows take the unpacked path (which rounds differently). */
int64_t xpu_sgemm_small_m(void);

/* Runs `count` independent products, on up to xpu_get_num_threads() threads when the work is
 * large enough. Never fails: if threads or memory are short it computes on the caller. */
void xpu_sgemm_run(const xpu_sgemm *probs, int64_t count);

#endif
