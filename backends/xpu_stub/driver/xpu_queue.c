/*
 * xpu_queue.c: the kernel table, launch validation, and the in-order launch queue.
 *
 * xpu_launch resolves the handles, runs the kernel's `check` (which proves every access in
 * bounds), copies the argument arrays and appends the launch to the device queue. The queue
 * runs at xpu_synchronize, before any memory call, and when it reaches XPU_QUEUE_LIMIT.
 */
#include "xpu_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XPU_QUEUE_LIMIT 1024

/* ---- kernel table ------------------------------------------------------------------------ */

static const xpu_kernel_def *table[256];
static int table_len = 0;

static void add_family(const xpu_kernel_def *defs, int count) {
    for (int k = 0; k < count && table_len < (int)(sizeof table / sizeof table[0]); k++) {
        table[table_len++] = &defs[k];
    }
}

static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void fill_table(void) {
    int n;
    const xpu_kernel_def *defs;
    defs = xpu_elementwise_kernels(&n);
    add_family(defs, n);
    defs = xpu_linalg_kernels(&n);
    add_family(defs, n);
    defs = xpu_reduce_kernels(&n);
    add_family(defs, n);
    defs = xpu_copy_kernels(&n);
    add_family(defs, n);
    defs = xpu_attention_kernels(&n);
    add_family(defs, n);
}

static void build_table(void) { pthread_once(&table_once, fill_table); }

XPU_API int xpu_kernel_count(void) {
    build_table();
    return table_len;
}

XPU_API const char *xpu_kernel_name(int kernel_id) {
    build_table();
    return (kernel_id >= 0 && kernel_id < table_len) ? table[kernel_id]->name : NULL;
}

XPU_API int xpu_kernel_lookup(const char *name, int *kernel_id) {
    build_table();
    if (name == NULL || kernel_id == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_kernel_lookup: NULL argument");
    }
    for (int k = 0; k < table_len; k++) {
        if (strcmp(table[k]->name, name) == 0) {
            *kernel_id = k;
            return XPU_OK;
        }
    }
    return xpu_fail(XPU_ERR_UNKNOWN_KERNEL, "the XPU driver has no kernel named '%s'", name);
}

/* ---- argument checks --------------------------------------------------------------------- */

int xpu_check_counts(const xpu_args *a, int nbufs, int ni, int nf) {
    if (a->nbufs != nbufs || a->ni != ni || a->nf != nf) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "kernel %s expects %d buffers, %d int and %d float arguments; "
                        "got %d, %d and %d", a->name, nbufs, ni, nf, a->nbufs, a->ni, a->nf);
    }
    return XPU_OK;
}

size_t xpu_dtype_size(int64_t dtype) {
    return dtype == XPU_DTYPE_FLOAT32 ? 4 : dtype == XPU_DTYPE_INT64 ? 8 : 0;
}

int xpu_check_dtype(const xpu_args *a, int64_t dtype, bool allow_int64) {
    if (dtype == XPU_DTYPE_FLOAT32 || (allow_int64 && dtype == XPU_DTYPE_INT64)) {
        return XPU_OK;
    }
    return xpu_fail(XPU_ERR_INVALID_VALUE, "kernel %s does not support dtype code %lld (%s)",
                    a->name, (long long)dtype,
                    allow_int64 ? "float32=1 and int64=7 are supported" : "float32 only");
}

int xpu_check_ndim(const xpu_args *a, int64_t ndim) {
    if (ndim < 0 || ndim > XPU_MAX_DIMS) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "kernel %s: rank %lld is outside [0, %d]",
                        a->name, (long long)ndim, XPU_MAX_DIMS);
    }
    return XPU_OK;
}

int xpu_check_numel(const xpu_args *a, int ndim, const int64_t *shape, int64_t *numel) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) {
            return xpu_fail(XPU_ERR_INVALID_VALUE, "kernel %s: negative dimension %lld",
                            a->name, (long long)shape[d]);
        }
        if (shape[d] != 0 && n > INT64_MAX / 16 / shape[d]) {
            return xpu_fail(XPU_ERR_INVALID_VALUE, "kernel %s: element count overflows",
                            a->name);
        }
        n *= shape[d];
    }
    *numel = n;
    return XPU_OK;
}

static int need_buffer(const xpu_args *a, int buf) {
    if (buf >= a->nbufs || a->ptr[buf] == NULL) {
        return xpu_fail(XPU_ERR_INVALID_HANDLE, "kernel %s: buffer argument %d is missing",
                        a->name, buf);
    }
    return XPU_OK;
}

int xpu_check_dense(const xpu_args *a, int buf, int64_t numel, size_t elsize) {
    int st = need_buffer(a, buf);
    if (st != XPU_OK) {
        return st;
    }
    if (numel < 0 || (uint64_t)numel > a->nbytes[buf] / elsize) {
        return xpu_fail(XPU_ERR_OUT_OF_BOUNDS,
                        "kernel %s: buffer argument %d holds %zu bytes, the launch reads or "
                        "writes %lld elements of %zu bytes", a->name, buf, a->nbytes[buf],
                        (long long)numel, elsize);
    }
    return XPU_OK;
}

