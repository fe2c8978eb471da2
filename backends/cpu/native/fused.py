"""Fused element-wise chains on the CPU: the code generator's C, built once, run on the pool.

``c_kernel(spec)`` is what the CPU's fused kernel calls: a callable running the generated C
over numpy arrays, or None (no compiler; the caller computes with numpy). Calls with enough
work (``PARALLEL_WORK``) run on as many threads as the OpenMP count that oneDNN uses
(``omp``), through the thread pool of ``pool``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.replay import record as _replay
from anychip.codegen.build import cc_key, load
from anychip.codegen.c_emitter import CEmitter
from anychip.codegen.program import KernelSpec, Layout, linearize

__all__ = ["c_kernel", "CFunction", "PARALLEL_WORK", "threads_for", "work_per_element"]

_EMITTER = CEmitter()
_cache: dict[tuple[KernelSpec, object], Any] = {}


#: Work per element of each primitive, in units of an add (``exp`` and the functions built on
#: it are polynomials of about 12 operations; ``log`` and ``pow`` are glibc's scalar calls).
_COST = {"exp": 12, "sigmoid": 14, "tanh": 16, "erf": 18, "log": 20, "pow": 30}
#: A call runs on the threads of ``pool`` (as many as ``omp.max_threads()``) from this much
#: work on (elements times ``work_per_element``), below it on its caller. Measured with
#: ``bench/codegen_threads.py`` in a second of an idle machine (99% idle, medians of 40, one /
#: two threads): x * sigmoid(x) over 64K floats (2^20 units) 50.0 / 51.3 us, over 256K 181 /
#: 119; erf-GELU over 64K 80.5 / 61.5; softmax rows over 256K 287 / 176. A unit is about
#: 0.05 ns on one thread, so the threshold is about 100 us of work.
PARALLEL_WORK = 1 << 21


_ONE = (1, 0)


def threads_for(work: int) -> tuple[int, int]:
    """A generated kernel's ``(nthreads, pool)`` arguments for ``work`` (``PARALLEL_WORK``'s
    units): one thread and no pool below ``PARALLEL_WORK``, else the OpenMP count and the
    pool's entry point."""
    return _ONE if work < PARALLEL_WORK else (omp.max_threads(), pool.address())


def work_per_element(spec: KernelSpec) -> int:
    """``spec``'s work per output element: its steps' ``_COST`` (1 for the others) plus one
    per array read or written."""
    steps = linearize(spec.expr)
    ops = sum(_COST.get(s.op, 1) for s in steps if s.op not in ("in", "const"))
    return ops + len(spec.classes) + 1


class CFunction:
    """A built kernel: ``fn(layout, arrays, out)`` with C-contiguous arrays of one dtype."""

    def __init__(self, spec: KernelSpec, ffi: Any, fn: Any) -> None:
        self.spec, self.ffi, self.fn = spec, ffi, fn
        # the array type resolved once (a string is looked up in cffi's cache on every call)
        self.ptr = ffi.typeof(f"{_EMITTER.ctypes[spec.dtype]}[]")
        self.work = work_per_element(spec)

    def __call__(self, layout: Layout, arrays: Sequence[np.ndarray], out: np.ndarray) -> None:
        buf, ptr = self.ffi.from_buffer, self.ptr  # no copy: the arrays' own memory
        ptrs = [buf(ptr, a) for a in arrays]
        y = buf(ptr, out, require_writable=True)
        threads = threads_for(layout.outer * layout.inner * self.work)
        args = (layout.outer, layout.inner, *ptrs, *layout.r_mods, y, *threads)
        self.fn(*args)
        if _replay.ACTIVE:
            _replay.note(self.fn, args)


def c_kernel(spec: KernelSpec) -> Callable[..., None] | None:
    """The generated C of ``spec``, built once per process (and cached on disk), or None
    when it cannot be built here."""
    key = (spec, cc_key())  # a test hides the compiler through CC
    if key in _cache:
        return _cache[key]
    loaded = load(_EMITTER.source(spec), _EMITTER.signature(spec), spec.name)
    _cache[key] = None if loaded is None else CFunction(spec, loaded[0], loaded[2])
    return _cache[key]
