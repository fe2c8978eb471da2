"""Several oneDNN primitives executed at once, one per thread of ``backends/cpu/native/pool.py``.

Made for work that oneDNN's own team splits badly: a recurrence at a small batch is one
fork-join per time step inside the primitive (with ``OMP_WAIT_POLICY=PASSIVE`` a wake of the
sleeping thread each, about 60 us on this VM), so ``rnn.py`` instead runs one primitive per
batch part and pays at most one wake for the whole sequence. That is how onnxruntime's LSTM
takes its second thread at batch 8 (its batch-parallel mode).

A small C helper, built by ``codegen.build``, hands the parts to the pool as chunks; each
calls ``dnnl_primitive_execute`` and ``dnnl_stream_wait`` through the addresses of the
functions cffi loaded (no oneDNN headers or link step). The caller takes parts itself, so a
pool thread that wakes late leaves its part to the caller. Each part has its own stream (a
stream is not shared between threads), its own primitive (memory objects are bound per
primitive) and its own scratchpad (oneDNN's is per thread, sized when a primitive is made:
``_prim.user_scratchpad``); the pool's threads run oneDNN on one OpenMP thread. Without a
compiler the parts run one after another, with the same results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.native.pool import SOURCE_DECL
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import check
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import loader

__all__ = [
    "run_all",
    "run_kept",
    "offset_buffers",
    "bound",
    "bound_runner",
    "Bound",
    "BOUND_ARGS",
    "RUNS",
]

#: Calls of ``run_all`` by how the parts ran ("together", or "in turn" without the helper).
RUNS: Counter[str] = Counter()

_SOURCE = r"""
typedef int (*ac_exec_t)(const void *, void *, int, const void *);
typedef int (*ac_wait_t)(void *);
typedef int (*ac_set_t)(void *, uintptr_t);
struct ac_exec_args {
    ac_exec_t ex;
    ac_wait_t wt;
    ac_set_t set;
    const uintptr_t *prims, *streams, *args, *mems, *ptrs;
    const int *nargs, *first;
    int *status;
};

static void ac_exec_one(void *p, long i) {
    const struct ac_exec_args *a = (const struct ac_exec_args *)p;
    /* bind part i's buffers on the thread that runs it (memory objects are per part) */
    for (int j = a->first[i]; j < a->first[i + 1]; j++) {
        int s = a->set((void *)a->mems[j], a->ptrs[j]);
        if (s != 0) {
            a->status[i] = s;
            return;
        }
    }
    int s = a->ex((const void *)a->prims[i], (void *)a->streams[i], a->nargs[i],
                  (const void *)a->args[i]);
    a->status[i] = s == 0 ? a->wt((void *)a->streams[i]) : s;
}

void ac_exec_all(int n, uintptr_t exec, uintptr_t wait, uintptr_t set, const uintptr_t *prims,
                 const uintptr_t *streams, const int *nargs, const uintptr_t *args,
                 const uintptr_t *mems, const uintptr_t *ptrs, const int *first, int *status,
                 uintptr_t pool, int threads) {
    struct ac_exec_args a = {(ac_exec_t)exec, (ac_wait_t)wait, (ac_set_t)set, prims, streams,
                             args, mems, ptrs, nargs, first, status};
    ((ac_pool_fn)pool)(ac_exec_one, &a, n, threads);
}

/* One primitive on the calling thread: bind its first nbind memory objects to p0..., execute,
   wait. One call from Python where binding each buffer took a cffi call of its own
   (``Prim.run`` of a tiny convolution, warm: 8.1 -> 5.5-6.3 us). Every buffer is bound on
   every call: ``ac_exec_all`` and the Python path bind the same memory objects too. */
int ac_exec_bound(uintptr_t exec, uintptr_t wait, uintptr_t set, uintptr_t prim,
                  uintptr_t stream, int nargs, uintptr_t args, int nbind,
                  const uintptr_t *mems, void *p0, void *p1, void *p2, void *p3, void *p4,
                  void *p5) {
    void *p[6] = {p0, p1, p2, p3, p4, p5};
    for (int j = 0; j < nbind; j++) {
        int s = ((ac_set_t)set)((void *)mems[j], (uintptr_t)p[j]);
        if (s != 0) return s;
    }
    int s = ((ac_exec_t)exec)((const void *)prim, (void *)stream, nargs, (const void *)args);
    return s == 0 ? ((ac_wait_t)wait)((void *)stream) : s;
}
"""
_CDEF = """int ac_exec_bound(uintptr_t exec, uintptr_t wait, uintptr_t set, uintptr_t prim,
    uintptr_t stream, int nargs, uintptr_t args, int nbind, const uintptr_t *mems, void *p0,
    void *p1, void *p2, void *p3, void *p4, void *p5);
