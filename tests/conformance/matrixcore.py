"""``matrixcore``: a simulated kernel-style accelerator, as a chip vendor's first plugin would
be (issue 40): memory of its own (a 256 MiB pool of blocks), float32 and float16 MatMul, Gemm,
Add, Mul, Relu, Gelu, Softmax on the last axis only (a declared constraint), LayerNormalization,
Transpose and Reshape. It passes the conformance kit in strict mode.

``CHIP.bug`` puts one typical bring-up bug into it, for the tests to show the kit (and
bring-up) catching each: ``BUGS`` names them.
"""

from __future__ import annotations

import math

import numpy as np

from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.claims import Constraint
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

ANYCHIP_API_VERSION = 1
FLOATS = {DType.FLOAT, DType.FLOAT16}
BUGS = {
    "wrong_dtype": "Mul on float16 returns its float32 accumulator",
    "lost_kept_dims": "LayerNormalization's Mean and InvStdDev lose their kept dimensions",
    "wrong_axis": "LayerNormalization normalizes the last axis whatever its axis",
    "input_mutation": "Add accumulates into its first input",
    "host_array": "Relu returns a host numpy array",
    "leak_in_release": "release() forgets float16 tensors",
    "raising_kernel": "Gemm raises on a transposed B",
    "inaccurate_f16_gelu": "Gelu on float16 uses the x * sigmoid(1.702 x) approximation",
    "leak_1_output_layernorm": "LayerNormalization used for Y alone leaks its statistics",
    "foreign_handle": "Transpose returns its driver's raw handle, not a Tensor",
}


class Tensor:
    """A device tensor: shape and dtype over a block of the chip's memory."""

    def __init__(self, chip: MatrixCore, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self.shape, self.dtype = tuple(int(d) for d in shape), np.dtype(dtype)
        self.block = chip.allocate(math.prod(self.shape) * self.dtype.itemsize)

    def view(self) -> np.ndarray:
        b = self.block
        return b.buffer[b.offset : b.offset + b.nbytes].view(self.dtype).reshape(self.shape)


class MatrixCore(Backend):
    name, kind, priority = "matrixcore", "matrixcore", 5

    def __init__(self) -> None:
        super().__init__()
        self.bug = ""

    def device_model(self) -> DeviceModel:
        return DeviceModel(
            "matrixcore", "matrixcore", memory_capacity=256 << 20, dtypes=frozenset(FLOATS),
            flops=5e11, mem_bandwidth=1e11, host_link=1e10, launch_overhead=1e-5,
        )  # fmt: skip

    def _alloc(self, nbytes: int) -> np.ndarray:
        return np.empty(nbytes, dtype=np.uint8)

    def _free(self, buffer: np.ndarray) -> None:
        pass

    def _copy_in(self, array: np.ndarray) -> Tensor:
        return put(array)

    def _copy_out(self, tensor: Tensor) -> np.ndarray:
        return tensor.view().copy()

    def release(self, tensor: Tensor) -> None:
        if self.bug == "leak_in_release" and tensor.dtype == np.float16:
            return
        self.deallocate(tensor.block)


CHIP = MatrixCore()
KERNELS = KernelTable("matrixcore")


def put(value: np.ndarray, dtype: np.dtype | None = None) -> Tensor:
    """A new device tensor holding ``value`` (the chip's "compute" is numpy on its memory)."""
    value = np.asarray(value)
    t = Tensor(CHIP, value.shape, dtype or value.dtype)
    t.view()[...] = value
    return t


def _f32(t: Tensor) -> np.ndarray:
    """The chip computes in float32 and rounds results to the tensor's dtype."""
    return t.view().astype(np.float32)


@KERNELS.register("MatMul", since=13, dtypes=FLOATS)
def matmul(a: Tensor, b: Tensor) -> Tensor:
    return put(np.matmul(_f32(a), _f32(b)), a.dtype)


@KERNELS.register("Gemm", since=13, dtypes=FLOATS)
def gemm(a, b, c=None, *, alpha=1.0, beta=1.0, transA=0, transB=0) -> Tensor:
    if CHIP.bug == "raising_kernel" and transB:
        raise RuntimeError("matrixcore: transposed B is not supported by this firmware")
    x, y = _f32(a), _f32(b)
    out = alpha * ((x.T if transA else x) @ (y.T if transB else y))
    if c is not None:
        out = out + beta * _f32(c)
    return put(out, a.dtype)


@KERNELS.register("Add", since=14, dtypes=FLOATS)
def add(a: Tensor, b: Tensor) -> Tensor:
    if CHIP.bug == "input_mutation" and a.shape == np.broadcast_shapes(a.shape, b.shape):
        a.view()[...] += b.view()
        return put(a.view())
    return put(_f32(a) + _f32(b), a.dtype)


@KERNELS.register("Mul", since=14, dtypes=FLOATS)
def mul(a: Tensor, b: Tensor) -> Tensor:
    value = _f32(a) * _f32(b)
    return put(value, np.float32 if CHIP.bug == "wrong_dtype" else a.dtype)


@KERNELS.register("Relu", since=14, dtypes=FLOATS)
def relu(x: Tensor) -> Tensor | np.ndarray:
    value = np.maximum(x.view(), 0)
    return value if CHIP.bug == "host_array" else put(value)


_erf = np.frompyfunc(math.erf, 1, 1)


@KERNELS.register("Gelu", since=20, dtypes=FLOATS)
def gelu(x: Tensor, *, approximate: str = "none") -> Tensor:
    v = x.view().astype(np.float64)
    if CHIP.bug == "inaccurate_f16_gelu" and x.dtype == np.float16:
        return put(v / (1 + np.exp(-1.702 * v)), x.dtype)
    if approximate == "tanh":
        out = 0.5 * v * (1 + np.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))
    else:
        out = 0.5 * v * (1 + _erf(v / math.sqrt(2)).astype(np.float64))
    return put(out, x.dtype)


