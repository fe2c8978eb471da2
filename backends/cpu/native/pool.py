"""A small thread pool for generated C whose caller never waits for a thread to wake.

A kernel splits its work into chunks and calls ``ac_pool_run(fn, ctx, chunks, threads)``
(its address is passed to the kernel as an integer). The caller publishes the job, wakes the
pool's sleeping threads and starts taking chunks itself at once; each thread that wakes takes
chunks until none are left. So a thread that wakes late (60-100 us after a futex wake on this
VM, or never while other processes hold the cores) only takes fewer chunks: the call costs at
most the one-thread time plus a wake-up call (a few us) and waits, at the end, only for chunks
already running. An OpenMP parallel region instead waits for every thread of the team to
arrive (``bench/codegen_threads.py`` measured both). The caller waits spinning, then, past
``AC_BLOCK_NS`` (100 us; ``block_after``), asleep until the thread that ends the last chunk
wakes it: a thread preempted with its chunk (another process took its core) stayed queued
behind that process while the caller's core was kept busy by a spinner; asleep, the caller
frees its core for it (SqueezeNet at two threads beside a process busy 30% of the time: 7.38
-> 7.00 ms, in one process alternated; idle, 2 of 4,722 calls slept).

Claims carry the job's generation (one 64-bit atomic: generation << 32 | next chunk), so a
thread that slept through a job and wakes during the next one never runs the old job's
chunks. After a job a thread spins for 50 us (``AC_SPIN_NS``) before it sleeps, so the next
kernel of a model, usually that close, starts it without a wake. When, twice in a row, the
pool's threads ran no chunk of a call, or its caller lost its core for over a fifth of its
own part, or waited over a quarter of the call for a preempted thread's chunk (the threads did
not run side by side: other processes hold the cores), calls run on their caller alone for
the next 4 ms (``AC_BACKOFF_NS``; a time, not a count of calls: 32 calls were sixteen runs of
the bench's LSTM, which makes one pool call a run), and
``try_parallel()`` tells the oneDNN splits to stay whole meanwhile. One job at a time: a call
while another runs (sessions in other Python threads) runs its chunks on its caller alone.
The pool's threads set their OpenMP count to one, so a oneDNN primitive run as a chunk
(``onednn/_parallel.py``) runs on that thread alone. Threads are made on first use, up to the
count asked (at most 64), and live as long as the process; a forked child makes its own.
Without a compiler ``address()`` is 0 and kernels run their chunks in turn.
"""

from __future__ import annotations

import contextlib
from typing import Any

from anychip.backends.cpu.native import omp
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import cc_key, load
from anychip.codegen.c_emitter import POOL_ABI

__all__ = [
    "address",
    "held",
    "paused",
    "pause",
    "pauses",
    "holders",
    "sleepers",
    "wanted",
    "stats",
    "try_parallel",
    "reset_backoff",
    "block_after",
    "back_off",
    "BACKOFF_SECONDS",
    "SOURCE_DECL",
]

#: What a kernel using the pool declares (C): the code generator's pool calling convention.
SOURCE_DECL = POOL_ABI