void ac_exec_all(int n, uintptr_t exec, uintptr_t wait, uintptr_t set,
    const uintptr_t *prims, const uintptr_t *streams, const int *nargs, const uintptr_t *args,
    const uintptr_t *mems, const uintptr_t *ptrs, const int *first, int *status,
    uintptr_t pool, int threads)"""

_streams: list[int] = []
_entry: list[Any] = []


def _stream_addresses(L: Any, n: int) -> list[int]:
    """The addresses of the first ``n`` extra streams of the CPU engine (each made once)."""
    while len(_streams) < n:
        out = L.ffi.new("dnnl_stream_t *")
        check(L.dnnl.dnnl_stream_create(out, L.engine, 1), "creating a stream")
        _streams.append(_address(L.ffi, out[0]))
    return _streams[:n]


def _entry_points(L: Any) -> tuple[int, int, int]:
    """``dnnl_primitive_execute``'s, ``dnnl_stream_wait``'s and
    ``dnnl_memory_set_data_handle``'s addresses in ``L``, looked up once per library object
    rather than on every call."""
    if not _entry or _entry[0] is not L:
        ffi, dn = L.ffi, L.dnnl
        names = ("dnnl_primitive_execute", "dnnl_stream_wait", "dnnl_memory_set_data_handle")
        _entry[:] = [L, *(_address(ffi, ffi.addressof(dn, name)) for name in names)]
    return _entry[1], _entry[2], _entry[3]


#: The built helper ``(ffi, lib, float[] type)``, or None without a compiler; kept per
#: ``$CC`` (a build's cache key hashes the source: 60 us a call).
_helper = loader(SOURCE_DECL + _SOURCE, _CDEF, "ac_exec_all")[0]


def _fixed(hffi: Any, L: Any, prims: list[P.Prim]) -> tuple[Any, Any, Any, Any]:
    """The C arrays of ``prims``' addresses, their streams, argument counts and argument
    lists: the same for every call on the same primitives, so made once for them (a few us
    a call from Python lists)."""
    key = tuple(map(id, prims))
    hit = _FIXED.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], prims)):
        return hit[1]
    ffi, n = L.ffi, len(prims)
    fixed = (
        hffi.new("uintptr_t[]", [_address(ffi, p.prim) for p in prims]),
        hffi.new("uintptr_t[]", _stream_addresses(L, n)),
        hffi.new("int[]", [len(p.mems) for p in prims]),
        hffi.new("uintptr_t[]", [_address(ffi, p.args) for p in prims]),
    )
    if len(_FIXED) >= _MAX_FIXED:
        _FIXED.clear()
    _FIXED[key] = (list(prims), fixed)
    return fixed


#: ids of a primitive list -> (the primitives, their C arrays); the primitives are kept so
#: their ids are not reused while cached.
_FIXED: dict[tuple[int, ...], tuple[list[P.Prim], tuple[Any, Any, Any, Any]]] = {}
_MAX_FIXED = 512


def _address(ffi: Any, cdata: Any) -> int:
    return int(ffi.cast("uintptr_t", cdata))


#: Most buffers one ``Bound`` call binds.
BOUND_ARGS = 6


class Bound:
    """``prim``'s arguments ``keys`` (in that order) bound and the primitive executed in one C
    call (``ac_exec_bound``), under the primitive's lock, oneDNN's error raised. Called with
    one pointer per key after the ``kept`` ones given here (a remembered path's weights and
    bias, ``_prim.pin``'s); ``fb`` makes a dense array's pointer. Made by ``bound``."""

    __slots__ = ("fn", "head", "pad", "lock", "info", "fb")

    def __init__(self, built: tuple, prim: P.Prim, keys: tuple[int, ...], kept: tuple) -> None:
        hffi, hlib, _ = built
        L = P.lib()
        mems = hffi.new("uintptr_t[]", [prim.mem_addrs[k] for k in keys])
        self.fn, self.lock, self.info, self.fb = (
            hlib.ac_exec_bound,
            prim.lock,
            prim.info,
            hffi.from_buffer,
        )
        self.head = (
            *_entry_points(L),
            _address(L.ffi, prim.prim),
            _address(L.ffi, L.stream),
            len(prim.mems),
            _address(L.ffi, prim.args),
            len(keys),
            mems,
            *kept,
        )
        self.pad = (hffi.NULL,) * (BOUND_ARGS - len(keys))

    def __call__(self, *ptrs: Any) -> None:
        with self.lock:
            s = self.fn(*self.head, *ptrs, *self.pad)
        if s:
            check(s, "executing " + self.info)
        if _replay.ACTIVE:
            _replay.note(self, ptrs)


def bound(prim: P.Prim, keys: tuple[int, ...], kept: tuple = ()) -> Bound | None:
    """A ``Bound`` call of ``prim`` on ``keys``; None without the helper (no compiler) or for
    more than ``BOUND_ARGS`` keys."""
    built = _helper()
    if built is None or len(keys) > BOUND_ARGS:
        return None
    return Bound(built, prim, keys, kept)


def bound_runner(prim: P.Prim) -> Callable[[dict[int, Any]], None] | None:
    """``Prim.run`` in one C call: a function of its buffers (arrays, addresses or ``pin``'s
    pointers, at most ``BOUND_ARGS``) binding them through a ``Bound`` per argument order;
    None without the helper."""
    built = _helper()
    if built is None:
        return None
    hffi = built[0]
    orders: dict[tuple[int, ...], Bound] = {}
    fb, cast = hffi.from_buffer, hffi.cast

    def pointer(a: Any) -> Any:
        if type(a) is not np.ndarray:
            return cast("void *", a) if type(a) is int else a  # an address, or pin()'s
        if a.flags.c_contiguous:
            return fb(a)
        if a.ndim == 4:  # the NCHW view of a channels-last buffer: 0.6 us against 1.6
            t = a.transpose(0, 2, 3, 1)
            if t.flags.c_contiguous:
                return fb(t)
        return cast("void *", P.ptr(a))

    def run(buffers: dict[int, Any]) -> None:
        keys = tuple(buffers)
        call = orders.get(keys)
        if call is None:
            call = orders[keys] = Bound(built, prim, keys, ())
        call(*[pointer(a) for a in buffers.values()])

    return run


def offset_buffers(bases: dict[int, int], offsets: list[dict[int, int]]) -> list[dict[int, int]]:
    """``run_all``'s buffers for parts of whole arrays: argument ``k`` of part ``j`` at
    ``bases[k] + offsets[j][k]`` (addresses and byte offsets; a plan works the offsets out
    once, and taking an array's address costs about 1 us in Python, so once a call)."""
    return [{arg: bases[arg] + off for arg, off in part.items()} for part in offsets]


def run_kept(prims: list[P.Prim], buffers: list[dict], threads: int, *alive: Any) -> None:
    """``run_all`` on buffers given as addresses, noted for a replay
    (``backends/cpu/replay/record.py``) with
    the arrays behind them (``alive``), which the note keeps."""
    run_all(prims, buffers, threads)
    if _replay.ACTIVE:
        _replay.note(run_kept, (prims, buffers, threads, *alive))


def run_all(
    prims: list[P.Prim],
    buffers: list[dict[int, np.ndarray | int]],
    threads: int | None = None,
) -> None:
    """Execute ``prims[k]`` on ``buffers[k]`` (as ``Prim.run``; a buffer may also be given
    as its address, an int) on ``threads`` threads (one per primitive by default) where the
    helper builds; the primitives must be distinct. Each part's buffers are bound on the
    thread that runs it, in C: binding from Python cost about 2 us a buffer (most of it
    ``__array_interface__``), 17 us of a two-part convolution's critical path."""
    address = pool.address() if len(prims) > 1 else 0
    built = _helper() if address else None
    RUNS["together" if built is not None else "in turn"] += 1
    if built is None:
        for p, b in zip(prims, buffers):
            p.run(b)
        return
    hffi, hlib, _ = built
    fn = hlib.ac_exec_all
    L = P.lib()
    mems: list[int] = []
    ptrs: list[int] = []
    first = [0]
    for p, bufs in zip(prims, buffers):
        addrs = p.mem_addrs
        for arg, a in bufs.items():
            mems.append(addrs[arg])
            ptrs.append(a if type(a) is int else P.ptr(a))
        first.append(len(mems))
    n = len(prims)
    status = hffi.new("int[]", n)
    fixed = _fixed(hffi, L, prims)
    for p in prims:
        p.lock.acquire()
    try:
        fn(n, *_entry_points(L), *fixed, mems, ptrs, first, status, address, threads or n)
    finally:
        for p in prims:
            p.lock.release()
    for p, s in zip(prims, status):
        check(s, "executing " + p.info)
