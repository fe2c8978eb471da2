"""``MemoryStats``: a snapshot of one memory pool's figures."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MemoryStats"]


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """A read-only snapshot of a pool's counters, taken by ``MemoryPool.stats()``.

    Invariants: ``0 <= requested <= in_use <= reserved``, ``in_use <= peak``, ``reserved <=
    capacity`` when a capacity is set, ``alloc_count - free_count`` is the number of live blocks,
    ``0.0 <= fragmentation < 1.0``.

    Attributes:
        device: The device name the pool serves (``cpu``, ``npu``, ``cuda:0``).
        capacity: The most bytes the pool may take from the device, ``None`` for no limit.
        in_use: Bytes held by live blocks, after rounding to the alignment or size class.
        requested: Bytes the callers asked for in the live blocks (before rounding); the
            difference to ``in_use`` is internal fragmentation.
        peak: The highest ``in_use`` since construction, ``reset()`` or ``reset_peak()``.
        reserved: Bytes the pool holds from the device: live blocks plus cached or free space.
        alloc_count: Successful ``alloc`` calls.
        free_count: ``free`` calls.
        fragmentation: External fragmentation of the free memory the pool holds:
            ``1 - largest_free / (reserved - in_use)``, 0.0 when nothing is free. 0.0 means one
            request for all the free bytes would succeed without asking the device for more.
        largest_free: The largest single free extent the pool holds, in bytes.
    """

    device: str
    capacity: int | None
    in_use: int
    requested: int
    peak: int
    reserved: int
    alloc_count: int
    free_count: int
    fragmentation: float
    largest_free: int

    @property
    def live_blocks(self) -> int:
        """The number of blocks allocated and not yet freed."""
        return self.alloc_count - self.free_count

    def __str__(self) -> str:
        cap = "unlimited" if self.capacity is None else _human(self.capacity)
        return (
            f"{self.device}: in use {_human(self.in_use)}, peak {_human(self.peak)}, "
            f"reserved {_human(self.reserved)} of {cap}, {self.live_blocks} live blocks "
            f"({self.alloc_count} allocs, {self.free_count} frees), "
            f"fragmentation {self.fragmentation:.1%}"
        )


def _human(nbytes: int) -> str:
    """Bytes in the largest binary unit that keeps the figure at or above 1."""
    value = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{nbytes} B"  # unreachable: the loop returns at GiB