_SOURCE = (
    SOURCE_DECL
    + r"""
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define AC_MAX_THREADS 64
#ifndef AC_BACKOFF_NS
#define AC_BACKOFF_NS 4000000L
#endif
#ifndef AC_SPIN_NS
#define AC_SPIN_NS 50000L
#endif
#ifndef AC_BLOCK_NS
#define AC_BLOCK_NS 100000L
#endif
static pthread_mutex_t ac_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t ac_busy = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ac_cv = PTHREAD_COND_INITIALIZER;
static _Atomic unsigned long ac_gen = 0; /* written under ac_mu */
static int ac_sleepers = 0;              /* threads in pthread_cond_wait, under ac_mu */
static long ac_wakes = 0;                /* wakes without a job (a run's hold), under ac_mu */
static ac_chunk_fn ac_fn;                /* the job, under ac_mu */
static void *ac_ctx;
static long ac_chunks;
static _Atomic uint64_t ac_ticket;       /* (generation << 32) | next chunk */
static _Atomic long ac_done;             /* chunks finished in this generation */
static int ac_made = 0;                  /* threads made, under ac_busy */
static int ac_strikes = 0;               /* under ac_busy */
static _Atomic long ac_backoff = 0;      /* calls run on their caller alone until (ns) */
static _Atomic int ac_hold = 0;          /* runs in progress that keep the threads spinning */
static _Atomic int ac_prewake = 1;       /* a hold wakes sleeping threads (ac_pool_hold) */
static _Atomic long ac_wanted = 0;       /* calls that asked for threads (tried or run) */
static _Atomic int ac_pause = 0;         /* OpenMP teams at work: spinning threads sleep */
static _Atomic long ac_theirs;           /* chunks the pool's threads ran in this job */
/* A caller waiting for a chunk longer than ac_block_ns sleeps on ac_dcv (ac_waiter set), so
   its core is free for the preempted thread that runs it. */
static pthread_mutex_t ac_dmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t ac_dcv = PTHREAD_COND_INITIALIZER;
static _Atomic int ac_waiter = 0;
static _Atomic long ac_block_ns = AC_BLOCK_NS;
/* jobs run on the pool, chunks the pool's threads ran, ns the callers waited at the end,
   jobs run on the caller because of a backoff */
static _Atomic long ac_stats[5];

static long ac_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

static void ac_take(unsigned long gen, ac_chunk_fn fn, void *ctx, long chunks, int mine_only) {
    uint64_t t = atomic_load(&ac_ticket);
    for (;;) {
        if ((t >> 32) != (gen & 0xffffffffu) || (long)(t & 0xffffffffu) >= chunks) return;
        if (atomic_compare_exchange_weak(&ac_ticket, &t, t + 1)) {
            if (mine_only == 0) {
                atomic_fetch_add(&ac_stats[1], 1);
                atomic_fetch_add(&ac_theirs, 1);
            }
            fn(ctx, (long)(t & 0xffffffffu));
            atomic_fetch_add(&ac_done, 1);
            if (mine_only == 0 && atomic_load(&ac_waiter)) { /* the caller sleeps: wake it */
                pthread_mutex_lock(&ac_dmu);
                pthread_cond_signal(&ac_dcv);
                pthread_mutex_unlock(&ac_dmu);
            }
            t = atomic_load(&ac_ticket);
        }
    }
}

static long ac_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* Spin up to AC_SPIN_NS for the next job (a model's next kernel often follows within tens of
   us, and a futex wake costs the caller ~10 us and this thread ~60), then sleep. */
static void ac_wait(unsigned long seen) {
    for (;;) {
        /* Yielding each time round: a thread spinning on the core its caller waits for (the
           other core taken by another process) would hold that core for its whole slice. */
        long until = ac_ns() + AC_SPIN_NS;
        while (atomic_load(&ac_gen) == seen) {
            if (atomic_load(&ac_pause) > 0) break; /* leave the core to oneDNN's team */
            if (atomic_load(&ac_hold) > 0) until = ac_ns() + AC_SPIN_NS;
            else if (ac_ns() >= until) break;
            sched_yield();
        }
        pthread_mutex_lock(&ac_mu);
        const long woken = ac_wakes;
        ac_sleepers++;
        while (atomic_load(&ac_gen) == seen && ac_wakes == woken)
            pthread_cond_wait(&ac_cv, &ac_mu);
        ac_sleepers--;
        if (atomic_load(&ac_gen) != seen) return; /* a job: returns holding ac_mu */
        pthread_mutex_unlock(&ac_mu); /* woken by a run's hold: spin for its first job */
    }
}

static void *ac_worker(void *arg) {
    (void)arg;
#ifdef _OPENMP
    omp_set_num_threads(1);
#endif
    pthread_mutex_lock(&ac_mu);
    unsigned long seen = atomic_load(&ac_gen);
    pthread_mutex_unlock(&ac_mu);
    for (;;) {
        ac_wait(seen);  /* returns holding ac_mu */
        seen = atomic_load(&ac_gen);
        ac_chunk_fn fn = ac_fn;
        void *ctx = ac_ctx;
        long chunks = ac_chunks;
        pthread_mutex_unlock(&ac_mu);
        ac_take(seen, fn, ctx, chunks, 0);
    }
    return 0;
}

static void ac_serial(ac_chunk_fn fn, void *ctx, long chunks) {
    for (long c = 0; c < chunks; c++) fn(ctx, c);
}

/* 0 while backing off (counted in ac_stats[3]), else 1. */
static int ac_no_backoff(void) {
    const long until = atomic_load(&ac_backoff);
    if (until && ac_ns() < until) {
        atomic_fetch_add(&ac_stats[3], 1);
        return 0;
    }
    return 1;
}

/* A caller asking for threads (counted in ac_wanted): ac_no_backoff. */
int ac_pool_try(void) {
    atomic_fetch_add(&ac_wanted, 1);
    return ac_no_backoff();
}

/* A forked child has none of the parent's threads and may have copied a locked mutex. */
static void ac_after_fork(void) {
    pthread_mutex_init(&ac_mu, 0);
    pthread_mutex_init(&ac_busy, 0);
    pthread_cond_init(&ac_cv, 0);
    ac_made = 0;
    ac_sleepers = 0;
}

static pthread_once_t ac_once = PTHREAD_ONCE_INIT;
static void ac_init(void) { pthread_atfork(0, 0, ac_after_fork); }

void ac_pool_run(ac_chunk_fn fn, void *ctx, long chunks, int threads) {
    pthread_once(&ac_once, ac_init);
    if (threads > 1 && chunks > 1) atomic_fetch_add(&ac_wanted, 1);
    if (threads < 2 || chunks < 2 || pthread_mutex_trylock(&ac_busy) != 0) {
        ac_serial(fn, ctx, chunks);
        return;
    }
    if (!ac_no_backoff()) { /* no overlap lately: other processes hold the cores */
        pthread_mutex_unlock(&ac_busy);
        ac_serial(fn, ctx, chunks);
        return;
    }
    const long start = ac_ns();
    if (threads > AC_MAX_THREADS) threads = AC_MAX_THREADS;
    while (ac_made < threads - 1) {
        pthread_t t;
        if (pthread_create(&t, 0, ac_worker, 0) != 0) break;
        pthread_detach(t);
        ac_made++;
    }
    pthread_mutex_lock(&ac_mu);
    unsigned long gen = atomic_load(&ac_gen) + 1;
    ac_fn = fn;
    ac_ctx = ctx;
    ac_chunks = chunks;
    atomic_store(&ac_done, 0);
    atomic_store(&ac_theirs, 0);
    atomic_store(&ac_ticket, (uint64_t)(gen & 0xffffffffu) << 32);
    atomic_store(&ac_gen, gen);  /* a spinning thread sees it and takes ac_mu for the job */
    if (ac_sleepers) pthread_cond_broadcast(&ac_cv);
    pthread_mutex_unlock(&ac_mu);
    const long cpu0 = ac_cpu();
    ac_take(gen, fn, ctx, chunks, 1);
    const long cpu = ac_cpu() - cpu0;
    /* only chunks a thread is running are left: wait for them, spinning, then (a thread
       preempted with its chunk: another process took its core) asleep, which frees this
       core for it: a yielding spinner keeps its core busy, so the scheduler left the
       preempted thread queued behind the other process for the rest of its slice */
    const long mine = ac_ns();
    const long block = atomic_load(&ac_block_ns);
    for (long spins = 0; atomic_load(&ac_done) < chunks; spins++) {
        if (spins <= 64) continue;
        if (block > 0 && (spins & 15) == 0 && ac_ns() - mine > block) {
            pthread_mutex_lock(&ac_dmu);
            atomic_store(&ac_waiter, 1);
            while (atomic_load(&ac_done) < chunks) pthread_cond_wait(&ac_dcv, &ac_dmu);
            atomic_store(&ac_waiter, 0);
            pthread_mutex_unlock(&ac_dmu);
            atomic_fetch_add(&ac_stats[4], 1);
            break;
        }
        sched_yield();
    }
    /* No overlap: the pool's threads ran no chunk (late, or no core), the caller lost its
       core for over a fifth of its own part (a thread ran on it), or it waited over a
       quarter of the call for a preempted thread's chunk. Twice in a row: calls run on
       their caller alone for AC_BACKOFF_NS, a time rather than a count of calls (32 calls
       were sixteen runs of an LSTM, one pool call a run, and part of a CNN's run). Two
       thread-CPU clock reads a call (0.5 us each here; per chunk they cost 10% of a 100 us
       call). */
    const long end = ac_ns();
    atomic_fetch_add(&ac_stats[0], 1);
    atomic_fetch_add(&ac_stats[2], end - mine);
    const int apart = atomic_load(&ac_theirs) == 0 || cpu * 5 < (mine - start) * 4 ||
                      (end - mine) * 4 > end - start;
    ac_strikes = apart ? ac_strikes + 1 : 0;
    if (ac_strikes >= 2) {
        atomic_store(&ac_backoff, end + AC_BACKOFF_NS);
        ac_strikes = 0;
    }
    pthread_mutex_unlock(&ac_busy);
}

uintptr_t ac_pool_address(void) { return (uintptr_t)ac_pool_run; }
void ac_pool_reset(void) { atomic_store(&ac_backoff, 0); }
void ac_pool_block(long ns) { atomic_store(&ac_block_ns, ns); }
void ac_pool_back_off(void) { atomic_store(&ac_backoff, ac_ns() + AC_BACKOFF_NS); }
/* A run that holds the pool wakes its sleeping threads as it starts, so that the wake (60-100
   us here) overlaps the run's first nodes instead of delaying its first job. */
void ac_pool_hold(int delta) {
    atomic_fetch_add(&ac_hold, delta);
    if (delta <= 0 || !atomic_load(&ac_prewake)) return;
    pthread_once(&ac_once, ac_init); /* a forked child re-makes ac_mu before it locks it */
    pthread_mutex_lock(&ac_mu);
    if (ac_sleepers) {
        ac_wakes++;
        pthread_cond_broadcast(&ac_cv);
    }
    pthread_mutex_unlock(&ac_mu);
}
void ac_pool_prewake(int on) { atomic_store(&ac_prewake, on); }
int ac_pool_sleepers(void) {
    pthread_once(&ac_once, ac_init);
    pthread_mutex_lock(&ac_mu);
    const int n = ac_sleepers;
    pthread_mutex_unlock(&ac_mu);
    return n;
}
int ac_pool_holders(void) { return atomic_load(&ac_hold); }
long ac_pool_wanted(void) { return atomic_load(&ac_wanted); }
void ac_pool_pause(int delta) { atomic_fetch_add(&ac_pause, delta); }
int ac_pool_pauses(void) { return atomic_load(&ac_pause); }
void ac_pool_stats(long *out) { for (int i = 0; i < 5; i++) out[i] = atomic_load(&ac_stats[i]); }
"""
)
_CDEF = """uintptr_t ac_pool_address(void); void ac_pool_stats(long *out); int ac_pool_try(void);
void ac_pool_reset(void); void ac_pool_back_off(void); void ac_pool_hold(int delta);
void ac_pool_block(long ns);
void ac_pool_prewake(int on); int ac_pool_sleepers(void);
int ac_pool_holders(void);
long ac_pool_wanted(void); void ac_pool_pause(int delta);
int ac_pool_pauses(void)"""
_address: dict[object, int] = {}


