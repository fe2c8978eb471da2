"""toychip: a kernel-style chip with its own memory, written against anychip's backend contract.

Read top to bottom: the chip's memory (one heap, carved up by anychip's ``ArenaPool``), device
tensors (handles into the heap), the backend (byte copies in and out of the heap), the kernels
(numpy on views of the heap stands in for the chip's ALU), then the two hooks anychip calls.
"""

from collections.abc import Callable

import numpy as np

from anychip import hookimpl
from anychip.core.memory import ArenaPool, MemoryStats, NumpyAllocator, as_array
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.kernels import KernelTable
from anychip.core.plugin.registry import Registry
from anychip.ir.dtypes import DType

ANYCHIP_API_VERSION = 1  # the hook API this plugin was written for
KERNELS = KernelTable("toychip")
F32 = {DType.FLOAT}

# The chip's memory: one 64 MiB heap, taken from the host once and handed out in 64-byte aligned
# blocks (best fit, freed blocks coalesced). A full heap raises anychip.OutOfMemoryError.
HEAP = ArenaPool("toychip", capacity=64 << 20, allocator=NumpyAllocator())


class ToyTensor:
    """A device tensor: a handle on a block of the heap, read as ``shape`` and ``dtype``.

    It is made by copying a host array (or numpy scalar) into a new block; ``view()`` is the
    only way to its bytes, and ``ToyChip.release`` frees the block.
    """

    def __init__(self, array: np.ndarray) -> None:
        self.shape, self.dtype = array.shape, array.dtype
        self.block = HEAP.alloc(array.nbytes)
        self.view()[...] = array

    def view(self) -> np.ndarray:
        """The tensor's bytes in the heap as an array (what the chip's ALU reads and writes)."""
        return as_array(self.block, self.dtype, self.shape)


class ToyChip(Backend):
    """The backend: copies are byte copies between host arrays and the heap."""

    name, kind, priority = "toychip", "toychip", 10

    def device_model(self) -> DeviceModel:
        # host_link: copies cross a bus (None would tell the cost model the chip is host memory)
        return DeviceModel(
            self.name, self.kind, memory_capacity=HEAP.capacity, dtypes=F32, host_link=1e10
        )

    def _copy_in(self, array: np.ndarray) -> ToyTensor:
        return ToyTensor(array)

    def _copy_out(self, tensor: ToyTensor) -> np.ndarray:
        return tensor.view().copy()

    def release(self, tensor: ToyTensor) -> None:
        HEAP.free(tensor.block)

    def memory_stats(self) -> MemoryStats:
        return HEAP.stats()


def _on_chip(fn: Callable[..., np.ndarray]) -> Callable[..., ToyTensor]:
    """The kernel that runs ``fn`` on its inputs' views of the heap and stores the result there."""

    def kernel(*xs: ToyTensor, **attributes: object) -> ToyTensor:
        return ToyTensor(fn(*(x.view() for x in xs), **attributes))

    kernel.__name__ = fn.__name__
    return kernel


# since..until: the ONNX schema versions a kernel serves, e.g. Add-7, Add-13 and Add-14 (which
# differ only in the types they allow). An opset-9 model's Add resolves to Add-7.
KERNELS.register("Add", since=7, until=14, dtypes=F32)(_on_chip(np.add))
KERNELS.register("Mul", since=7, until=14, dtypes=F32)(_on_chip(np.multiply))
KERNELS.register("MatMul", since=1, until=13, dtypes=F32)(_on_chip(np.matmul))


@KERNELS.register("Relu", since=6, until=14, dtypes=F32)
@_on_chip
def relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0)


@KERNELS.register("Softmax", since=13, until=13, dtypes=F32)
@_on_chip
def softmax(x: np.ndarray, *, axis: int | tuple[int, ...] = -1) -> np.ndarray:
    """Softmax-13: along ``axis`` alone."""
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


@KERNELS.register("Softmax", since=1, until=12, dtypes=F32)
def softmax_2d(x: ToyTensor, *, axis: int = 1) -> ToyTensor:
    """Softmax-1 and -11 see ``x`` as a matrix whose rows are the dims before ``axis``: that is
    one softmax over all the axes from ``axis`` on."""
    return softmax(x, axis=tuple(range(len(x.shape)))[axis:])


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    registry.add_backend(ToyChip())


@hookimpl
def anychip_register_kernels(registry: Registry) -> None:
    registry.add_kernels(KERNELS)
