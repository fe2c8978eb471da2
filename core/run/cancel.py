"""Cancelling a running request: onnxruntime's ``RunOptions.terminate`` seen between steps.

``guarded_run`` (``core/api/ort_api.py``) puts the request's run options here, for the thread
that runs the request, with ``watching``; the interpreters read them once per run with
``current()`` and, only when a request carries options, ask ``stop_if_terminated`` between
steps: the session's step runner (``core/run/steps.py``) before every copy and partition, an
executor ``Program`` (``core/run/dispatch.py``) before every node, the CPU's replay
(``backends/cpu/replay/run.py``) before every recorded call. A request without options reads
one thread-local and compares with None per node: nothing more.

A terminated request raises ``RunTerminatedError`` from where it stopped; the interpreters
release what the run held as for any failure, and failover, the feedback's trials and the
replay's traces take it for a cancel, not for a device's or a trace's fault: the session's
next run is as it would have been.

Invariants:
    * Options are per thread: a request run on another thread (``run_async``'s workers) is
      watched there; a thread runs one request at a time (a session's runs are serialised).
    * A kernel already running is not interrupted (its native code runs to its end): the
      check is between nodes, so a request stops within one node's time.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from anychip.errors import RunTerminatedError

__all__ = ["watching", "current", "stop_if_terminated"]


class _Local(threading.local):
    """The thread's watched request; the class default makes a read without options one
    attribute lookup (``getattr`` with a default raised and caught AttributeError: 0.4 us)."""

    watched: tuple[Any, str] | None = None


_local = _Local()


@contextmanager
def watching(options: Any, tag: str) -> Iterator[None]:
    """Run the body with ``options`` (anything with a ``terminate`` attribute) watched."""
    before = _local.watched
    _local.watched = (options, tag)
    try:
        yield
    finally:
        _local.watched = before


def current() -> tuple[Any, str] | None:
    """The options and tag of the request this thread runs (None: no options given)."""
    return _local.watched


def stop_if_terminated(watched: tuple[Any, str], where: str) -> None:
    """Raise ``RunTerminatedError`` if the watched options' ``terminate`` is set."""
    options, tag = watched
    if options.terminate:
        raise RunTerminatedError(
            f"{tag}: terminated (RunOptions.terminate) while running, before {where}; its "
            "outputs are dropped and the session is ready for the next request"
        )