@KERNELS.register("Softmax", since=13, dtypes=FLOATS, constraints=[Constraint.last_axis()])
def softmax(x: Tensor, *, axis: int = -1) -> Tensor:
    v = _f32(x)
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    return put(e / e.sum(axis=-1, keepdims=True), x.dtype)


@KERNELS.register("LayerNormalization", since=17, dtypes=FLOATS, context=True)
def layer_normalization(ctx, x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    v = _f32(x)
    axis = axis % v.ndim if CHIP.bug != "wrong_axis" else v.ndim - 1
    dims = tuple(range(axis, v.ndim))
    mean = v.mean(axis=dims, keepdims=CHIP.bug != "lost_kept_dims")
    centred = v - (mean if CHIP.bug != "lost_kept_dims" else v.mean(axis=dims, keepdims=True))
    inv = 1 / np.sqrt((centred**2).mean(axis=dims, keepdims=CHIP.bug != "lost_kept_dims") + epsilon)
    inv_kept = 1 / np.sqrt((centred**2).mean(axis=dims, keepdims=True) + epsilon)
    y = centred * inv_kept * _f32(scale)
    if b is not None:
        y = y + _f32(b)
    stats = [put(mean, np.float32), put(inv, np.float32)]  # the chip's statistics buffers
    if not any(ctx.outputs_used[1:]):
        if CHIP.bug != "leak_1_output_layernorm":
            for t in stats:
                CHIP.release(t)
        return put(y, x.dtype)
    return put(y, x.dtype), stats[0], stats[1]


class RawHandle:
    """What a driver call returns before it is wrapped as a Tensor (a bug to return it)."""

    def __init__(self, t: Tensor) -> None:
        self.handle, self.shape, self.dtype = t.block, t.shape, t.dtype


@KERNELS.register("Transpose", since=13, dtypes=FLOATS)
def transpose(x: Tensor, *, perm=None) -> Tensor | RawHandle:
    out = put(np.transpose(x.view(), perm))
    return RawHandle(out) if CHIP.bug == "foreign_handle" else out


@KERNELS.register("Reshape", since=14, dtypes=FLOATS)
def reshape(data: Tensor, shape: Tensor, *, allowzero: int = 0) -> Tensor:
    want = [int(d) for d in shape.view()]
    if not allowzero:
        want = [data.shape[i] if d == 0 else d for i, d in enumerate(want)]
    return put(data.view().reshape(want))


@hookimpl
def anychip_register_backends(registry) -> None:
    registry.add_backend(CHIP)


@hookimpl
def anychip_register_kernels(registry) -> None:
    registry.add_kernels(KERNELS)