def address() -> int:
    """``ac_pool_run``'s address for a kernel's ``pool`` argument; 0 without a compiler
    (``$CC`` is part of the key: tests hide it)."""
    key = cc_key()
    if key not in _address:
        omp.passive_wait()  # before libgomp loads with the library
        built: Any = load(_SOURCE, _CDEF, "ac_pool_address", openmp=True)
        _address[key] = 0 if built is None else int(built[2]())
        if built is not None:
            _keep.append(built)  # the library stays loaded while its address is handed out
    return _address[key]


_keep: list[Any] = []


def _lib(build: bool = True) -> Any | None:
    """The pool's loaded library, or None: with ``build``, None where ``address()`` is 0 (no
    compiler for this ``$CC``); without, None where it was never built (nothing is built)."""
    if build and not address():
        return None
    return _keep[-1][1] if _keep else None


def try_parallel() -> bool:
    """False while the pool backs off (counting this call down): the caller should run its
    work whole, on itself. True without a pool too (the parts then run in turn)."""
    lib = _lib()
    if lib is None:
        return True
    # recorded runs split: the replay's pool calls run on the caller alone while it backs off
    return bool(_replay.decide(lib.ac_pool_try, True))


class _Raised(contextlib.AbstractContextManager):
    """Inside, the pool's counter ``fn`` raised by one (nothing where ``fn`` is None). A
    class, not a ``contextlib`` generator: entered on every run of a CPU partition, where
    the generator's frame cost 2-3 us of a 20 us run."""

    __slots__ = ("fn",)

    def __init__(self, fn: Any | None) -> None:
        self.fn = fn

    def __enter__(self) -> None:
        if self.fn is not None:
            self.fn(1)

    def __exit__(self, *exc: object) -> None:
        if self.fn is not None:
            self.fn(-1)


