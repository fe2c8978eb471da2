/*
 * sgemm_threads.c: runs a list of float32 products (sgemm.c) on several threads (pthreads).
 *
 * Thread count: xpu_set_num_threads(n) if called with n > 0, else $ANYCHIP_XPU_THREADS, else
 * min(2, online cores). Work under PARALLEL_MIN multiply-adds in all stays on the calling
 * thread, where starting a thread would cost more than it saves.
 *
 * Split: the products are dealt out as contiguous runs, one per thread. When they do not
 * divide evenly and are few (a single product, say), each is first cut into `threads` pieces
 * along N (in whole tiles) or, when M is larger, along M; pieces write disjoint parts of Y.
 * Workspaces: worker t packs into slot t of a process-wide cache of buffers that grow and are
 * kept (a fresh allocation of this size is an mmap whose pages fault in on every call); a
 * slot in use by another launch (two devices computing at once) means a private buffer.
 */
#define _POSIX_C_SOURCE 200809L /* sysconf */

#include "sgemm.h"
#include "xpu_internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define MAX_THREADS 64
#define PARALLEL_MIN (1 << 21)

/* ---- configuration ------------------------------------------------------------------------ */

static atomic_int configured; /* 0: not set, use the default */
static int default_count = 1;
static pthread_once_t default_once = PTHREAD_ONCE_INIT;

static void read_default(void) {
    const char *env = getenv("ANYCHIP_XPU_THREADS");
    char *end = NULL;
    long n = env != NULL ? strtol(env, &end, 10) : 0;
    if (env != NULL && end != env && *end == '\0' && n > 0) {
        default_count = n > MAX_THREADS ? MAX_THREADS : (int)n;
        return;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    default_count = cores >= 2 ? 2 : 1;
}

XPU_API int xpu_set_num_threads(int n) {
    if (n < 0 || n > MAX_THREADS) {
        return xpu_fail(XPU_ERR_INVALID_VALUE,
                        "xpu_set_num_threads: %d is outside 0..%d (0 restores the default)", n,
                        MAX_THREADS);
    }
    atomic_store(&configured, n);
    return XPU_OK;
}

XPU_API int xpu_get_num_threads(void) {
    int n = atomic_load(&configured);
    if (n > 0) {
        return n;
    }
    pthread_once(&default_once, read_default);
    return default_count;
}

/* ---- workers ------------------------------------------------------------------------------ */

typedef struct job {
    const xpu_sgemm *probs;
    int64_t count;
    int slot;
} job;

typedef struct workspace {
    pthread_mutex_t lock;
    float *buf;
    size_t floats;
} workspace;

static workspace slots[MAX_THREADS];
static pthread_once_t slots_once = PTHREAD_ONCE_INIT;

static void init_slots(void) {
    for (int t = 0; t < MAX_THREADS; t++) {
        pthread_mutex_init(&slots[t].lock, NULL);
    }
}

static float *alloc_floats(size_t floats) {
    return aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
}

/* Runs probs[0, count) in order with slot `slot`'s workspace (grown to fit the largest). */
static void run_products(const xpu_sgemm *probs, int64_t count, int slot) {
    size_t floats = 0;
    for (int64_t p = 0; p < count; p++) {
        size_t f = xpu_sgemm_work_floats(&probs[p]);
        floats = f > floats ? f : floats;
    }
    pthread_once(&slots_once, init_slots);
    workspace *ws = &slots[slot];
    bool mine = floats > 0 && pthread_mutex_trylock(&ws->lock) == 0;
    float *work = NULL;
    if (mine && ws->floats < floats) {
        free(ws->buf);
        ws->buf = alloc_floats(floats);
        ws->floats = ws->buf != NULL ? floats : 0;
    }
    work = mine ? ws->buf : floats > 0 ? alloc_floats(floats) : NULL;
    for (int64_t p = 0; p < count; p++) {
        xpu_sgemm_serial(&probs[p], work);
    }
    if (mine) {
        pthread_mutex_unlock(&ws->lock);
    } else {
        free(work);
    }
}

static void *run_job(void *arg) {
    const job *j = arg;
    run_products(j->probs, j->count, j->slot);
    return NULL;
}

/* Thread t of `threads` runs probs[t * count / threads, (t + 1) * count / threads). */
static void deal(const xpu_sgemm *probs, int64_t count, int threads) {
    if (threads > count) {
        threads = (int)count;
    }
    job jobs[MAX_THREADS];
    pthread_t tid[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 0; t < threads; t++) {
        int64_t lo = t * count / threads, hi = (t + 1) * count / threads;
        jobs[t] = (job){probs + lo, hi - lo, t};
        if (t > 0) {
            started[t] = pthread_create(&tid[t], NULL, run_job, &jobs[t]) == 0;
        }
    }
    run_job(&jobs[0]);
    for (int t = 1; t < threads; t++) {
        if (started[t]) {
            pthread_join(tid[t], NULL);
        } else {
            run_job(&jobs[t]); /* no thread: the caller does this share too */
        }
    }
}

/* Cuts g into up to `parts` pieces along its larger dimension; returns how many. Cuts fall on
 * multiples of the split unit, and a last piece of few rows joins the one before (few rows
 * take another path), so every element comes out bit for bit as without the split. */
static int64_t split(const xpu_sgemm *g, int parts, xpu_sgemm *out) {
    bool along_n = g->N >= g->M;
    int64_t dim = along_n ? g->N : g->M, unit = xpu_sgemm_split_unit(g, along_n);
    int64_t step = ((dim + parts - 1) / parts + unit - 1) / unit * unit;
    int64_t n = 0;
    for (int64_t s = 0; s < dim; s += step) {
        int64_t len = dim - s < step ? dim - s : step;
        if (!along_n && s > 0 && len <= xpu_sgemm_small_m()) {
            out[n - 1].M += len;
            break;
        }
        xpu_sgemm p = *g;
        if (along_n) {
            p.N = len;
            p.B += s * g->csb;
            p.Y += s;
        } else {
            p.M = len;
            p.A += s * g->rsa;
            p.Y += s * g->ldy;
        }
        out[n++] = p;
    }
    return n;
}

void xpu_sgemm_run(const xpu_sgemm *probs, int64_t count) {
    int threads = xpu_get_num_threads();
    double work = 0.0;
    for (int64_t p = 0; p < count; p++) {
        work += (double)probs[p].M * (double)probs[p].N * (double)probs[p].K;
    }
    if (threads <= 1 || work < PARALLEL_MIN || count == 0) {
        run_products(probs, count, 0);
        return;
    }
    xpu_sgemm *pieces = NULL;
    if (count % threads != 0 && count < 8 * threads) {
        pieces = malloc((size_t)(count * threads) * sizeof *pieces);
    }
    if (pieces == NULL) {
        deal(probs, count, threads);
        return;
    }
    int64_t n = 0;
    for (int64_t p = 0; p < count; p++) {
        n += split(&probs[p], threads, pieces + n);
    }
    deal(pieces, n, threads);
    free(pieces);
}
