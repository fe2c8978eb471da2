"""CuPy's memory pool behind anychip's pool interface, and pinned host buffers for copies.

``CupyPool`` is an anychip ``MemoryPool`` whose raw allocator is CuPy's ``MemoryPool`` of one
device (CuPy's size-binned cache stays the allocator; anychip keeps the accounting). It is
installed as CuPy's allocator (``cupy.cuda.set_allocator``) while a device's kernels run, so
every array the array-API kernels create is a block of it: ``alloc`` takes a block, and the
``MemoryPointer`` handed to CuPy owns a ``_Lease`` whose finalizer queues the block for
``free`` when CuPy drops the array. Frees are queued rather than done in the finalizer (which
may run inside the pool's own lock, in the middle of an update) and drained at the next call.
``stats()`` adds the bytes CuPy caches to ``reserved``. ``hold()`` keeps every block allocated
while it is open alive (a CUDA graph's captured addresses must never be handed out again).

``Staging`` copies between host and device through one pinned (page-locked) host buffer per
device, grown on demand, on one blocking stream (it waits for the kernels of the legacy
default stream, so a download sees their results). A copy waits for itself before it returns
(the staging buffer is reused), which is still the fast path: pageable copies are staged by
the driver anyway.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from anychip.core.memory.pool import Block, MemoryPool
from anychip.core.memory.stats import MemoryStats

__all__ = ["CupyPool", "Staging"]


class _CupyRaw:
    """The raw allocator over CuPy's pool: ``MemoryPointer`` objects in, dropped out."""

    def __init__(self, cupy_pool: Any) -> None:
        self.cupy_pool = cupy_pool

    def _alloc(self, nbytes: int) -> Any:
        try:
            return self.cupy_pool.malloc(nbytes)
        except Exception as e:
            if "OutOfMemory" in type(e).__name__:
                raise MemoryError(str(e)) from e
            raise

    def _free(self, buffer: Any) -> None:
        del buffer  # the pointer's last reference: CuPy's pool caches the memory again


class _Lease:
    """Owned by the pointer CuPy gets; queues its block for ``free`` when CuPy drops it."""

    __slots__ = ("pool", "block")

    def __init__(self, pool: CupyPool, block: Block) -> None:
        self.pool, self.block = pool, block

    def __del__(self) -> None:
        self.pool._dead.append(self.block)  # list.append is atomic: safe in a finalizer


class CupyPool(MemoryPool):
    """anychip's pool interface over CuPy's memory pool (see the module docstring)."""

    def __init__(
        self, device_name: str, *, cupy: Any, cupy_pool: Any, capacity: int | None
    ) -> None:
        super().__init__(
            device_name, capacity=capacity, allocator=_CupyRaw(cupy_pool), alignment=512
        )
        self.cupy = cupy
        self.cupy_pool = cupy_pool
        self._dead: list[Block] = []
        self._held: list[list[Any]] = []
        self._hold_lock = threading.Lock()

    def _drain(self) -> None:
        while self._dead:
            block = self._dead.pop()
            if block.live:
                self.free(block)

    def cupy_malloc(self, nbytes: int) -> Any:
        """The allocator function CuPy calls: a block wrapped as a ``MemoryPointer``."""
        self._drain()
        block = self.alloc(nbytes)
        ptr = block.buffer
        mem = self.cupy.cuda.UnownedMemory(int(ptr.ptr), block.size, _Lease(self, block))
        out = self.cupy.cuda.MemoryPointer(mem, 0)
        with self._hold_lock:
            for held in self._held:
                held.append(out)
        return out

    @contextlib.contextmanager
    def hold(self) -> Iterator[list[Any]]:
        """Collect (and so keep alive) every pointer allocated inside the block."""
        held: list[Any] = []
        with self._hold_lock:
            self._held.append(held)
        try:
            yield held
        finally:
            with self._hold_lock:
                self._held.remove(held)

    def stats(self) -> MemoryStats:
        self._drain()
        s = super().stats()
        cached = int(self.cupy_pool.free_bytes())
        return MemoryStats(
            s.device, s.capacity, s.in_use, s.requested, s.peak, s.reserved + cached,
            s.alloc_count, s.free_count, s.fragmentation, max(s.largest_free, 0),
        )  # fmt: skip

    def trim(self) -> int:
        self._drain()
        before = int(self.cupy_pool.free_bytes())
        self.cupy_pool.free_all_blocks()
        return before


class Staging:
    """Host <-> device copies through a pinned buffer on one stream (module docstring)."""

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy
        self.stream = cupy.cuda.Stream(non_blocking=False)
        self._mem: Any = None
        self._size = 0
        self._lock = threading.Lock()

    def _pinned(self, nbytes: int) -> np.ndarray:
        if nbytes > self._size:
            size = max(nbytes, 2 * self._size, 1 << 20)
            self._mem = self.cupy.cuda.alloc_pinned_memory(size)
            self._size = size
        return np.frombuffer(self._mem, np.uint8, nbytes)

    def upload(self, host: np.ndarray) -> Any:
        """A device copy of a C-contiguous host array."""
        cp = self.cupy
        out = cp.empty(host.shape, host.dtype)
        if host.size == 0:
            return out
        with self._lock:
            view = self._pinned(host.nbytes).view(host.dtype).reshape(host.shape)
            np.copyto(view, host)
            out.set(view, stream=self.stream)
            self.stream.synchronize()
        return out

    def download(self, array: Any) -> np.ndarray:
        """A fresh host array with the device array's elements."""
        dtype = np.dtype(array.dtype)
        out = np.empty(array.shape, dtype)
        if out.size == 0:
            return out
        with self._lock:
            view = self._pinned(out.nbytes).view(dtype).reshape(out.shape)
            array.get(stream=self.stream, out=view)
            self.stream.synchronize()
            np.copyto(out, view)
        return out
