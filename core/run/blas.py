"""numpy's OpenBLAS kept to one thread while a CPU partition runs beside oneDNN's OpenMP team
(and while the simulated NPU computes; ``backends/cpu/native/attention.py`` calls its ``sgemm``).
It sits
beside ``backends/cpu/native/omp.py``, the OpenMP counterpart: host thread control that the CPU
backend,
the NPU and the generated code all use, below every backend.

OpenBLAS's worker threads spin for a while after each threaded call; oneDNN's OpenMP team
(``OMP_WAIT_POLICY=PASSIVE``) then waits for cores they hold. On the 2-core machine with two
threads each (``bench/cpu_models.py --threads 2``, medians of 30 runs, wall / CPU time against
onnxruntime): the MLP ran 2.96x / 2.66x onnxruntime's time, the BERT-like layer 4.48x / 1.81x;
with OpenBLAS at one thread inside the run 1.14x / 1.25x and 1.11x / 1.16x. So
``CpuBackend.runner`` runs each partition with OpenBLAS at one thread when oneDNN is
there (its convolutions, LSTMs and larger MatMuls take the threads) and puts the caller's count
back after; without oneDNN numpy's BLAS is the only threaded path and keeps its threads.

The library is found as threadpoolctl finds it (no dependency on it): the loaded shared
object whose path names OpenBLAS, in ``/proc/self/maps``, and its ``*_set_num_threads`` /
``*_get_num_threads`` under the prefixes and suffixes numpy's builds use. Not found (another
BLAS, another platform): the partition runs as it is. ``ANYCHIP_BLAS_THREADS=keep`` leaves
OpenBLAS alone. The count is process-wide, as OpenBLAS keeps it: numpy calls in other threads
during a run get one thread too.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "blas_single",
    "openblas_address",
    "openblas_symbol",
    "openblas_threads",
    "single_blas_thread",
]

_PREFIXES = ("scipy_openblas_", "openblas_")
_SUFFIXES = ("64_", "")
_found: list[tuple[Any, Any] | None] = []


def _loaded_openblas() -> list[str]:
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "openblas" in line.lower()}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.isabs(p) and ".so" in p)


def _libraries() -> Iterator[ctypes.CDLL]:
    """The loaded OpenBLAS libraries that open, numpy's first loaded by the import."""
    import numpy  # noqa: F401 - loads its BLAS

    for path in _loaded_openblas():
        try:
            yield ctypes.CDLL(path)
        except OSError:
            continue


_ADDRESSES: dict[str, int] = {}


def openblas_address(name: str) -> int:
    """The address of OpenBLAS's function ``name`` (``openblas_symbol``), looked up once; 0
    where no loaded OpenBLAS has it."""
    if name not in _ADDRESSES:
        fn = openblas_symbol(name)
        _ADDRESSES[name] = 0 if fn is None else ctypes.cast(fn, ctypes.c_void_p).value or 0
    return _ADDRESSES[name]


def openblas_symbol(name: str) -> Any | None:
    """The function ``name`` of the first loaded OpenBLAS library that has it, or None."""
    for lib in _libraries():
        fn = getattr(lib, name, None)
        if fn is not None:
            return fn
    return None


def _thread_fns() -> tuple[Any, Any] | None:
    for lib in _libraries():
        for pre in _PREFIXES:
            for suf in _SUFFIXES:
                get = getattr(lib, f"{pre}get_num_threads{suf}", None)
                put = getattr(lib, f"{pre}set_num_threads{suf}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    return get, put
    return None


def openblas_threads() -> tuple[Callable[[], int], Callable[[int], None]] | None:
    """``(get, set)`` of numpy's OpenBLAS thread count, or None where there is none."""
    if not _found:
        _found.append(_thread_fns())
    return _found[0]


def blas_single() -> bool:
    """Whether numpy's OpenBLAS runs one thread (inside CPU partitions it is kept so)."""
    fns = openblas_threads()
    return fns is not None and fns[0]() == 1


def single_blas_thread(program: Callable[[list[Any]], list[Any]]) -> Callable:
    """``program`` run with OpenBLAS at one thread (the caller's count restored after)."""
    fns = openblas_threads()
    if fns is None or os.environ.get("ANYCHIP_BLAS_THREADS") == "keep":
        return program
    get, put = fns

    def run(tensors: list[Any]) -> list[Any]:
        n = get()
        if n <= 1:
            return program(tensors)
        put(1)
        try:
            return program(tensors)
        finally:
            put(n)

    run.wrapped = program  # type: ignore[attr-defined]
    return run
