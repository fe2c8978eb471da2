"""The OpenMP count that oneDNN uses, read and set through the system ``libgomp.so.1``.

oneDNN's wheel (``onednn-cpu-gomp``) links ``libgomp.so.1``; ``threadpoolctl`` (``anychip
bench --threads``) or ``OMP_NUM_THREADS`` set its count, which is also the number of threads
generated C takes (``backends/cpu/native/pool.py``: the threads a session was given, one way to set
them).

``max_threads()`` is that count (1 where libgomp cannot be loaded); ``set_threads`` changes it
(``onednn/_lib.team_for``). ``passive_wait()`` sets ``OMP_WAIT_POLICY=PASSIVE`` unless the
environment says otherwise; libgomp reads it once, when it loads, so every loader calls it first.
Spinning between parallel regions (libgomp's default) collapsed on a shared 2-core machine:
light ResNet-50 at 2 threads 983 ms spinning against 144 ms passive (90 at 1 thread).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["max_threads", "set_threads", "passive_wait", "available"]

_fns: list[Any] = []


def passive_wait() -> None:
    """``OMP_WAIT_POLICY=PASSIVE`` unless already set (call before anything loads libgomp)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _gomp() -> tuple[Any, Any] | None:
    if not _fns:
        passive_wait()
        try:
            gomp = ctypes.CDLL("libgomp.so.1")
            get, put = gomp.omp_get_max_threads, gomp.omp_set_num_threads
            get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
            _fns.append((get, put))
        except (OSError, AttributeError):
            _fns.append(None)
    return _fns[0]


def available() -> bool:
    """Whether libgomp could be loaded."""
    return _gomp() is not None


def max_threads() -> int:
    """The team size of the next parallel region (``omp_get_max_threads``), 1 without libgomp."""
    fns = _fns[0] if _fns else _gomp()  # asked around every small primitive: no extra call
    return fns[0]() if fns is not None else 1


def set_threads(n: int) -> None:
    """``omp_set_num_threads(n)`` (nothing without libgomp)."""
    fns = _fns[0] if _fns else _gomp()
    if fns is not None:
        fns[1](n)
