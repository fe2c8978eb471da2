/*
 * xpu_device.c: device lifetime, the heap allocator, handles and memory copies.
 *
 * The heap is one host allocation made at xpu_init. Blocks tile it in address order in a
 * doubly-linked list kept OUTSIDE the heap, so nothing written into device memory can corrupt
 * the allocator. Allocation is first-fit with splitting; freeing coalesces with both free
 * neighbours, so freeing everything always returns the heap to a single free block.
 */
#define _POSIX_C_SOURCE 200112L /* posix_memalign */

#include "xpu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char last_error[1024] = "no error";

int xpu_fail(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

XPU_API const char *xpu_last_error(void) { return last_error; }

/* ---- lifetime ---------------------------------------------------------------------------- */

XPU_API int xpu_init(size_t heap_bytes, xpu_device **dev) {
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_init: the device out-pointer is NULL");
    }
    *dev = NULL;
    size_t capacity = heap_bytes / XPU_ALIGN * XPU_ALIGN;
    if (capacity == 0) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "xpu_init: heap size %zu bytes is smaller than one %d-byte block",
                        heap_bytes, XPU_ALIGN);
    }
    xpu_device *d = calloc(1, sizeof *d);
    xpu_block *all = calloc(1, sizeof *all);
    void *heap = NULL;
    if (d == NULL || all == NULL || posix_memalign(&heap, XPU_ALIGN, capacity) != 0) {
        free(d);
        free(all);
        return xpu_fail(XPU_ERR_HOST,
                        "xpu_init: the host could not reserve a %zu-byte device heap; "
                        "ask for a smaller heap", capacity);
    }
    all->offset = 0;
    all->size = capacity;
    all->free = true;
    d->heap = heap;
    d->capacity = capacity;
    d->head = all;
    *dev = d;
    return XPU_OK;
}

XPU_API int xpu_shutdown(xpu_device *dev) {
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_shutdown: the device is NULL");
    }
    xpu_queue_release(dev);
    for (uint32_t i = 0; i < dev->n_slots; i++) {
        if (dev->slots[i].block != NULL && dev->slots[i].block->base != NULL) {
            free(dev->slots[i].block); /* aliases are not in the block list */
        }
    }
    for (xpu_block *b = dev->head; b != NULL;) {
        xpu_block *next = b->next;
        free(b);
        b = next;
    }
    free(dev->slots);
    free(dev->free_slots);
    free(dev->heap);
    free(dev);
    return XPU_OK;
}

/* ---- handles ----------------------------------------------------------------------------- */

static int resolve(xpu_device *dev, uint64_t handle, xpu_block **out) {
    uint64_t index = (handle & 0xffffffffu);
    uint32_t generation = (uint32_t)(handle >> 32);
    if (index == 0 || index > dev->n_slots || dev->slots[index - 1].block == NULL ||
        dev->slots[index - 1].generation != generation) {
        return xpu_fail(XPU_ERR_INVALID_HANDLE,
                        "invalid device handle 0x%llx: it was never allocated on this device "
                        "or has already been freed", (unsigned long long)handle);
    }
    *out = dev->slots[index - 1].block;
    return XPU_OK;
}

/* Resolves a handle for a kernel launch: 0 means an absent optional buffer. */
int xpu_resolve_for_launch(xpu_device *dev, uint64_t handle, char **ptr, size_t *nbytes) {
    if (handle == 0) {
        *ptr = NULL;
        *nbytes = 0;
        return XPU_OK;
    }
    xpu_block *b = NULL;
    int st = resolve(dev, handle, &b);
    if (st != XPU_OK) {
        return st;
    }
    *ptr = dev->heap + b->offset;
    *nbytes = b->nbytes;
    return XPU_OK;
}

static int take_slot(xpu_device *dev, uint32_t *slot) {
    if (dev->n_free_slots > 0) {
        *slot = dev->free_slots[--dev->n_free_slots];
        return XPU_OK;
    }
    if (dev->n_slots == dev->cap_slots) {
        uint32_t cap = dev->cap_slots ? dev->cap_slots * 2 : 64;
        xpu_slot *slots = realloc(dev->slots, cap * sizeof *slots);
        if (slots == NULL) {
            return xpu_fail(XPU_ERR_HOST, "xpu_malloc: the host ran out of memory for handles");
        }
        dev->slots = slots;
        uint32_t *free_slots = realloc(dev->free_slots, cap * sizeof *free_slots);
        if (free_slots == NULL) {
            return xpu_fail(XPU_ERR_HOST, "xpu_malloc: the host ran out of memory for handles");
        }
        dev->free_slots = free_slots;
        dev->cap_slots = cap;
    }
    *slot = dev->n_slots++;
    dev->slots[*slot].generation = 1;
    return XPU_OK;
}

/* ---- allocator --------------------------------------------------------------------------- */

