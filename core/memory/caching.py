"""``CachingPool``: freed blocks are kept per size class and handed out again.

The shape of PyTorch's caching allocator and tinygrad's ``LRUAllocator``: a request is rounded
up to its *size class*; ``free`` keeps the raw buffer in that class's cache instead of giving it
back, and the next request of the same class reuses it without asking the device. Cached buffers
are given back, least recently freed first, when a new raw allocation would exceed the capacity,
when the device refuses one, when the cache grows past ``max_cached``, and on ``trim()``.

Size classes: sizes are rounded to the alignment, and above ``alignment * divisions`` to
``divisions`` steps per power of two (with 4: 1024, 1280, 1536, 1792, 2048, 2560, ...), so a
slowly varying dynamic shape still hits the cache while rounding wastes less than
``1 / divisions`` of a block.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

from anychip.core.memory.pool import Block, MemoryPool, RawAllocator, align_up

__all__ = ["CachingPool", "size_class"]


def size_class(nbytes: int, alignment: int = 64, divisions: int = 4) -> int:
    """The size class of a request: the bytes a ``CachingPool`` block of it really has."""
    size = align_up(max(nbytes, 1), alignment)
    step = max(alignment, (1 << (size.bit_length() - 1)) // divisions)
    return align_up(size, step)  # both factors of step are powers of two, so step is one


class CachingPool(MemoryPool):
    """A pool that caches freed buffers by size class (see the module docstring).

    Args:
        device_name, capacity, allocator, alignment: as for ``MemoryPool``; the capacity bounds
            live plus cached bytes.
        divisions: Size classes per power of two (a power of two; 1 rounds to powers of two).
        max_cached: The most bytes kept in the cache (``None``: bounded only by the capacity).
    """

    def __init__(
        self,
        device_name: str,
        *,
        capacity: int | None = None,
        allocator: RawAllocator,
        alignment: int = 64,
        divisions: int = 4,
        max_cached: int | None = None,
    ) -> None:
        super().__init__(device_name, capacity=capacity, allocator=allocator, alignment=alignment)
        if divisions <= 0 or divisions & (divisions - 1):
            raise ValueError(f"{device_name}: divisions must be a power of two, got {divisions}")
        self.divisions = divisions
        self.max_cached = max_cached
        # Cached buffers: a global LRU (oldest first) keyed by a ticket, and per size class the
        # tickets in the order they were cached. The oldest ticket of a class is always at the
        # front of its deque, so LRU eviction is a popleft; reuse takes the newest (warmest).
        self._ticket = 0
        self._lru: OrderedDict[int, tuple[int, Any]] = OrderedDict()
        self._by_class: dict[int, deque[int]] = {}
        self._cached = 0
        self.hits = 0
        self.misses = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes held in the cache (reserved but not in use)."""
        return self._cached

    def _block_size(self, nbytes: int) -> int:
        return size_class(nbytes, self.alignment, self.divisions)

    def _acquire(self, size: int, need: int) -> tuple[Any, int, Any]:
        tickets = self._by_class.get(size)
        if tickets:
            ticket = tickets.pop()
            if not tickets:
                del self._by_class[size]  # _largest_free reads the keys
            _, buffer = self._lru.pop(ticket)
            self._cached -= size
            self.hits += 1
            return buffer, 0, None
        buffer = self._raw_alloc(size, need)
        self.misses += 1
        return buffer, 0, None

    def _release(self, block: Block) -> None:
        if self.max_cached is not None and block.size > self.max_cached:
            self._raw_free(block.buffer, block.size)
            return
        self._ticket += 1
        self._lru[self._ticket] = (block.size, block.buffer)
        self._by_class.setdefault(block.size, deque()).append(self._ticket)
        self._cached += block.size
        if self.max_cached is not None and self._cached > self.max_cached:
            self._evict(self._cached - self.max_cached)

    def _evict(self, nbytes: int) -> int:
        """Give back least recently cached buffers until ``nbytes`` are released (or none left)."""
        released = 0
        while self._lru and released < nbytes:
            _, (size, buffer) = self._lru.popitem(last=False)
            tickets = self._by_class[size]
            tickets.popleft()
            if not tickets:
                del self._by_class[size]
            self._cached -= size
            released += size
            self._raw_free(buffer, size)
        return released

    def _make_room(self, nbytes: int) -> None:
        self._evict(nbytes)

    def _trim(self) -> int:
        return self._evict(self._cached)

    def _release_all(self) -> None:
        self._evict(self._cached)
        super()._release_all()
        self._ticket = 0
        self.hits = 0
        self.misses = 0

    def _largest_free(self) -> int:
        return max(self._by_class, default=0)
