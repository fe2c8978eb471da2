"""Planned device memory on the XPU (``Backend.device_arena``): one driver block per partition,
each planned tensor an alias handle at its planner offset (``XpuDriver.alias``).

Invariants: the views are ``is_view`` tensors (their ``free`` does nothing: the runtime's
release of a dead slot leaves the arena alone); ``close`` frees every alias, then the block, once;
the block is never freed while a launch that uses it is queued (``xpu_free`` drains the queue).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.backends.xpu_stub.driver import XpuDriver, XpuTensor

__all__ = ["XpuArena"]


class XpuArena:
    """``nbytes`` of XPU memory for one partition's planned tensors (see the module docstring)."""

    def __init__(self, driver: XpuDriver, nbytes: int) -> None:
        self.driver = driver
        self.nbytes = int(nbytes)
        self.base: int | None = driver.malloc(self.nbytes)
        self.aliases: list[int] = []

    def view(self, offset: int, shape: Sequence[int], dtype: Any) -> XpuTensor:
        """The tensor of ``shape`` and ``dtype`` at ``offset`` bytes into the block."""
        assert self.base is not None, "a closed arena has no views"
        dt = np.dtype(dtype)
        nbytes = math.prod(int(d) for d in shape) * dt.itemsize
        handle = self.driver.alias(self.base, int(offset), nbytes)
        self.aliases.append(handle)
        return XpuTensor(handle, shape, dt, nbytes, self.driver, is_view=True)

    def close(self) -> None:
        """Free the aliases and the block (nothing when the driver is already shut down)."""
        base, self.base = self.base, None
        aliases, self.aliases = self.aliases, []
        if base is None or self.driver.closed:
            return
        for h in aliases:
            self.driver.free(h)
        self.driver.free(base)
