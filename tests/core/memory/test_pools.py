"""Memory pools: statistics, caching by size class, arena coalescing, capacity, reset."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from anychip.core.memory import (
    ArenaPool,
    Block,
    CachingPool,
    MemoryPool,
    NumpyAllocator,
    as_array,
    pool_factory,
    size_class,
)
from anychip.errors import DeviceError, OutOfMemoryError

POOLS = [MemoryPool, CachingPool, ArenaPool]


class HandleAllocator:
    """A fake device: buffers are integer handles, so pools cannot rely on numpy.

    ``device_limit`` makes ``_alloc`` raise ``MemoryError`` the way a full device does.
    """

    def __init__(self, device_limit: int | None = None) -> None:
        self.device_limit = device_limit
        self.live: dict[int, int] = {}
        self.allocs: list[int] = []
        self.frees: list[int] = []
        self._next = 1

    def _alloc(self, nbytes: int) -> int:
        if self.device_limit is not None and sum(self.live.values()) + nbytes > self.device_limit:
            raise MemoryError(f"device has no room for {nbytes} bytes")
        handle = self._next
        self._next += 1
        self.live[handle] = nbytes
        self.allocs.append(nbytes)
        return handle

    def _free(self, buffer: int) -> None:
        assert buffer in self.live, "pool freed a handle twice or one it never got"
        self.frees.append(self.live.pop(buffer))


def make(cls, capacity=1 << 16, **kw):
    allocator = kw.pop("allocator", None) or HandleAllocator()
    return cls("npu", capacity=capacity, allocator=allocator, **kw), allocator


# -- statistics ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", POOLS)
def test_stats_in_use_peak_counts(cls):
    pool, dev = make(cls)
    a = pool.alloc(100)
    b = pool.alloc(64)
    s = pool.stats()
    assert (a.size, b.size) == (128, 64)
    assert s.in_use == 192 and s.requested == 164 and s.peak == 192
    assert s.alloc_count == 2 and s.free_count == 0 and s.live_blocks == 2
    assert s.in_use <= s.reserved <= pool.capacity
    assert s.reserved == sum(dev.live.values())
    pool.free(a)
    s = pool.stats()
    assert s.in_use == 64 and s.requested == 64 and s.peak == 192
    assert s.alloc_count == 2 and s.free_count == 1
    assert s.reserved == sum(dev.live.values())
    pool.reset_peak()
    assert pool.stats().peak == 64
    c = pool.alloc(1000)
    assert pool.stats().peak == 64 + c.size
    assert "npu" in str(pool.stats())


def test_plain_pool_gives_memory_back_at_once():
    pool, dev = make(MemoryPool)
    block = pool.alloc(10)
    assert dev.live == {block.buffer: 64}
    pool.free(block)
    assert dev.live == {} and pool.stats().reserved == 0
    assert pool.stats().fragmentation == 0.0


@pytest.mark.parametrize("cls", POOLS)
@pytest.mark.parametrize("alignment", [16, 256])
def test_alignment_is_configurable(cls, alignment):
    pool, _ = make(cls, alignment=alignment)
    blocks = [pool.alloc(n) for n in (1, 17, 300, 0)]
    for b in blocks:
        assert b.size % alignment == 0 and b.offset % alignment == 0 and b.size >= b.nbytes
    assert len({(b.buffer, b.offset) for b in blocks}) == 4  # zero bytes still gets its own


@pytest.mark.parametrize("cls", POOLS)
def test_bad_alignment_rejected(cls):
    with pytest.raises(ValueError, match="power of two"):
        cls("npu", capacity=1024, allocator=HandleAllocator(), alignment=48)


def test_allocator_without_methods_rejected():
    with pytest.raises(TypeError, match="_alloc"):
        MemoryPool("npu", allocator=object())


# -- misuse --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", POOLS)
def test_double_free_and_foreign_block(cls):
    pool, _ = make(cls)
    other, _ = make(cls)
    block = pool.alloc(10)
    with pytest.raises(DeviceError, match="belongs to"):
        other.free(block)
    pool.free(block)
    with pytest.raises(DeviceError, match="already freed"):
        pool.free(block)
    with pytest.raises(DeviceError, match="negative"):
        pool.alloc(-1)
    with pytest.raises(DeviceError, match="integer"):
        pool.alloc(1.5)
    assert pool.stats().free_count == 1


def test_driver_failure_becomes_device_error():
    class Broken(HandleAllocator):
        def _alloc(self, nbytes):
            raise RuntimeError("bus error")

    pool = MemoryPool("xpu", allocator=Broken())
    with pytest.raises(DeviceError, match="xpu.*bus error"):
        pool.alloc(8)
    assert pool.stats().reserved == 0


# -- capacity ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", POOLS)
def test_capacity_exceeded_then_usable(cls):
    pool, dev = make(cls, capacity=1024)
    first = pool.alloc(512)
    before = pool.stats()
    with pytest.raises(OutOfMemoryError) as info:
        pool.alloc(1000)
    err = info.value
    assert err.device == "npu" and err.need == 1000 and err.capacity == 1024
    assert err.in_use == 512
    message = str(err)
    assert "1000 bytes" in message and "1024" in message and "512" in message
    assert "capacity" in message and "smaller batch" in message
    assert isinstance(err, MemoryError) and isinstance(err, DeviceError)
    after = pool.stats()
    assert (after.in_use, after.reserved, after.alloc_count) == (
        before.in_use,
        before.reserved,
        before.alloc_count,
    )
    pool.free(first)
    pool.trim()
    again = pool.alloc(1000)
    assert again.size == 1024 and pool.stats().in_use == 1024
    pool.free(again)


def test_device_refusal_is_out_of_memory():
    pool = MemoryPool("xpu", allocator=HandleAllocator(device_limit=256))
    pool.alloc(200)
    with pytest.raises(OutOfMemoryError, match="device refused"):
        pool.alloc(200)
    assert pool.stats().reserved == 256


def test_caching_pool_trims_cache_when_device_refuses():
    dev = HandleAllocator(device_limit=2048)
    pool = CachingPool("xpu", allocator=dev)
    pool.free(pool.alloc(1024))
    pool.free(pool.alloc(512))
    assert pool.cached_bytes == 1536
    block = pool.alloc(2048)  # the device is full of cached blocks: they go back first
    assert block.size == 2048 and pool.cached_bytes == 0 and dev.live == {block.buffer: 2048}


# -- caching pool --------------------------------------------------------------------------------
def test_size_classes():
    assert [size_class(n) for n in (0, 1, 64, 65, 256, 300, 1024, 1025, 1100, 1300, 2049)] == [
        64,
        64,
        64,
        128,
        256,
        320,
        1024,
        1280,
        1280,
        1536,
        2560,
    ]
    assert size_class(1025, divisions=1) == 2048
    for n in range(1, 20000, 37):
        c = size_class(n)
        assert c >= n and c % 64 == 0 and (c - n) < max(64, n // 4 + 64)


def test_caching_pool_reuses_by_size_class():
    pool, dev = make(CachingPool)
    a = pool.alloc(1100)
    handle = a.buffer
    pool.free(a)
    assert pool.stats().reserved == 1280 and pool.stats().in_use == 0
    b = pool.alloc(1200)  # same class (1280): the cached buffer comes back
    assert b.buffer == handle and len(dev.allocs) == 1 and pool.hits == 1
    c = pool.alloc(1300)  # class 1536: a new raw allocation
    assert c.buffer != handle and len(dev.allocs) == 2 and pool.misses == 2
    pool.free(b)
    pool.free(c)
    s = pool.stats()
    assert s.reserved == 1280 + 1536 and s.largest_free == 1536
    assert s.fragmentation == pytest.approx(1 - 1536 / (1280 + 1536))
    assert pool.trim() == 1280 + 1536
    assert dev.live == {} and pool.stats().fragmentation == 0.0


def test_caching_pool_evicts_least_recent_to_fit_capacity():
    pool, dev = make(CachingPool, capacity=4096)
    blocks = [pool.alloc(1024) for _ in range(3)]
    order = [b.buffer for b in blocks]
    for b in blocks:
        pool.free(b)
    assert pool.cached_bytes == 3072
    big = pool.alloc(2048)  # 1024 over the capacity: evict only the block freed first
    assert pool.stats().reserved == 4096
    assert order[0] not in dev.live and order[1] in dev.live and order[2] in dev.live
    assert pool.cached_bytes == 2048 and big.size == 2048
    reused = pool.alloc(1000)
    assert reused.buffer == order[2]  # the most recently freed (warmest) is reused


def test_caching_pool_max_cached():
    pool, dev = make(CachingPool, max_cached=2048)
    blocks = [pool.alloc(1024) for _ in range(3)]
    for b in blocks:
        pool.free(b)
    assert pool.cached_bytes == 2048 and len(dev.live) == 2
    assert blocks[0].buffer not in dev.live  # least recently freed went back


# -- arena ---------------------------------------------------------------------------------------
def test_arena_requires_a_size():
    with pytest.raises(ValueError, match="capacity= or region_size="):
        ArenaPool("npu", allocator=HandleAllocator())


def test_arena_offsets_in_one_region_and_coalescing():
    pool, dev = make(ArenaPool, capacity=4096)
    a, b, c = pool.alloc(256), pool.alloc(512), pool.alloc(256)
    assert len(dev.allocs) == 1 and dev.allocs[0] == 4096
    assert a.buffer == b.buffer == c.buffer
    assert (a.offset, b.offset, c.offset) == (0, 256, 768)
    pool.free(a)
    pool.free(c)  # merges with the free tail
    assert pool.layout() == [(0, 0, 256, True), (0, 256, 512, False), (0, 768, 3328, True)]
    s = pool.stats()
    assert s.largest_free == 3328 and s.fragmentation == pytest.approx(1 - 3328 / 3584)
    pool.free(b)  # merges with both neighbours: one free chunk again
    assert pool.layout() == [(0, 0, 4096, True)]
    assert pool.stats().fragmentation == 0.0 and pool.stats().largest_free == 4096


def test_arena_best_fit_takes_smallest_hole():
    pool, _ = make(ArenaPool, capacity=8192)
    blocks = [pool.alloc(n) for n in (512, 64, 128, 64, 1024)]
    pool.free(blocks[0])  # hole of 512 at 0
    pool.free(blocks[2])  # hole of 128 at 576
    block = pool.alloc(100)
    assert block.offset == 576 and block.size == 128
    block = pool.alloc(200)
    assert block.offset == 0  # the 512 hole, not the tail


def test_arena_fragmentation_blocks_large_request():
    pool, _ = make(ArenaPool, capacity=1024)
    blocks = [pool.alloc(256) for _ in range(4)]
    pool.free(blocks[0])
    pool.free(blocks[2])
    s = pool.stats()
    assert s.reserved - s.in_use == 512 and s.fragmentation == pytest.approx(0.5)
    with pytest.raises(OutOfMemoryError, match="largest free block 256"):
        pool.alloc(512)
    pool.free(blocks[1])
    assert pool.alloc(512).offset == 0  # the three merged chunks serve it now


def test_arena_grows_in_regions_and_trims():
    pool, dev = make(ArenaPool, capacity=4096, region_size=1024)
    a = pool.alloc(1024)
    b = pool.alloc(512)
    c = pool.alloc(2048)  # larger than a region: a region of its own size
    assert dev.allocs == [1024, 1024, 2048] and pool.region_count == 3
    assert len({a.buffer, b.buffer, c.buffer}) == 3
    with pytest.raises(OutOfMemoryError):
        pool.alloc(1024)  # 512 free in region 1, the capacity is spent
    pool.free(a)
    assert pool.trim() == 1024 and pool.region_count == 2
    pool.free(c)
    d = pool.alloc(3000)  # an empty region is given back to make room under the capacity
    assert d.size == 3008 and pool.stats().reserved <= 4096
    assert pool.stats().reserved == sum(dev.live.values())


def test_arena_no_merge_across_regions():
    pool, _ = make(ArenaPool, capacity=2048, region_size=1024)
    a, b = pool.alloc(1024), pool.alloc(1024)
    pool.free(a)
    pool.free(b)
    assert pool.layout() == [(0, 0, 1024, True), (1, 0, 1024, True)]
    assert pool.stats().fragmentation == pytest.approx(0.5)


# -- reset ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", POOLS)
def test_reset_returns_everything(cls):
    pool, dev = make(cls)
    live = [pool.alloc(n) for n in (100, 2000, 300)]
    pool.free(live.pop())
    pool.reset()
    assert dev.live == {}
    s = pool.stats()
    assert (s.in_use, s.reserved, s.peak, s.alloc_count, s.free_count) == (0, 0, 0, 0, 0)
    assert not any(b.live for b in live)
    with pytest.raises(DeviceError, match="already freed"):
        pool.free(live[0])
    block = pool.alloc(100)
    assert block.live and pool.stats().in_use == 128


# -- host memory ---------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", POOLS)
def test_numpy_views(cls):
    pool = cls("cpu", capacity=1 << 16, allocator=NumpyAllocator())
    a, b = pool.alloc(4 * 12), pool.alloc(8 * 6)
    x = as_array(a, np.float32, (3, 4))
    y = as_array(b, np.float64, (2, 3))
    x[:] = 1.5
    y[:] = -2.0
    assert x.ctypes.data % 64 == 0 and y.ctypes.data % 64 == 0
    assert np.all(as_array(a, np.float32, (12,)) == 1.5)
    assert np.all(as_array(b, np.float64, (6,)) == -2.0)  # no bleeding between blocks
    with pytest.raises(DeviceError, match="needs 128 bytes"):
        as_array(a, np.float64, (16,))
    pool.free(a)
    with pytest.raises(DeviceError, match="freed"):
        as_array(a, np.float32, (3, 4))


def test_as_array_of_device_handle_refused():
    pool, _ = make(MemoryPool)
    with pytest.raises(DeviceError, match="not host memory"):
        as_array(pool.alloc(16), np.float32, (4,))


def test_pool_factory_reads_backend():
    class Device:
        memory_capacity = 4096

    class FakeBackend(HandleAllocator):
        name = "npu"
        device = Device()

    factory = pool_factory(ArenaPool, alignment=128)
    pool = factory(FakeBackend())
    assert isinstance(pool, ArenaPool) and pool.device == "npu"
    assert pool.capacity == 4096 and pool.alignment == 128
    assert pool.alloc(1).size == 128


# -- random workloads ----------------------------------------------------------------------------
ops = st.lists(st.tuples(st.booleans(), st.integers(0, 3000), st.integers(0, 50)), max_size=60)


@pytest.mark.parametrize("cls", POOLS)
@settings(max_examples=40, deadline=None)
@given(script=ops)
def test_random_alloc_free_keeps_invariants(cls, script):
    pool, dev = make(cls, capacity=16384, **({"region_size": 4096} if cls is ArenaPool else {}))
    live: list[Block] = []
    for is_alloc, nbytes, pick in script:
        if is_alloc or not live:
            try:
                live.append(pool.alloc(nbytes))
            except OutOfMemoryError as e:
                assert e.need == nbytes
        else:
            pool.free(live.pop(pick % len(live)))
        s = pool.stats()
        assert s.in_use == sum(b.size for b in live)
        assert s.requested == sum(b.nbytes for b in live)
        assert s.in_use <= s.reserved <= 16384
        assert s.reserved == sum(dev.live.values())
        assert 0.0 <= s.fragmentation < 1.0
        spans = sorted((b.buffer, b.offset, b.offset + b.size) for b in live)
        for (buf1, _, end1), (buf2, start2, _) in zip(spans, spans[1:]):
            assert buf1 != buf2 or end1 <= start2, "two live blocks overlap"
    if cls is ArenaPool:
        layout = pool.layout()
        for (r1, o1, s1, f1), (r2, o2, _, f2) in zip(layout, layout[1:]):
            if r1 == r2:
                assert o1 + s1 == o2, "chunks must tile the region"
                assert not (f1 and f2), "adjacent free chunks must have been merged"
    for b in live:
        pool.free(b)
    assert pool.stats().in_use == 0
    pool.trim()
    assert dev.live == {}


@pytest.mark.parametrize("cls", POOLS)
def test_threads_share_a_pool(cls):
    import threading

    pool, dev = make(cls, capacity=1 << 20)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            for i in range(200):
                pool.free(pool.alloc(64 * (1 + (seed * 7 + i) % 9)))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = pool.stats()
    assert s.in_use == 0 and s.alloc_count == s.free_count == 800
    assert s.reserved == sum(dev.live.values())
