"""The thread state a recorded CPU kernel call ran under, captured and set again on replay
(``backends/cpu/replay/record.py``, ``CpuBackend.runner``).

Two things around a call change how it runs: the OpenMP team (``onednn/_lib.team_for`` puts a
small primitive on one thread, and a oneDNN primitive must run on the team it was made for:
its scratchpad is sized for it), and whether the generated code's pool is paused (a large
primitive's team needs every core: a pool thread spinning beside it halved it). A replay
switches both only where they change between calls, and back at the end.
"""

from __future__ import annotations

from anychip.backends.cpu.native import omp, pool

__all__ = ["capture", "apply"]


def capture() -> tuple[int, bool]:
    """(the OpenMP team size, whether the pool is paused) now."""
    return omp.max_threads(), pool.pauses() > 0


def apply(new: tuple[int, bool], old: tuple[int, bool]) -> None:
    """Switch from the state ``old`` to ``new``."""
    if new[0] != old[0]:
        omp.set_threads(new[0])
    if new[1] != old[1]:
        pool.pause(1 if new[1] else -1)
