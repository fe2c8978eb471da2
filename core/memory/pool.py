"""The memory pool interface, and the plain pool every pooling strategy subclasses.

A backend provides raw device memory through two small methods on any object (usually the
backend itself), the *raw allocator*::

    class MyChip(Backend):
        def _alloc(self, nbytes: int) -> Any:    # a numpy uint8 array, a handle, an offset...
            return driver.malloc(nbytes)
        def _free(self, buffer: Any) -> None:
            driver.free(buffer)

A pool wraps it. Every pool class is constructed the same way, which is the factory signature
``anychip_register_memory_pools`` relies on::

    pool = PoolClass(device_name, capacity=None | int, allocator=<object with _alloc/_free>,
                     alignment=64)
    block = pool.alloc(1000)        # Block: .buffer (raw), .offset, .size (rounded), .nbytes
    pool.free(block)
    pool.stats()                    # MemoryStats: in_use, peak, reserved, counts, fragmentation
    pool.trim()                     # give cached / free memory back to the device
    pool.reset()                    # give everything back; live blocks become invalid

``MemoryPool`` itself does no pooling: each ``alloc`` is one raw allocation and each ``free``
gives it back. Pooling strategies are subclasses (``CachingPool``: size-class cache;
``ArenaPool``: best fit with coalescing inside large regions) that override the underscore
hooks below; the public methods here validate arguments, keep the statistics, enforce the
capacity and turn allocator failures into ``OutOfMemoryError`` / ``DeviceError``. A pool never
looks inside a raw buffer, so device handles work as well as numpy arrays (``host.as_array``
makes typed numpy views of blocks from ``NumpyAllocator``).

Exceeding the capacity raises ``OutOfMemoryError`` carrying ``need``, ``capacity`` and
``in_use``, and leaves the pool as it was: the caller may free blocks and try again.
Pools are thread-safe (one lock per pool).
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable
from typing import Any, Protocol

from anychip.core.memory.stats import MemoryStats, _human
from anychip.errors import AnychipError, DeviceError, OutOfMemoryError

__all__ = ["RawAllocator", "Block", "MemoryPool", "PoolFactory", "pool_factory", "align_up"]


class RawAllocator(Protocol):
    """What a backend gives a pool: raw device allocation, no bookkeeping.

    ``_alloc`` may raise ``MemoryError`` (or ``OutOfMemoryError``) when the device is full; the
    pool turns it into an ``OutOfMemoryError`` with its figures. Any other exception becomes a
    ``DeviceError``.
    """

    def _alloc(self, nbytes: int) -> Any: ...

    def _free(self, buffer: Any) -> None: ...


class PoolFactory(Protocol):
    """The constructor signature every pool class has (``PoolClass(...)`` matches it)."""

    def __call__(
        self,
        device_name: str,
        *,
        capacity: int | None = None,
        allocator: RawAllocator,
        alignment: int = 64,
    ) -> MemoryPool: ...


def align_up(nbytes: int, alignment: int) -> int:
    """``nbytes`` rounded up to a multiple of ``alignment`` (a power of two)."""
    return (nbytes + alignment - 1) & ~(alignment - 1)


class Block:
    """One allocation from a pool.

    Ownership: the pool owns the raw ``buffer``; the block only names a range of it. The range is
    ``[offset, offset + size)`` of ``buffer``; ``nbytes <= size`` is what the caller asked for.
    ``offset`` and ``size`` are multiples of the pool's alignment. After ``pool.free(block)`` or
    ``pool.reset()`` the block is dead (``live`` is False) and its range may be handed out again.
    """

    __slots__ = ("buffer", "offset", "size", "nbytes", "pool", "live", "_slot")

    def __init__(
        self, buffer: Any, offset: int, size: int, nbytes: int, pool: MemoryPool, slot: Any = None
    ) -> None:
        self.buffer = buffer
        self.offset = offset
        self.size = size
        self.nbytes = nbytes
        self.pool = pool
        self.live = True
        # Pool-private bookkeeping (the arena's chunk); never read outside the pool.
        self._slot = slot

    def __repr__(self) -> str:
        state = "" if self.live else ", freed"
        return (
            f"Block({self.pool.device}, offset={self.offset}, size={self.size}, "
            f"nbytes={self.nbytes}{state})"
        )


class MemoryPool:
    """A pool without pooling: every ``alloc`` asks the device, every ``free`` gives back.

    Subclasses change the strategy by overriding the hooks (all called with the lock held):

    * ``_block_size(nbytes) -> int``: the rounded size of a request (alignment, size class);
    * ``_acquire(size) -> (buffer, offset, slot)``: find or make room for ``size`` bytes; use
      ``_raw_alloc`` to ask the device (it enforces the capacity);
    * ``_release(block)``: take back a freed block (cache it, coalesce it, or ``_raw_free``);
    * ``_release_all()``: give all memory back to the device (``reset``);
    * ``_trim() -> int``: give back what is held but unused; returns the bytes released;
    * ``_make_room(nbytes) -> None``: called before a raw allocation would exceed the capacity;
      release at least ``nbytes`` of cached memory if there is some (after the device refused
      an allocation, ``_trim()`` is called instead and the allocation tried once more);
    * ``_largest_free() -> int``: the largest free extent held (for stats and error messages).

    Args:
        device_name: The device this pool serves; it appears in every message.
        capacity: The most bytes the pool may reserve from the device (``None``: no limit other
            than the device's own).
        allocator: The object whose ``_alloc(nbytes)`` / ``_free(buffer)`` give raw memory.
        alignment: Block offsets and sizes are multiples of it; a power of two (default 64,
            a cache line and what most SIMD and DMA engines want).
    """

    def __init__(
        self,
        device_name: str,
        *,
        capacity: int | None = None,
        allocator: RawAllocator,
        alignment: int = 64,
    ) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(
                f"{device_name}: pool alignment must be a power of two, got {alignment}"
            )
        if capacity is not None and capacity < 0:
            raise ValueError(f"{device_name}: pool capacity must be >= 0 or None, got {capacity}")
        if not (
            callable(getattr(allocator, "_alloc", None))
            and callable(getattr(allocator, "_free", None))
        ):
            raise TypeError(
                f"{device_name}: the pool's allocator must have _alloc(nbytes) and "
                f"_free(buffer) methods; got {type(allocator).__name__}"
            )
        self.device = device_name
        self.capacity = capacity
        self.allocator = allocator
        self.alignment = alignment
        self._lock = threading.RLock()
        self._live: set[Block] = set()
        self._zero_counters()

    def _zero_counters(self) -> None:
        self._in_use = 0
        self._requested = 0
        self._peak = 0
        self._reserved = 0
        self._alloc_count = 0
        self._free_count = 0

    # -- public interface ----------------------------------------------------------------------
    def alloc(self, nbytes: int) -> Block:
        """A block of at least ``nbytes`` bytes (0 is allowed and still gets a distinct block).

        Raises:
            OutOfMemoryError: the capacity or the device cannot hold it; the pool is unchanged.
            DeviceError: ``nbytes`` is not a non-negative integer, or the device driver failed.
        """
        try:
            nbytes = operator.index(nbytes)
        except TypeError:
            raise DeviceError(
                f"{self.device}: allocation size must be an integer number of bytes, got {nbytes!r}"
            ) from None
        if nbytes < 0:
            raise DeviceError(f"{self.device}: cannot allocate a negative size ({nbytes} bytes)")
        with self._lock:
            size = self._block_size(nbytes)
            buffer, offset, slot = self._acquire(size, nbytes)
            block = Block(buffer, offset, size, nbytes, self, slot)
            self._live.add(block)
            self._in_use += size
            self._requested += nbytes
            self._peak = max(self._peak, self._in_use)
            self._alloc_count += 1
            return block

    def free(self, block: Block) -> None:
        """Give ``block`` back to the pool.

        Raises:
            DeviceError: the block comes from another pool, or was already freed (or reset).
        """
        with self._lock:
            if not isinstance(block, Block) or block.pool is not self:
                owner = block.pool.device if isinstance(block, Block) else type(block).__name__
                raise DeviceError(
                    f"{self.device}: cannot free a block that belongs to "
                    f"{owner!r}; free it through the pool that allocated it"
                )
            if not block.live:
                raise DeviceError(
                    f"{self.device}: {block!r} was already freed (or the pool was "
                    f"reset since it was allocated); free each block exactly once"
                )
            self._live.discard(block)
            block.live = False
            self._in_use -= block.size
            self._requested -= block.nbytes
            self._free_count += 1
            self._release(block)

    def reset(self) -> None:
        """Give all memory back to the device and zero every counter, as after construction.

        Blocks still live become invalid: using their buffer afterwards is the caller's bug.
        """
        with self._lock:
            for block in self._live:
                block.live = False
            self._release_all()
            self._live.clear()
            self._zero_counters()

    def reset_peak(self) -> None:
        """Start a new peak measurement at the current ``in_use``."""
        with self._lock:
            self._peak = self._in_use

    def trim(self) -> int:
        """Give memory held but unused (cached blocks, empty regions) back; returns the bytes."""
        with self._lock:
            return self._trim()

    def stats(self) -> MemoryStats:
        """A snapshot of the pool's figures (see ``MemoryStats``)."""
        with self._lock:
            free = self._reserved - self._in_use
            largest = self._largest_free()
            fragmentation = 1.0 - largest / free if free > 0 else 0.0
            return MemoryStats(
                device=self.device,
                capacity=self.capacity,
                in_use=self._in_use,
                requested=self._requested,
                peak=self._peak,
                reserved=self._reserved,
                alloc_count=self._alloc_count,
                free_count=self._free_count,
                fragmentation=fragmentation,
                largest_free=largest,
            )

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.stats()}>"

    # -- hooks for subclasses (lock held) ------------------------------------------------------
    def _block_size(self, nbytes: int) -> int:
        return align_up(max(nbytes, 1), self.alignment)

    def _acquire(self, size: int, need: int) -> tuple[Any, int, Any]:
        return self._raw_alloc(size, need), 0, None

    def _release(self, block: Block) -> None:
        self._raw_free(block.buffer, block.size)

    def _release_all(self) -> None:
        for block in self._live:
            self._raw_free(block.buffer, block.size)

    def _trim(self) -> int:
        return 0

    def _make_room(self, nbytes: int) -> None:
        return None

    def _largest_free(self) -> int:
        return 0

    # -- helpers for subclasses ----------------------------------------------------------------
    def _raw_alloc(self, nbytes: int, need: int) -> Any:
        """``allocator._alloc(nbytes)`` within the capacity; counts it as reserved.

        ``need`` is the caller's request, reported in the error when this fails.
        """
        if self.capacity is not None and self._reserved + nbytes > self.capacity:
            self._make_room(self._reserved + nbytes - self.capacity)
            if self._reserved + nbytes > self.capacity:
                raise self._oom(need, nbytes, "the pool's capacity would be exceeded")
        try:
            buffer = self._call_alloc(nbytes)
        except MemoryError:
            # The device itself is full (other users, or less memory than the capacity says):
            # give back what the pool caches and try once more, as PyTorch and tinygrad do.
            self._trim()
            try:
                buffer = self._call_alloc(nbytes)
            except MemoryError as e:
                raise self._oom(need, nbytes, f"the device refused it ({e})") from e
        self._reserved += nbytes
        return buffer

    def _call_alloc(self, nbytes: int) -> Any:
        try:
            return self.allocator._alloc(nbytes)
        except (MemoryError, AnychipError):
            raise
        except Exception as e:
            raise DeviceError(
                f"{self.device}: the device allocator failed to allocate "
                f"{nbytes} bytes: {type(e).__name__}: {e}"
            ) from e

    def _raw_free(self, buffer: Any, nbytes: int) -> None:
        """``allocator._free(buffer)``; no longer counts ``nbytes`` as reserved."""
        self._reserved -= nbytes
        try:
            self.allocator._free(buffer)
        except AnychipError:
            raise
        except Exception as e:
            raise DeviceError(
                f"{self.device}: the device allocator failed to free a buffer "
                f"of {nbytes} bytes: {type(e).__name__}: {e}"
            ) from e

    def _oom(self, need: int, size: int, why: str) -> OutOfMemoryError:
        capacity = (
            "no limit"
            if self.capacity is None
            else (f"{self.capacity} bytes ({_human(self.capacity)})")
        )
        message = (
            f"{self.device}: out of memory: cannot allocate {need} bytes ({_human(need)}; "
            f"{size} bytes with the pool's rounding): {why}. Capacity {capacity}, in use "
            f"{self._in_use} bytes in {len(self._live)} blocks, reserved {self._reserved} bytes, "
            f"largest free block {self._largest_free()} bytes. Free tensors that are no longer "
            f"needed, run with a smaller batch or input size, place part of the model on "
            f"another device, or give the {type(self).__name__} a larger capacity."
        )
        return OutOfMemoryError(
            message,
            device=self.device,
            need=need,
            capacity=self.capacity if self.capacity is not None else 0,
            in_use=self._in_use,
        )


def pool_factory(
    pool_class: Callable[..., MemoryPool], **options: Any
) -> Callable[[Any], MemoryPool]:
    """A ``registry.add_pool`` factory: ``factory(backend) -> pool_class(...)``.

    The pool serves ``backend.name``, takes its capacity from ``backend.device.memory_capacity``
    (unless ``capacity=`` is in ``options``), and uses the backend itself as raw allocator::

        registry.add_pool("npu", pool_factory(ArenaPool, alignment=128))
    """

    def factory(backend: Any) -> MemoryPool:
        kwargs = dict(options)
        kwargs.setdefault("capacity", getattr(backend.device, "memory_capacity", None))
        return pool_class(backend.name, allocator=backend, **kwargs)

    factory.__name__ = f"{getattr(pool_class, '__name__', 'pool')}_factory"
    return factory
