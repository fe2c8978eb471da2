/*
 * xpu_parallel.c: the row-wise and element-wise kernels' split over the device's threads.
 *
 * xpu_parallel_for(n, work_per_item, fn, ctx) calls fn(ctx, lo, hi) over contiguous pieces of
 * [0, n), one per thread (xpu_get_num_threads(), the same count the sgemm uses), the first on
 * the calling thread. Below PARALLEL_MIN_WORK units of work in all it runs fn(ctx, 0, n) on the
 * caller: starting a thread costs tens of microseconds. Every item is computed by exactly one
 * call in the same way whatever the split, so results do not depend on the thread count. If a
 * thread cannot be started, the caller runs its piece too (a kernel cannot fail after launch).
 */
#include "xpu_internal.h"

#include <pthread.h>

#define MAX_PIECES 64
#define PARALLEL_MIN_WORK (1 << 16)

typedef struct piece {
    xpu_range_fn fn;
    void *ctx;
    int64_t lo, hi;
} piece;

static void *run_piece(void *arg) {
    const piece *p = arg;
    p->fn(p->ctx, p->lo, p->hi);
    return NULL;
}

void xpu_parallel_for(int64_t n, double work_per_item, xpu_range_fn fn, void *ctx) {
    int threads = xpu_get_num_threads();
    if (threads > MAX_PIECES) {
        threads = MAX_PIECES;
    }
    if ((double)n * work_per_item < PARALLEL_MIN_WORK) {
        threads = 1;
    }
    if (threads > n) {
        threads = (int)(n > 0 ? n : 1);
    }
    if (threads <= 1) {
        if (n > 0) {
            fn(ctx, 0, n);
        }
        return;
    }
    piece pieces[MAX_PIECES];
    pthread_t tid[MAX_PIECES];
    bool started[MAX_PIECES] = {false};
    for (int t = 0; t < threads; t++) {
        pieces[t] = (piece){fn, ctx, t * n / threads, (t + 1) * n / threads};
        if (t > 0) {
            started[t] = pthread_create(&tid[t], NULL, run_piece, &pieces[t]) == 0;
        }
    }
    run_piece(&pieces[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) {
            pthread_join(tid[t], NULL);
        } else {
            run_piece(&pieces[t]);
        }
    }
}
