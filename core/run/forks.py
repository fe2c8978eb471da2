"""What a forked child does with the sessions it inherits (issue 47).

``os.fork`` copies the process with only the forking thread: a lock another thread held at that
moment stays held in the child for good. A session that another thread was running when the
process forked had its lock held, and its state (arenas, replays, the feedback's trial) halfway
through a run: the child's first ``run`` waited forever. Here every session is tracked (weakly),
and in the child (``os.register_at_fork``) a session whose lock was held gets a new lock and is
marked: its next call raises ``DeviceError`` saying to load the model again in the child. The
others, and sessions loaded in the child, run. Each module with locks shared between sessions
resets them in the child itself: oneDNN's primitive cache (``backends/cpu/onednn/_prim.py``),
the OpenMP team (``backends/cpu/native/omp.py``: one thread in the child), the plugin host.

The multiprocessing start methods: ``spawn`` and ``forkserver`` start a fresh interpreter and
are always safe; ``fork`` (Linux's default before Python 3.14) works within the rules above.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

from anychip.errors import DeviceError

__all__ = ["track", "check_not_forked", "FORKED_MID_RUN"]

FORKED_MID_RUN = (
    "this session was running in another thread when the process forked, so the child holds "
    "a copy stopped halfway through a run; load the model again in the child (anychip.load), "
    "or start workers with the 'spawn' or 'forkserver' method"
)

_sessions: weakref.WeakSet[Any] = weakref.WeakSet()
#: This process's id, set again in a forked child (``os.getpid()`` is a system call, and
#: ``check_not_forked`` runs on every request).
_pid = [os.getpid()]


def track(session: Any) -> None:
    """Follow ``session`` through forks (its ``_lock``; ``_forked_mid_run`` set in the child)."""
    _sessions.add(session)
    session._pid = _pid[0]
    session._forked_mid_run = None  # read on every request: an attribute, not a default


def check_not_forked(session: Any) -> None:
    """Raise ``DeviceError`` for a session inherited mid-run by a forked child, or placed on a
    device that does not survive fork (``Backend.fork_unsafe_reason``: OpenCL)."""
    why = getattr(session, "_forked_mid_run", None)
    if not why and getattr(session, "_pid", None) not in (None, _pid[0]):
        # first call in a forked child (every fork handler has run by now: their order of
        # registration does not matter)
        why = session._forked_mid_run = _unsafe_devices(session)
        session._pid = _pid[0]
    if why:
        raise DeviceError(why)


def _unsafe_devices(session: Any) -> str | None:
    compiled = getattr(session, "compiled", None)
    used = {p.device for p in getattr(compiled, "partitions", ())}
    for backend in getattr(compiled, "backends", ()):
        reason = getattr(backend, "fork_unsafe_reason", None)
        why = reason() if reason is not None and backend.name in used else None
        if why:
            return (
                f"this session runs on {backend.name}, which cannot run in a forked child: "
                f"{why}; load the model again here without it (the CPU works)"
            )
    return None


def _after_fork_in_child() -> None:
    _pid[0] = os.getpid()
    for session in list(_sessions):
        lock = getattr(session, "_lock", None)
        if lock is None:
            continue
        if not lock.acquire(blocking=False):  # held by a thread the child does not have
            session._lock = threading.RLock()
            session._forked_mid_run = FORKED_MID_RUN
            continue
        lock.release()


os.register_at_fork(after_in_child=_after_fork_in_child)
