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

Fork: libgomp keeps its team's threads in a pool that a forked child inherits as data but not
as threads, so the child's first parallel region of more than one thread waits for them
forever (issue 47). A child forked after libgomp was loaded therefore runs OpenMP on one
thread (the count set to 1 at the fork and ``set_threads`` held there), as PyTorch does; a
process started with the ``spawn`` or ``forkserver`` method has its full team.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

__all__ = ["max_threads", "set_threads", "passive_wait", "available", "forked"]

_fns: list[Any] = []
#: [True] in a child forked after libgomp was loaded: OpenMP stays at one thread there.
_FORKED = [False]


def _after_fork_in_child() -> None:
    if _fns and _fns[0] is not None:
        _FORKED[0] = True
        _fns[0][1](1)


os.register_at_fork(after_in_child=_after_fork_in_child)


def forked() -> bool:
    """Whether this is a child forked after libgomp was loaded (OpenMP held at one thread)."""
    return _FORKED[0]


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
        fns[1](1 if _FORKED[0] else n)
