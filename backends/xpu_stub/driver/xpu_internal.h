/*
 * xpu_internal.h: what the driver's C files share and the ABI does not show.
 *
 * A kernel is a pair of functions: `check` validates the launch arguments against the
 * buffers' sizes (it must prove every access in bounds, because `run` does not check), and
 * `run` computes. The queue calls `check` at launch time and `run` at synchronize time;
 * nothing can free a buffer in between because xpu_free drains the queue first.
 */
#ifndef ANYCHIP_XPU_INTERNAL_H
#define ANYCHIP_XPU_INTERNAL_H

#include "xpu.h"

#include <stdbool.h>

/* The arguments one launch carries, with handles already resolved to heap pointers. */
typedef struct xpu_args {
    const char *name;                /* kernel name, for messages */
    char *ptr[XPU_MAX_BUFS];         /* NULL where the handle was 0 (an absent optional input) */
    size_t nbytes[XPU_MAX_BUFS];     /* the allocation's requested size, 0 when absent */
    int nbufs;
    const int64_t *i;
    int ni;
    const double *f;
    int nf;
} xpu_args;

typedef struct xpu_kernel_def {
    const char *name;
    int (*check)(const xpu_args *a);
    void (*run)(const xpu_args *a);
} xpu_kernel_def;

/* One block of the heap, free or used; blocks tile the heap in address order. */
typedef struct xpu_block {
    size_t offset;
    size_t size;      /* reserved bytes, a multiple of XPU_ALIGN */
    size_t nbytes;    /* bytes the caller asked for: the bound every access is checked against */
    bool free;
    uint32_t slot;    /* handle-table slot while used */
    struct xpu_block *base; /* an alias (xpu_alias): the block it names bytes of; NULL: none */
    size_t aliases;   /* live aliases into this block (it cannot be freed before them) */
    struct xpu_block *prev;
    struct xpu_block *next;
} xpu_block;

/* A handle-table slot: a handle is (generation << 32) | (slot + 1), so 0 is never valid. */
typedef struct xpu_slot {
    xpu_block *block; /* NULL while the slot is free */
    uint32_t generation;
} xpu_slot;

typedef struct xpu_launch_rec {
    const xpu_kernel_def *kernel;
    xpu_args args;    /* owns copies of the int and float argument arrays */
} xpu_launch_rec;

struct xpu_device {
    char *heap;
    size_t capacity;
    size_t used;
    size_t peak;
    xpu_block *head;
    xpu_slot *slots;
    uint32_t n_slots;
    uint32_t cap_slots;
    uint32_t *free_slots; /* stack of reusable slot indices */
    uint32_t n_free_slots;
    xpu_launch_rec *queue;
    size_t queue_len;
    size_t queue_cap;
};

/* Sets the calling thread's last error and returns `status` (so `return xpu_fail(...)`). */
int xpu_fail(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Argument checks shared by the kernels; each returns XPU_OK or a failure status. */
int xpu_check_counts(const xpu_args *a, int nbufs, int ni, int nf);
int xpu_check_dtype(const xpu_args *a, int64_t dtype, bool allow_int64);
int xpu_check_ndim(const xpu_args *a, int64_t ndim);
int xpu_check_numel(const xpu_args *a, int ndim, const int64_t *shape, int64_t *numel);
int xpu_check_dense(const xpu_args *a, int buf, int64_t numel, size_t elsize);
int xpu_check_strided(const xpu_args *a, int buf, int ndim, const int64_t *shape,
                      const int64_t *strides, int64_t offset, size_t elsize);
size_t xpu_dtype_size(int64_t dtype);

/* Advances a row-major multi-index over `shape[0..ndim)`; returns false after the last one. */
static inline bool xpu_next_index(int ndim, const int64_t *shape, int64_t *idx) {
    for (int d = ndim - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) {
            return true;
        }
        idx[d] = 0;
    }
    return false;
}

/* fn(ctx, lo, hi) computes items [lo, hi); see xpu_parallel.c. */
typedef void (*xpu_range_fn)(void *ctx, int64_t lo, int64_t hi);

/* Runs fn over [0, n) in contiguous pieces on the device's threads when n * work_per_item is
 * large enough to pay for them, else on the caller. */
void xpu_parallel_for(int64_t n, double work_per_item, xpu_range_fn fn, void *ctx);

/* Kernel tables, one per kernel family file; the queue concatenates them. */
const xpu_kernel_def *xpu_elementwise_kernels(int *count);
const xpu_kernel_def *xpu_linalg_kernels(int *count);
const xpu_kernel_def *xpu_reduce_kernels(int *count);
const xpu_kernel_def *xpu_copy_kernels(int *count);
const xpu_kernel_def *xpu_attention_kernels(int *count);

/* Resolves a launch's handle to a heap pointer and size; handle 0 gives NULL and 0. */
int xpu_resolve_for_launch(xpu_device *dev, uint64_t handle, char **ptr, size_t *nbytes);

/* Queue hooks the memory calls use. */
void xpu_queue_drain(xpu_device *dev);
void xpu_queue_release(xpu_device *dev);

#endif