def _raised(lib: Any | None, counter: str) -> _Raised:
    """Inside, the pool's ``counter`` raised by one (nothing without the library)."""
    return _Raised(None if lib is None else getattr(lib, counter))


def held() -> contextlib.AbstractContextManager[None]:
    """Inside, the pool's threads keep spinning between jobs instead of sleeping 50 us after
    one: a model's run, whose small kernels come tens to hundreds of us apart, then finds
    them awake at each (a futex wake costs a thread 60-100 us here). Entering wakes threads
    that sleep (the gap between runs outlasted their spin), so their wake overlaps the run's
    first nodes instead of delaying its first job: in the bench's interleaved rounds, two
    threads, against no wake, the LSTM 0.962 and 0.978, ShuffleNet-like 0.968 and 0.987,
    SqueezeNet 0.993 and 1.002. They yield the core at every turn of the spin, and sleep as
    before once no run holds them."""
    return _raised(_lib(), "ac_pool_hold")


def sleepers() -> int:
    """How many of the pool's threads sleep now (0 without the pool)."""
    lib = _lib(build=False)
    return 0 if lib is None else int(lib.ac_pool_sleepers())


def paused() -> contextlib.AbstractContextManager[None]:
    """Inside, the pool's spinning threads go to sleep at once, held or not: an OpenMP team
    (oneDNN's, above its work thresholds) needs every core, and a thread spinning beside it,
    even yielding, halved a 116M multiply-add convolution on two threads (1065 -> 1955 us).
    A pool never built has no threads to pause (nothing is built here)."""
    return _raised(_lib(build=False), "ac_pool_pause")


