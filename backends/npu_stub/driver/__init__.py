"""The NPU's device memory: one fixed ``uint8`` array, carved up by the shared arena pool.

Invariants:
    * The device owns exactly one numpy ``uint8`` array of ``capacity`` bytes (``NpuMemory.data``);
      nothing outside the NPU backend holds a view of it, so a host array never aliases device
      memory and every transfer is a real byte copy.
    * Allocation goes through ``core.memory.ArenaPool`` (best fit with coalescing) whose single
      region is that array; ``NpuMemory`` is the pool's raw allocator and hands the region out
      once.
    * A device tensor is a handle, ``NpuTensor``: a pool block (its ``offset`` into the device
      memory), a shape and a dtype. It holds no host data.
"""

from __future__ import annotations

import os
import re
from math import prod
from typing import Any

import numpy as np

from anychip.core.memory import ArenaPool, Block
from anychip.errors import DeviceError

__all__ = ["NpuMemory", "NpuTensor", "parse_size", "DEFAULT_MEMORY", "memory_from_env"]

#: Bytes of device memory when neither ``device_options`` nor ``ANYCHIP_NPU_MEMORY`` say.
DEFAULT_MEMORY = 256 << 20

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str | int, what: str = "NPU memory") -> int:
    """Bytes from an int or a string such as ``"67108864"``, ``"64M"``, ``"64MiB"``, ``"1g"``.

    Raises:
        DeviceError: the text is not a positive size.
    """
    if isinstance(text, (int, np.integer)) and not isinstance(text, bool):
        size = int(text)
    else:
        m = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(i?[bB])?\s*", str(text))
        if m is None:
            raise DeviceError(
                f"{what} must be a number of bytes such as 67108864, 64M or 64MiB; got {text!r}"
            )
        size = int(m.group(1)) * _UNITS[m.group(2).lower()]
    if size <= 0:
        raise DeviceError(f"{what} must be positive, got {text!r}")
    return size


def memory_from_env() -> int:
    """``ANYCHIP_NPU_MEMORY`` in bytes, else ``DEFAULT_MEMORY``."""
    text = os.environ.get("ANYCHIP_NPU_MEMORY")
    return DEFAULT_MEMORY if not text else parse_size(text, "ANYCHIP_NPU_MEMORY")


class NpuTensor:
    """A tensor in NPU memory: ``offset`` bytes into the device array, ``shape``, ``dtype``.

    Owned by whoever received it from the backend; ``NpuBackend.release`` frees it once.
    """

    __slots__ = ("block", "shape", "dtype", "device")

    def __init__(self, block: Block, shape: tuple[int, ...], dtype: np.dtype, device: Any) -> None:
        self.block = block
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.device = device

    @property
    def offset(self) -> int:
        return self.block.offset

    @property
    def nbytes(self) -> int:
        return prod(self.shape) * self.dtype.itemsize

    @property
    def live(self) -> bool:
        return self.block.live

    def __repr__(self) -> str:
        state = "" if self.block.live else ", freed"
        return f"NpuTensor(offset={self.offset}, {self.dtype}{list(self.shape)}{state})"


class NpuMemory:
    """The simulated device memory and the pool over it.

    Args:
        capacity: Bytes of device memory (the whole array is reserved up front; ``np.zeros``
            lets the OS commit pages only when they are touched).
        name: The device name used in messages.
        pool_factory: A pool registered for kind ``npu`` (``factory(memory) -> MemoryPool``),
            given this object as its raw allocator. The device memory is one region, so the
            pool must take it in one raw allocation (``ArenaPool`` with
            ``region_size=capacity`` does); default that ``ArenaPool``.
    """

    def __init__(self, capacity: int, name: str = "npu", pool_factory: Any = None) -> None:
        self.capacity = capacity
        self.name = name
        self.device = self  # what a pool factory reads: ``device.memory_capacity``
        self.memory_capacity = capacity
        self.data = np.zeros(capacity, dtype=np.uint8)
        self._handed_out = False
        if pool_factory is not None:
            self.pool = pool_factory(self)
        else:
            self.pool = ArenaPool(
                name, capacity=capacity, allocator=self, alignment=64, region_size=capacity
            )

    # -- raw allocator of the pool: the single region is the whole device array --------------
    def _alloc(self, nbytes: int) -> np.ndarray:
        if self._handed_out or nbytes > self.capacity:
            raise MemoryError(f"the NPU has one memory region of {self.capacity} bytes")
        self._handed_out = True
        return self.data

    def _free(self, buffer: Any) -> None:
        self._handed_out = False

    # -- typed views (used by the backend and its compiled executables only) ------------------
    def view(self, offset: int, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """A ``dtype`` array of ``shape`` over the device bytes starting at ``offset``."""
        dtype = np.dtype(dtype)
        nbytes = prod(shape) * dtype.itemsize
        if offset < 0 or offset + nbytes > self.capacity:
            raise DeviceError(
                f"npu: view of {nbytes} bytes at offset {offset} is outside device memory "
                f"of {self.capacity} bytes"
            )
        return self.data[offset : offset + nbytes].view(dtype).reshape(shape)

    def tensor_view(self, tensor: NpuTensor) -> np.ndarray:
        """The device bytes of ``tensor`` as a typed array (no copy)."""
        if not isinstance(tensor, NpuTensor):
            raise DeviceError(f"npu: expected an NpuTensor, got {type(tensor).__name__}")
        if tensor.block.pool is not self.pool:
            raise DeviceError(
                f"npu: {tensor!r} belongs to another NPU instance (a session configured with "
                "other device_options); copy it through the host"
            )
        if not tensor.block.live:
            raise DeviceError(f"npu: {tensor!r} was already released; it cannot be read")
        return self.view(tensor.offset, tensor.shape, tensor.dtype)

    def alloc_tensor(self, shape: tuple[int, ...], dtype: Any) -> NpuTensor:
        """A fresh device tensor (contents undefined). Raises ``OutOfMemoryError``."""
        dtype = np.dtype(dtype)
        block = self.pool.alloc(prod(shape) * dtype.itemsize)
        return NpuTensor(block, shape, dtype, self)

    def free(self, tensor: NpuTensor) -> None:
        self.pool.free(tensor.block)
