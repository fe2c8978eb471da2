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
from typing import Any

from anychip.errors import AnychipError

__all__ = ["Closable", "check_open", "CLOSED"]

CLOSED = (
    "this session is closed (Session.close() or the end of its with-block); load the model "
    "again with anychip.load to run it"
)


def check_open(session: Any) -> None:
    """Raise the closed-session error when ``session`` was closed."""
    if getattr(session, "_closed", False):
        raise AnychipError(CLOSED)


class Closable:
    """What ``Session`` gets for closing (a mixin: the session's lock and compiled model)."""

    _closed = False

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Release the session's device memory now; later calls do nothing."""
        with self._lock:  # type: ignore[attr-defined]
            if self._closed:
                return
            self._closed = True
            if self.feedback is not None:  # type: ignore[attr-defined]
                self.feedback.stop("closed")  # type: ignore[attr-defined]
            self.compiled.close()  # type: ignore[attr-defined]  # executables given back
            self.compiled = self.model = None
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