def pause(delta: int) -> None:
    """Raise (1) or lower (-1) the pool's pause count by hand, as ``paused()`` does on entry
    and exit (a replay switching it between recorded calls, ``backends/cpu/replay/record.py``)."""
    lib = _lib(build=False)
    if lib is not None:
        lib.ac_pool_pause(delta)


def wanted() -> int:
    """Calls that asked the pool for threads so far, run on it or not (0 without the pool):
    a run that changed it has work worth holding the pool for."""
    # asked twice per run of a CPU partition: the library's function kept per ``$CC`` and
    # library loaded (``_lib()``'s lookups cost 0.3 us a call)
    key = (cc_key(), len(_keep))
    fn = _wanted.get(key)
    if fn is None:
        lib = _lib()
        fn = _wanted[key] = _none if lib is None else lib.ac_pool_wanted
        key = (key[0], len(_keep))  # _lib() may have built the library just now
        _wanted[key] = fn
    return int(fn())


def _none() -> int:
    return 0


_wanted: dict[tuple[object, int], Any] = {}


def pauses() -> int:
    """How many OpenMP teams pause the pool now (0 without the pool)."""
    lib = _lib(build=False)
    return 0 if lib is None else int(lib.ac_pool_pauses())


def holders() -> int:
    """How many runs hold the pool awake now (0 without the pool)."""
    lib = _lib()
    return 0 if lib is None else int(lib.ac_pool_holders())


def block_after(ns: int) -> None:
    """A caller waiting for a running chunk sleeps after ``ns`` (0: never; it spins)."""
    lib = _lib()
    if lib is not None:
        lib.ac_pool_block(int(ns))


def reset_backoff() -> None:
    """End a backoff now (tests, benchmarks that switch thresholds)."""
    lib = _lib()
    if lib is not None:
        lib.ac_pool_reset()


def back_off() -> None:
    """Start a backoff now, as two calls without overlap do (tests)."""
    lib = _lib()
    if lib is not None:
        lib.ac_pool_back_off()


#: How long a backoff lasts, seconds (``AC_BACKOFF_NS``).
BACKOFF_SECONDS = 0.004


def stats() -> dict[str, int]:
    """Counters since the process started: ``jobs`` run on the pool, ``pool_chunks`` the
    pool's threads ran, ``wait_us`` the callers spent waiting for their chunks at the end,
    ``backoff_jobs`` run on their caller alone while backing off, ``slept_jobs`` whose caller
    waited asleep (zeros without the pool)."""
    lib = _lib()
    if lib is None:
        return dict.fromkeys(("jobs", "pool_chunks", "wait_us", "backoff_jobs", "slept_jobs"), 0)
    out = _keep[-1][0].new("long[5]")
    lib.ac_pool_stats(out)
    return {"jobs": out[0], "pool_chunks": out[1], "wait_us": out[2] // 1000,
            "backoff_jobs": out[3], "slept_jobs": out[4]}  # fmt: skip
