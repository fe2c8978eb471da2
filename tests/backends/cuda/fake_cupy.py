"""A stand-in for the parts of CuPy the CUDA backend's logic touches (runtime queries, the
memory pool, pinned memory, streams, host <-> device copies), backed by numpy, so that logic
runs in the test suite on machines without a GPU. It computes nothing on a device."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np


class FakeRuntime:
    def __init__(self, props: list[dict] | None = None, error: Exception | None = None) -> None:
        self.props = props or []
        self.error = error

    def getDeviceCount(self) -> int:
        if self.error is not None:
            raise self.error
        return len(self.props)

    def getDeviceProperties(self, i: int) -> dict:
        return self.props[i]


class FakePtr:
    def __init__(self, ptr: int, size: int, owner: Any = None) -> None:
        self.ptr, self.size, self.owner = ptr, size, owner


class FakeMemoryPool:
    """CuPy's pool: hands out pointers, caches what comes back (``free_bytes``)."""

    def __init__(self, limit: int = 1 << 30) -> None:
        self.next, self.limit, self.used, self.cached = 4096, limit, 0, 0
        self.freed_all = 0

    def malloc(self, nbytes: int) -> FakePtr:
        if self.used + nbytes > self.limit:
            raise type("OutOfMemoryError", (Exception,), {})(f"out of memory allocating {nbytes}")
        self.next += nbytes
        self.used += nbytes
        pool = self

        class _Ptr(FakePtr):
            def __del__(self) -> None:
                pool.used -= self.size
                pool.cached += self.size

        return _Ptr(self.next, nbytes)

    def free_bytes(self) -> int:
        return self.cached

    def free_all_blocks(self) -> None:
        self.freed_all += 1
        self.cached = 0


class FakeStream:
    def __init__(self, non_blocking: bool = False) -> None:
        self.non_blocking = non_blocking
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


class FakeArray:
    """A 'device' array: its own numpy storage, filled only by ``set``."""

    def __init__(self, shape: tuple, dtype: Any) -> None:
        self.data = np.zeros(shape, dtype)
        self.shape, self.dtype = self.data.shape, self.data.dtype

    def set(self, host: np.ndarray, stream: Any = None) -> None:
        self.data[...] = host
        self.set_stream = stream

    def get(self, stream: Any = None, out: np.ndarray | None = None) -> np.ndarray:
        out[...] = self.data
        return out


def make(props: list[dict] | None = None, error: Exception | None = None) -> SimpleNamespace:
    """A fake ``cupy`` module."""
    pinned: list[int] = []

    def alloc_pinned_memory(n: int) -> bytearray:
        pinned.append(n)
        return bytearray(n)

    cuda = SimpleNamespace(
        runtime=FakeRuntime(props, error),
        MemoryPool=FakeMemoryPool,
        UnownedMemory=lambda ptr, size, owner: FakePtr(ptr, size, owner),
        MemoryPointer=lambda mem, offset: SimpleNamespace(mem=mem, ptr=mem.ptr + offset),
        Stream=FakeStream,
        alloc_pinned_memory=alloc_pinned_memory,
    )
    return SimpleNamespace(cuda=cuda, empty=FakeArray, pinned=pinned)


#: an A100-40GB's properties as the CUDA runtime reports them
A100 = {
    "name": b"NVIDIA A100-PCIE-40GB", "totalGlobalMem": 42_298_834_944,
    "multiProcessorCount": 108, "clockRate": 1_410_000, "memoryClockRate": 1_215_000,
    "memoryBusWidth": 5120, "major": 8, "minor": 0,
}  # fmt: skip
