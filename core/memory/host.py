"""Host memory for pools: numpy uint8 buffers, and typed array views of pool blocks.

``NumpyAllocator`` is the raw allocator of host-memory devices (the CPU backend can use it, or
subclass it): ``_alloc(nbytes)`` returns a 1-D ``uint8`` array whose first byte sits on a
``base_alignment`` boundary, so block offsets that are multiples of the pool's alignment give
aligned addresses too. ``as_array(block, dtype, shape)`` is how a kernel's output buffer is made
from a block::

    pool = ArenaPool("cpu", capacity=1 << 20, allocator=NumpyAllocator())
    block = pool.alloc(4 * 3 * 5)
    y = as_array(block, np.float32, (3, 5))     # writes land in the pool's memory
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import Any

import numpy as np

from anychip.core.memory import hugepages
from anychip.core.memory.pool import Block
from anychip.errors import DeviceError

__all__ = ["NumpyAllocator", "as_array"]


class NumpyAllocator:
    """Raw host allocation as aligned numpy ``uint8`` arrays (``_alloc`` / ``_free``).

    Args:
        base_alignment: Byte alignment of each buffer's first element (a power of two).
    """

    def __init__(self, base_alignment: int = 64) -> None:
        if base_alignment <= 0 or base_alignment & (base_alignment - 1):
            raise ValueError(f"base_alignment must be a power of two, got {base_alignment}")
        self.base_alignment = base_alignment

    def _alloc(self, nbytes: int) -> np.ndarray:
        # numpy only promises 16-byte alignment: over-allocate and start at the next boundary.
        raw = hugepages.empty(nbytes + self.base_alignment)  # large ones on huge pages
        start = -raw.ctypes.data % self.base_alignment
        return raw[start : start + nbytes]

    def _free(self, buffer: Any) -> None:
        # The array is reclaimed by the garbage collector once no view of it is left.
        return None


def as_array(block: Block, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    """A C-contiguous ``dtype`` array of ``shape`` over ``block``'s bytes (no copy).

    Raises:
        DeviceError: the block is not host memory, was freed, or is too small for the array.
    """
    dtype = np.dtype(dtype)
    shape = tuple(int(d) for d in shape)
    nbytes = prod(shape) * dtype.itemsize
    if not isinstance(block.buffer, np.ndarray):
        raise DeviceError(
            f"{block.pool.device}: cannot view {block!r} as a numpy array: its "
            f"buffer is a {type(block.buffer).__name__}, not host memory; copy "
            f"it to the host through the backend instead"
        )
    if not block.live:
        raise DeviceError(f"{block.pool.device}: cannot view {block!r}: it was freed")
    if nbytes > block.size:
        raise DeviceError(
            f"{block.pool.device}: a {dtype}{list(shape)} array needs {nbytes} "
            f"bytes but {block!r} has {block.size}; allocate a larger block"
        )
    raw = block.buffer[block.offset : block.offset + nbytes]
    return raw.view(dtype).reshape(shape)
