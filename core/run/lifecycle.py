"""``Session.close()`` and ``with anychip.load(...) as sess:``: device memory back at once.

Without ``close`` a session's device memory (weights uploaded at load, the planned arenas,
compiled executables, a trial placement of the feedback) goes back when the last reference
to the session is dropped. ``close`` drops the session's own references to everything
compiled and collects them now, so the devices' pools and heaps show it back at once; a
closed session refuses to run or report with an ``AnychipError`` that says so. In bring-up
(``load(..., bring_up=True)``) ``close`` then checks that each device's memory is back where
it was at load (``bring_up.check_released``).
"""

from __future__ import annotations

import gc
from typing import TYPE_CHECKING, Any

from anychip.core.run.forks import check_not_forked
from anychip.errors import AnychipError

if TYPE_CHECKING:
    import threading

    from anychip.core.compile.pipeline import CompiledModel
    from anychip.core.run.feedback import Feedback
    from anychip.ir.graph import Model

__all__ = ["Closable", "check_open", "CLOSED"]

CLOSED = (
    "this session is closed (Session.close() or the end of its with-block); load the model "
    "again with anychip.load to run it"
)


def check_open(session: Any) -> None:
    """Raise the closed-session error when ``session`` was closed."""
    if getattr(session, "_closed", False):
        raise AnychipError(CLOSED)
    check_not_forked(session)


class Closable:
    """What ``Session`` gets for closing (a mixin: the session's lock and compiled model)."""

    _closed = False
    # The session's (declared here for the type checker, set by ``Session``): what close drops.
    _lock: threading.RLock
    feedback: Feedback | None
    compiled: CompiledModel
    model: Model
    source_model: Model | None
    partitions: list[Any]
    copies: list[Any]

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Release the session's device memory now; later calls do nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self.feedback is not None:
                self.feedback.stop("closed")
            self.compiled.close()  # its executables go back (Backend.release_compiled)
            # A closed session refuses every use (check_open): None is never read as a model.
            self.compiled = self.model = None  # type: ignore[assignment]
            self.source_model = None
            self.partitions, self.copies = [], []
        gc.collect()  # executables and tensors in reference cycles go back now too
        before = getattr(self, "_memory_at_load", None)
        if before is not None:  # bring-up: the devices' memory is back where it was
            from anychip.core.run.bring_up import check_released

            check_released(before)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
