"""``ArenaPool``: best-fit allocation with coalescing inside large device regions.

The shape of onnxruntime's BFC arena. The pool takes one large *region* from the device
(``allocator._alloc(region_size)``) and hands out blocks as offsets inside it, so it suits
devices that give one fixed memory window (an NPU's SRAM, a DMA heap) as well as host memory.

* A request takes the *smallest* free chunk that fits (ties: lowest region, lowest offset); the
  rest of the chunk is split off and stays free.
* A freed chunk merges with free neighbours at once, so two adjacent free chunks never exist
  and ``stats().fragmentation`` measures real external fragmentation.
* When no free chunk fits, another region of ``region_size`` bytes (or the request's size, if
  larger) is taken, as long as the capacity allows; chunks never merge across regions.
  ``trim()`` gives back regions that are entirely free.

A ``Block``'s ``buffer`` is the region's raw buffer and ``offset`` its byte offset inside it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any

from anychip.core.memory.pool import Block, MemoryPool, RawAllocator

__all__ = ["ArenaPool", "Extent"]

#: One chunk as ``ArenaPool.layout()`` reports it: (region index, offset, size, is free).
Extent = tuple[int, int, int, bool]


class _Region:
    __slots__ = ("buffer", "size", "index", "head")

    def __init__(self, buffer: Any, size: int, index: int) -> None:
        self.buffer = buffer
        self.size = size
        self.index = index
        self.head: _Chunk | None = None


class _Chunk:
    """A range of a region, free or in use; chunks of a region form a list ordered by offset."""

    __slots__ = ("region", "offset", "size", "free", "prev", "next")

    def __init__(self, region: _Region, offset: int, size: int) -> None:
        self.region = region
        self.offset = offset
        self.size = size
        self.free = True
        self.prev: _Chunk | None = None
        self.next: _Chunk | None = None

    @property
    def key(self) -> tuple[int, int, int]:
        # Best fit order: smallest size first, then lowest region and offset for determinism.
        return (self.size, self.region.index, self.offset)


class ArenaPool(MemoryPool):
    """Best fit with coalescing inside regions taken from the device (see module docstring).

    Args:
        device_name, capacity, allocator, alignment: as for ``MemoryPool``; the capacity bounds
            the total size of the regions.
        region_size: Bytes per region (rounded up to the alignment). Default: the capacity, so
            the arena is one region holding all of the device's memory (the NPU case). On
            devices with a large capacity (host memory) pass a smaller one.

    Raises:
        ValueError: neither ``capacity`` nor ``region_size`` is given.
    """

    def __init__(
        self,
        device_name: str,
        *,
        capacity: int | None = None,
        allocator: RawAllocator,
        alignment: int = 64,
        region_size: int | None = None,
    ) -> None:
        super().__init__(device_name, capacity=capacity, allocator=allocator, alignment=alignment)
        if region_size is None and capacity is None:
            raise ValueError(
                f"{device_name}: an ArenaPool needs capacity= or region_size= "
                f"(the size of the region it takes from the device)"
            )
        size = region_size if region_size is not None else capacity
        assert size is not None
        self.region_size = max(self.alignment, size - size % self.alignment)
        self._regions: list[_Region] = []
        self._next_index = 0
        self._free_keys: list[tuple[int, int, int]] = []
        self._free_chunks: dict[tuple[int, int, int], _Chunk] = {}

    # -- inspection ----------------------------------------------------------------------------
    @property
    def region_count(self) -> int:
        """The number of regions taken from the device."""
        return len(self._regions)

    def layout(self) -> list[Extent]:
        """Every chunk, in region and offset order: ``(region, offset, size, is_free)``."""
        with self._lock:
            out: list[Extent] = []
            for region in self._regions:
                chunk = region.head
                while chunk is not None:
                    out.append((region.index, chunk.offset, chunk.size, chunk.free))
                    chunk = chunk.next
            return out

    # -- free index ----------------------------------------------------------------------------
    def _index_add(self, chunk: _Chunk) -> None:
        key = chunk.key
        insort(self._free_keys, key)
        self._free_chunks[key] = chunk

    def _index_remove(self, chunk: _Chunk) -> None:
        key = chunk.key
        i = bisect_left(self._free_keys, key)
        del self._free_keys[i]
        del self._free_chunks[key]

    # -- hooks ---------------------------------------------------------------------------------
    def _acquire(self, size: int, need: int) -> tuple[Any, int, Any]:
        i = bisect_left(self._free_keys, (size,))
        if i < len(self._free_keys):
            chunk = self._free_chunks.pop(self._free_keys.pop(i))
        else:
            chunk = self._grow(size, need)
            self._index_remove(chunk)
        if chunk.size > size:
            rest = _Chunk(chunk.region, chunk.offset + size, chunk.size - size)
            rest.prev, rest.next = chunk, chunk.next
            if chunk.next is not None:
                chunk.next.prev = rest
            chunk.next = rest
            chunk.size = size
            self._index_add(rest)
        chunk.free = False
        return chunk.region.buffer, chunk.offset, chunk

    def _grow(self, size: int, need: int) -> _Chunk:
        """Take a new region able to hold ``size`` bytes; returns its (indexed) free chunk."""
        region_size = max(self.region_size, size)
        if self.capacity is not None:
            # A last region may be smaller than region_size, to use the capacity to the end.
            region_size = max(size, min(region_size, self.capacity - self._reserved))
        buffer = self._raw_alloc(region_size, need)
        region = _Region(buffer, region_size, self._next_index)
        self._next_index += 1
        self._regions.append(region)
        region.head = _Chunk(region, 0, region_size)
        self._index_add(region.head)
        return region.head

    def _release(self, block: Block) -> None:
        chunk: _Chunk = block._slot
        chunk.free = True
        following = chunk.next
        if following is not None and following.free:
            self._index_remove(following)
            chunk.size += following.size
            chunk.next = following.next
            if following.next is not None:
                following.next.prev = chunk
        previous = chunk.prev
        if previous is not None and previous.free:
            self._index_remove(previous)
            previous.size += chunk.size
            previous.next = chunk.next
            if chunk.next is not None:
                chunk.next.prev = previous
            chunk = previous
        self._index_add(chunk)

    def _release_regions(self, nbytes: int) -> int:
        """Give back entirely free regions, oldest first, until ``nbytes`` are released."""
        released = 0
        for region in list(self._regions):
            if released >= nbytes:
                break
            head = region.head
            if head is not None and head.free and head.size == region.size:
                self._index_remove(head)
                self._regions.remove(region)
                released += region.size
                self._raw_free(region.buffer, region.size)
        return released

    def _make_room(self, nbytes: int) -> None:
        self._release_regions(nbytes)

    def _trim(self) -> int:
        return self._release_regions(self._reserved)

    def _release_all(self) -> None:
        regions, self._regions = self._regions, []
        self._free_keys.clear()
        self._free_chunks.clear()
        for region in regions:
            self._raw_free(region.buffer, region.size)

    def _largest_free(self) -> int:
        return self._free_keys[-1][0] if self._free_keys else 0