int xpu_check_strided(const xpu_args *a, int buf, int ndim, const int64_t *shape,
                      const int64_t *strides, int64_t offset, size_t elsize) {
    int st = need_buffer(a, buf);
    if (st != XPU_OK) {
        return st;
    }
    int64_t lo = offset, hi = offset;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] == 0) {
            return XPU_OK; /* an empty view touches nothing */
        }
        /* Bounded steps keep the extent arithmetic below from overflowing. */
        if (strides[d] > INT64_MAX / 4 / XPU_MAX_DIMS / shape[d] ||
            strides[d] < -(INT64_MAX / 4 / XPU_MAX_DIMS / shape[d])) {
            return xpu_fail(XPU_ERR_OUT_OF_BOUNDS, "kernel %s: stride %lld is out of range",
                            a->name, (long long)strides[d]);
        }
        int64_t span = (shape[d] - 1) * strides[d];
        if (span > 0) {
            hi += span;
        } else {
            lo += span;
        }
    }
    if (lo < 0 || (uint64_t)hi >= a->nbytes[buf] / elsize) {
        return xpu_fail(XPU_ERR_OUT_OF_BOUNDS,
                        "kernel %s: buffer argument %d holds %zu bytes, the launch touches "
                        "elements %lld..%lld of %zu bytes", a->name, buf, a->nbytes[buf],
                        (long long)lo, (long long)hi, elsize);
    }
    return XPU_OK;
}

/* ---- queue ------------------------------------------------------------------------------- */

static void release_rec(xpu_launch_rec *r) {
    free((void *)r->args.i);
    free((void *)r->args.f);
}

void xpu_queue_drain(xpu_device *dev) {
    for (size_t q = 0; q < dev->queue_len; q++) {
        dev->queue[q].kernel->run(&dev->queue[q].args);
        release_rec(&dev->queue[q]);
    }
    dev->queue_len = 0;
}

void xpu_queue_release(xpu_device *dev) {
    for (size_t q = 0; q < dev->queue_len; q++) {
        release_rec(&dev->queue[q]);
    }
    free(dev->queue);
    dev->queue = NULL;
    dev->queue_len = dev->queue_cap = 0;
}

XPU_API int xpu_launch(xpu_device *dev, int kernel_id, const uint64_t *bufs, int nbufs,
                       const int64_t *iargs, int niargs, const double *fargs, int nfargs) {
    build_table();
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_launch: the device is NULL");
    }
    if (kernel_id < 0 || kernel_id >= table_len) {
        return xpu_fail(XPU_ERR_UNKNOWN_KERNEL, "xpu_launch: no kernel has id %d", kernel_id);
    }
    const xpu_kernel_def *k = table[kernel_id];
    if (nbufs < 0 || nbufs > XPU_MAX_BUFS || niargs < 0 || nfargs < 0 ||
        (nbufs > 0 && bufs == NULL) || (niargs > 0 && iargs == NULL) ||
        (nfargs > 0 && fargs == NULL)) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "xpu_launch %s: bad argument counts (%d buffers, at most %d)", k->name,
                        nbufs, XPU_MAX_BUFS);
    }
    xpu_args a = {.name = k->name, .nbufs = nbufs, .ni = niargs, .nf = nfargs};
    for (int b = 0; b < nbufs; b++) {
        int st = xpu_resolve_for_launch(dev, bufs[b], &a.ptr[b], &a.nbytes[b]);
        if (st != XPU_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", xpu_last_error());
            return xpu_fail(st, "kernel %s, buffer argument %d: %s", k->name, b, why);
        }
    }
    /* Copies first, so that `check` and `run` read the same arrays the queue owns. */
    int64_t *icopy = malloc((size_t)(niargs > 0 ? niargs : 1) * sizeof *icopy);
    double *fcopy = malloc((size_t)(nfargs > 0 ? nfargs : 1) * sizeof *fcopy);
    if (icopy == NULL || fcopy == NULL) {
        free(icopy);
        free(fcopy);
        return xpu_fail(XPU_ERR_HOST, "xpu_launch %s: the host ran out of memory", k->name);
    }
    if (niargs > 0) {
        memcpy(icopy, iargs, (size_t)niargs * sizeof *icopy);
    }
    if (nfargs > 0) {
        memcpy(fcopy, fargs, (size_t)nfargs * sizeof *fcopy);
    }
    a.i = icopy;
    a.f = fcopy;
    int st = k->check(&a);
    if (st != XPU_OK) {
        free(icopy);
        free(fcopy);
        return st;
    }
    if (dev->queue_len == XPU_QUEUE_LIMIT) {
        xpu_queue_drain(dev);
    }
    if (dev->queue_len == dev->queue_cap) {
        size_t cap = dev->queue_cap ? dev->queue_cap * 2 : 16;
        xpu_launch_rec *q = realloc(dev->queue, cap * sizeof *q);
        if (q == NULL) {
            free(icopy);
            free(fcopy);
            return xpu_fail(XPU_ERR_HOST, "xpu_launch %s: the host ran out of memory", k->name);
        }
        dev->queue = q;
        dev->queue_cap = cap;
    }
    dev->queue[dev->queue_len].kernel = k;
    dev->queue[dev->queue_len].args = a;
    dev->queue_len++;
    return XPU_OK;
}

XPU_API int xpu_synchronize(xpu_device *dev) {
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_synchronize: the device is NULL");
    }
    xpu_queue_drain(dev);
    return XPU_OK;
}

XPU_API int xpu_queue_depth(xpu_device *dev, size_t *pending) {
    if (dev == NULL || pending == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_queue_depth: NULL argument");
    }
    *pending = dev->queue_len;
    return XPU_OK;
}