static size_t largest_free(const xpu_device *dev) {
    size_t best = 0;
    for (const xpu_block *b = dev->head; b != NULL; b = b->next) {
        if (b->free && b->size > best) {
            best = b->size;
        }
    }
    return best;
}

XPU_API int xpu_malloc(xpu_device *dev, size_t nbytes, uint64_t *handle) {
    if (dev == NULL || handle == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_malloc: NULL device or handle pointer");
    }
    *handle = 0;
    if (nbytes > dev->capacity) {
        return xpu_fail(XPU_ERR_OUT_OF_MEMORY,
                        "out of device memory: requested %zu bytes, %zu of %zu bytes free "
                        "(largest free block %zu bytes)", nbytes, dev->capacity - dev->used,
                        dev->capacity, largest_free(dev));
    }
    /* Zero-byte tensors still get a real block, so their handle is as valid as any other. */
    size_t need = nbytes == 0 ? XPU_ALIGN : (nbytes + XPU_ALIGN - 1) / XPU_ALIGN * XPU_ALIGN;
    xpu_block *b = dev->head;
    while (b != NULL && !(b->free && b->size >= need)) {
        b = b->next;
    }
    if (b == NULL) {
        return xpu_fail(XPU_ERR_OUT_OF_MEMORY,
                        "out of device memory: requested %zu bytes, %zu of %zu bytes free "
                        "(largest free block %zu bytes)", nbytes, dev->capacity - dev->used,
                        dev->capacity, largest_free(dev));
    }
    uint32_t slot = 0;
    int st = take_slot(dev, &slot);
    if (st != XPU_OK) {
        return st;
    }
    if (b->size > need) {
        xpu_block *rest = calloc(1, sizeof *rest);
        if (rest == NULL) {
            dev->free_slots[dev->n_free_slots++] = slot;
            return xpu_fail(XPU_ERR_HOST, "xpu_malloc: the host ran out of memory for blocks");
        }
        rest->offset = b->offset + need;
        rest->size = b->size - need;
        rest->free = true;
        rest->prev = b;
        rest->next = b->next;
        if (b->next != NULL) {
            b->next->prev = rest;
        }
        b->next = rest;
        b->size = need;
    }
    b->free = false;
    b->nbytes = nbytes;
    b->slot = slot;
    dev->slots[slot].block = b;
    dev->used += b->size;
    if (dev->used > dev->peak) {
        dev->peak = dev->used;
    }
    *handle = ((uint64_t)dev->slots[slot].generation << 32) | (uint64_t)(slot + 1);
    return XPU_OK;
}

/* Merges `b` with its successor, which must be free. */
static void merge_next(xpu_block *b) {
    xpu_block *n = b->next;
    b->size += n->size;
    b->next = n->next;
    if (n->next != NULL) {
        n->next->prev = b;
    }
    free(n);
}

XPU_API int xpu_free(xpu_device *dev, uint64_t handle) {
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_free: the device is NULL");
    }
    xpu_block *b = NULL;
    int st = resolve(dev, handle, &b);
    if (st != XPU_OK) {
        return st;
    }
    if (b->base != NULL) {
        /* An alias: its bytes stay in the base block, which queued launches keep using. */
        xpu_slot *s = &dev->slots[b->slot];
        s->block = NULL;
        s->generation = s->generation == UINT32_MAX ? 1 : s->generation + 1;
        dev->free_slots[dev->n_free_slots++] = b->slot;
        b->base->aliases--;
        free(b);
        return XPU_OK;
    }
    if (b->aliases > 0) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "xpu_free: 0x%llx still has %zu alias(es); free them first",
                        (unsigned long long)handle, b->aliases);
    }
    xpu_queue_drain(dev); /* queued launches hold pointers into this block */
    xpu_slot *s = &dev->slots[b->slot];
    s->block = NULL;
    s->generation = s->generation == UINT32_MAX ? 1 : s->generation + 1;
    dev->free_slots[dev->n_free_slots++] = b->slot;
    dev->used -= b->size;
    b->free = true;
    b->nbytes = 0;
    if (b->next != NULL && b->next->free) {
        merge_next(b);
    }
    if (b->prev != NULL && b->prev->free) {
        merge_next(b->prev);
    }
    return XPU_OK;
}

/* A handle naming bytes [offset, offset + nbytes) of the block `base` (planned memory: one
 * block per partition, one alias per tensor). Freeing an alias neither drains the queue nor
 * returns memory; the base cannot be freed while it has aliases. */
