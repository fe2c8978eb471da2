"""``badchip``: a small kernel-style test device with its own memory (blocks from
``Backend.allocate``), and one switch per way a plugin can be wrong, so the tests can show
the conformance kit catching each."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from anychip.conformance import OpClaim
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

ANYCHIP_API_VERSION = 1
F32 = {DType.FLOAT}
F16 = {DType.FLOAT, DType.FLOAT16}
MODES = (
    "ok",
    "wrong_result",
    "wrong_dtype",
    "wrong_shape",
    "lossy_copy",
    "phantom_claim",
    "leak",
    "slow",
    "gone",
    "mutate_input",
    "stateful",
    "f16_inaccurate",
)


class Tensor:
    """A device tensor: a block of the chip's memory, with shape and dtype."""

    def __init__(self, chip: BadChip, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.block = chip.allocate(int(np.prod(shape, dtype=np.int64)) * self.dtype.itemsize)

    def view(self) -> np.ndarray:
        b = self.block
        raw = b.buffer[b.offset : b.offset + b.nbytes]
        return raw.view(self.dtype).reshape(self.shape)


class BadChip(Backend):
    name, kind, priority = "badchip", "badchip", 5

    def __init__(self, mode: str = "ok") -> None:
        super().__init__()
        self.mode = mode
        self.scratch: dict[tuple, np.ndarray] = {}

    def device_model(self) -> DeviceModel:
        return DeviceModel("badchip", "badchip", dtypes=frozenset(F16), host_link=1e10)

    def claims(self) -> list[OpClaim] | None:
        if self.mode != "phantom_claim":
            return None  # the kernel table
        return [OpClaim("", "Relu", 6, None, frozenset(F32)), OpClaim("", "Sigmoid", 6)]

    def check_node(self, node: Any) -> str | None:
        if self.mode == "undeclared_refusal" and node.op_type == "Add":
            return "Add refused in check_node, declared nowhere"
        return None

    def _alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def _free(self, buffer: np.ndarray) -> None:
        pass

    def new(self, shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
        return Tensor(self, shape, dtype)

    def _copy_in(self, array: np.ndarray) -> Tensor:
        t = self.new(array.shape, array.dtype)
        t.view()[...] = array
        return t

    def _copy_out(self, tensor: Tensor) -> np.ndarray:
        out = tensor.view().copy()
        if self.mode == "lossy_copy" and out.size > 1:
            out.reshape(-1)[-1] = 0  # the last element is lost on the way back
        return out

    def release(self, tensor: Tensor) -> None:
        if self.mode != "leak":
            self.deallocate(tensor.block)


CHIP = BadChip()
KERNELS = KernelTable("badchip")


@KERNELS.register("Relu", since=6, dtypes=F16, inplace=True)
def relu(x: Tensor) -> Tensor:
    mode = CHIP.mode
    if mode == "gone":
        raise RuntimeError("device lost: the driver stopped answering")
    if mode == "small_memory" and x.shape and x.shape[0] > 4:  # batches over 4 do not fit
        from anychip.errors import OutOfMemoryError

        raise OutOfMemoryError("badchip: out of memory", device="badchip", need=x.view().nbytes)
    if mode == "slow":
        time.sleep(0.002)  # a chip far slower than its declared figures
    dtype = np.float64 if mode == "wrong_dtype" else x.dtype
    shape = x.shape[:-1] if mode == "wrong_shape" and x.shape else x.shape
    out = CHIP.new(shape, dtype)
    value = x.view() if mode == "wrong_result" else np.maximum(x.view(), 0)
    if mode == "f16_inaccurate" and x.dtype == np.float16:
        value = value * np.float16(1 - 2**-7)  # 8 units in the last place off
    if mode == "stateful":  # accumulates into a buffer it never zeroes
        acc = CHIP.scratch.setdefault(x.shape, np.zeros(x.shape, x.dtype))
        acc += value
        value = acc
    out.view()[...] = value if mode != "wrong_shape" else value[..., 0]
    return out


@KERNELS.register("Add", since=7, dtypes=F32)
def add(a: Tensor, b: Tensor) -> Tensor:
    if CHIP.mode == "slow":
        time.sleep(0.002)
    if CHIP.mode == "mutate_input":  # accumulates into its first input
        a.view()[...] += b.view()
        value = a.view()
    else:
        value = a.view() + b.view()
    out = CHIP.new(value.shape, value.dtype)
    out.view()[...] = value
    return out


@KERNELS.register("Reshape", since=14, dtypes=F32)
def reshape(data: Tensor, shape: Tensor, allowzero: int = 0) -> Tensor:
    want = [int(d) for d in shape.view()]
    if not allowzero:
        want = [data.shape[i] if d == 0 else d for i, d in enumerate(want)]
    value = data.view().reshape(want)
    out = CHIP.new(value.shape, value.dtype)
    out.view()[...] = value
    return out


@hookimpl
def anychip_register_backends(registry) -> None:
    registry.add_backend(CHIP)


@hookimpl
def anychip_register_kernels(registry) -> None:
    registry.add_kernels(KERNELS)
