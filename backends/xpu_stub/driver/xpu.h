/*
 * xpu.h: the C ABI of the simulated XPU driver.
 *
 * The XPU is a kernel-launch accelerator simulated on the host. Each device owns ONE heap,
 * malloc'd once by xpu_init. Device memory is named by opaque 64-bit handles, never by host
 * pointers: a handle encodes a slot in the device's handle table and a generation counter, so
 * a stale or forged handle is reported as XPU_ERR_INVALID_HANDLE instead of touching memory.
 *
 * Every call returns an int status (XPU_OK = 0). On failure xpu_last_error() returns a message
 * for the calling thread (thread-local, valid until that thread's next driver call).
 *
 * Ordering: xpu_launch validates its arguments and enqueues the launch on the device queue;
 * queued launches run, in order, at xpu_synchronize. Every memory call (memcpy, free) first
 * drains the queue, like CUDA's legacy default stream, so a host that copies a result out
 * always sees the kernels launched before. A launch that passes validation cannot fail later.
 *
 * Threads: the float32 MatMul and Gemm kernels, and the element-wise, Softmax and
 * LayerNormalization kernels on large tensors, run on xpu_get_num_threads() host threads;
 * xpu_set_num_threads(n) sets that for the process (0 restores the default:
 * $ANYCHIP_XPU_THREADS, else min(2, online cores)).
 *
 * The block between the CDEF markers is read verbatim by driver.py and given to cffi's
 * ffi.cdef (with "XPU_API " removed): keep it free of other preprocessor lines.
 */
#ifndef ANYCHIP_XPU_H
#define ANYCHIP_XPU_H

#include <stddef.h>
#include <stdint.h>

#define XPU_API __attribute__((visibility("default")))

/* CDEF BEGIN */
#define XPU_OK 0
#define XPU_ERR_INVALID_VALUE 1
#define XPU_ERR_INVALID_HANDLE 2
#define XPU_ERR_OUT_OF_BOUNDS 3
#define XPU_ERR_OUT_OF_MEMORY 4
#define XPU_ERR_UNKNOWN_KERNEL 5
#define XPU_ERR_HOST 6

#define XPU_ALIGN 64
#define XPU_MAX_DIMS 16
#define XPU_MAX_BUFS 8

#define XPU_DTYPE_FLOAT32 1
#define XPU_DTYPE_INT64 7

typedef struct xpu_device xpu_device;

XPU_API const char *xpu_last_error(void);

XPU_API int xpu_init(size_t heap_bytes, xpu_device **dev);
XPU_API int xpu_shutdown(xpu_device *dev);

XPU_API int xpu_malloc(xpu_device *dev, size_t nbytes, uint64_t *handle);
XPU_API int xpu_free(xpu_device *dev, uint64_t handle);
XPU_API int xpu_alias(xpu_device *dev, uint64_t base, size_t offset, size_t nbytes,
                      uint64_t *handle);
XPU_API int xpu_buffer_size(xpu_device *dev, uint64_t handle, size_t *nbytes);
XPU_API int xpu_mem_info(xpu_device *dev, size_t *used, size_t *capacity, size_t *peak);
XPU_API int xpu_heap_stats(xpu_device *dev, size_t *n_blocks, size_t *n_free_blocks,
                           size_t *largest_free);

XPU_API int xpu_memcpy_htod(xpu_device *dev, uint64_t dst, size_t dst_offset, const void *src,
                            size_t n);
XPU_API int xpu_memcpy_dtoh(xpu_device *dev, void *dst, uint64_t src, size_t src_offset,
                            size_t n);
XPU_API int xpu_memcpy_dtod(xpu_device *dev, uint64_t dst, size_t dst_offset, uint64_t src,
                            size_t src_offset, size_t n);

XPU_API int xpu_kernel_count(void);
XPU_API const char *xpu_kernel_name(int kernel_id);
XPU_API int xpu_kernel_lookup(const char *name, int *kernel_id);
XPU_API int xpu_launch(xpu_device *dev, int kernel_id, const uint64_t *bufs, int nbufs,
                       const int64_t *iargs, int niargs, const double *fargs, int nfargs);
XPU_API int xpu_synchronize(xpu_device *dev);
XPU_API int xpu_queue_depth(xpu_device *dev, size_t *pending);

XPU_API int xpu_set_num_threads(int n);
XPU_API int xpu_get_num_threads(void);
/* CDEF END */

#endif