XPU_API int xpu_alias(xpu_device *dev, uint64_t base, size_t offset, size_t nbytes,
                      uint64_t *handle) {
    if (dev == NULL || handle == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_alias: NULL device or handle pointer");
    }
    *handle = 0;
    xpu_block *b = NULL;
    int st = resolve(dev, base, &b);
    if (st != XPU_OK) {
        return st;
    }
    if (b->base != NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_alias: 0x%llx is itself an alias",
                        (unsigned long long)base);
    }
    if (offset > b->nbytes || nbytes > b->nbytes - offset) {
        return xpu_fail(XPU_ERR_OUT_OF_BOUNDS,
                        "xpu_alias: %zu bytes at offset %zu fall outside the %zu-byte buffer "
                        "0x%llx", nbytes, offset, b->nbytes, (unsigned long long)base);
    }
    xpu_block *a = calloc(1, sizeof *a);
    if (a == NULL) {
        return xpu_fail(XPU_ERR_HOST, "xpu_alias: the host ran out of memory for blocks");
    }
    uint32_t slot = 0;
    st = take_slot(dev, &slot);
    if (st != XPU_OK) {
        free(a);
        return st;
    }
    a->offset = b->offset + offset;
    a->nbytes = nbytes;
    a->base = b;
    a->slot = slot;
    b->aliases++;
    dev->slots[slot].block = a;
    *handle = ((uint64_t)dev->slots[slot].generation << 32) | (uint64_t)(slot + 1);
    return XPU_OK;
}

XPU_API int xpu_buffer_size(xpu_device *dev, uint64_t handle, size_t *nbytes) {
    if (dev == NULL || nbytes == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_buffer_size: NULL argument");
    }
    xpu_block *b = NULL;
    int st = resolve(dev, handle, &b);
    if (st == XPU_OK) {
        *nbytes = b->nbytes;
    }
    return st;
}

XPU_API int xpu_mem_info(xpu_device *dev, size_t *used, size_t *capacity, size_t *peak) {
    if (dev == NULL || used == NULL || capacity == NULL || peak == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_mem_info: NULL argument");
    }
    *used = dev->used;
    *capacity = dev->capacity;
    *peak = dev->peak;
    return XPU_OK;
}

XPU_API int xpu_heap_stats(xpu_device *dev, size_t *n_blocks, size_t *n_free_blocks,
                           size_t *largest) {
    if (dev == NULL || n_blocks == NULL || n_free_blocks == NULL || largest == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_heap_stats: NULL argument");
    }
    *n_blocks = 0;
    *n_free_blocks = 0;
    for (const xpu_block *b = dev->head; b != NULL; b = b->next) {
        ++*n_blocks;
        *n_free_blocks += b->free;
    }
    *largest = largest_free(dev);
    return XPU_OK;
}

/* ---- copies ------------------------------------------------------------------------------ */

static int check_range(xpu_device *dev, uint64_t handle, size_t offset, size_t n,
                       const char *what, char **ptr) {
    xpu_block *b = NULL;
    int st = resolve(dev, handle, &b);
    if (st != XPU_OK) {
        return st;
    }
    if (offset > b->nbytes || n > b->nbytes - offset) {
        return xpu_fail(XPU_ERR_OUT_OF_BOUNDS,
                        "%s: %zu bytes at offset %zu fall outside the %zu-byte buffer 0x%llx",
                        what, n, offset, b->nbytes, (unsigned long long)handle);
    }
    *ptr = dev->heap + b->offset + offset;
    return XPU_OK;
}

XPU_API int xpu_memcpy_htod(xpu_device *dev, uint64_t dst, size_t dst_offset, const void *src,
                            size_t n) {
    if (dev == NULL || (src == NULL && n > 0)) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_memcpy_htod: NULL device or source");
    }
    char *d;
    int st = check_range(dev, dst, dst_offset, n, "xpu_memcpy_htod destination", &d);
    if (st != XPU_OK) {
        return st;
    }
    xpu_queue_drain(dev);
    if (n > 0) {
        memcpy(d, src, n);
    }
    return XPU_OK;
}

XPU_API int xpu_memcpy_dtoh(xpu_device *dev, void *dst, uint64_t src, size_t src_offset,
                            size_t n) {
    if (dev == NULL || (dst == NULL && n > 0)) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_memcpy_dtoh: NULL device or destination");
    }
    char *s;
    int st = check_range(dev, src, src_offset, n, "xpu_memcpy_dtoh source", &s);
    if (st != XPU_OK) {
        return st;
    }
    xpu_queue_drain(dev);
    if (n > 0) {
        memcpy(dst, s, n);
    }
    return XPU_OK;
}

XPU_API int xpu_memcpy_dtod(xpu_device *dev, uint64_t dst, size_t dst_offset, uint64_t src,
                            size_t src_offset, size_t n) {
    if (dev == NULL) {
        return xpu_fail(XPU_ERR_INVALID_VALUE, "xpu_memcpy_dtod: the device is NULL");
    }
    char *d, *s;
    int st = check_range(dev, dst, dst_offset, n, "xpu_memcpy_dtod destination", &d);
    if (st == XPU_OK) {
        st = check_range(dev, src, src_offset, n, "xpu_memcpy_dtod source", &s);
    }
    if (st != XPU_OK) {
        return st;
    }
    xpu_queue_drain(dev);
    if (n > 0) {
        memmove(d, s, n); /* the ranges may overlap within one buffer */
    }
    return XPU_OK;
}
