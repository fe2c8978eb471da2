"""Progress of long steps (model loading, calibration, compiling partitions, the conformance
kit), reported to whoever listens: nobody by default, the ``anychip`` command's progress bars
(``viz/terminal.py``) when it runs in a terminal.

A step reports through ``task``::

    with task("compiling partitions", total=len(parts)) as advance:
        for p in parts:
            ...
            advance(1)

A listener is a callable ``(description, total) -> context manager yielding advance(n)``,
installed for a block with ``reporting_to(listener)``. Every task is also logged at DEBUG on
the ``anychip`` logger.

In a notebook (an IPython kernel is loaded) with ``tqdm`` installed (the ``viz`` extra), a
thread with no listener shows each task as a ``tqdm.auto`` bar: a 100 MB load in Jupyter
shows its progress as it does in a terminal. ``ANYCHIP_PROGRESS=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["task", "reporting_to"]

_state = threading.local()
_log = logging.getLogger("anychip")


def _noop(n: int = 1) -> None:
    return None


@contextlib.contextmanager
def task(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A step of ``total`` units (None: unknown); yields ``advance(n=1)``."""
    _log.debug("anychip: %s (%s)", description, "?" if total is None else total)
    listener = getattr(_state, "listener", None) or _notebook_listener()
    if listener is None:
        yield _noop
        return
    with listener(description, total) as advance:
        yield advance


def _notebook_listener() -> Any:
    """``tqdm.auto`` bars where an IPython kernel runs this process, else None."""
    if "ipykernel" not in sys.modules or os.environ.get("ANYCHIP_PROGRESS") == "0":
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None

    @contextlib.contextmanager
    def bar(description: str, total: int | None) -> Iterator[Callable[[int], None]]:
        with tqdm(total=total, desc=description, leave=False) as t:
            yield t.update

    return bar


@contextlib.contextmanager
def reporting_to(listener: Any) -> Iterator[None]:
    """Send this thread's tasks to ``listener`` inside the block."""
    previous = getattr(_state, "listener", None)
    _state.listener = listener
    try:
        yield
    finally:
        _state.listener = previous
