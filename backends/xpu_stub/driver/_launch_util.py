"""Argument helpers of the XPU launchers: dtype codes, strides, broadcasting, axes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from anychip.backends.xpu_stub.driver import XpuDriver, XpuTensor
from anychip.errors import KernelError, UnsupportedDTypeError

_FLOAT32 = np.dtype(np.float32)
_INT64 = np.dtype(np.int64)
_DTYPE_CODES = {_FLOAT32: 1, _INT64: 7}  # ONNX TensorProto codes, as xpu.h defines them

UNARY_OPS = frozenset(
    ["Relu", "Neg", "Abs", "Exp", "Log", "Sqrt", "Tanh", "Sigmoid", "Erf", "Reciprocal", "Gelu"]
)
"""Unary ops with a C kernel; Relu, Neg and Abs also take int64."""
_INT64_UNARY = frozenset(["Relu", "Neg", "Abs"])

BINARY_OPS = frozenset(["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"])
"""Broadcasting binary ops with a C kernel (float32 and int64; integer Div truncates)."""

REDUCE_OPS = frozenset(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"])
"""Reductions with a C kernel (ReduceMean is float32 only)."""


# ---- helpers ---------------------------------------------------------------------------------


def _dtype_code(op: str, dtype: np.dtype, allow_int64: bool = True) -> int:
    if dtype == _FLOAT32 or (allow_int64 and dtype == _INT64):
        return _DTYPE_CODES[dtype]
    allowed = "float32 and int64" if allow_int64 else "float32"
    raise UnsupportedDTypeError(
        f"the XPU {op} kernel takes {allowed} tensors, got {dtype}; cast the input or run this "
        "node on the cpu"
    )


def _elsize(op: str, dtype: np.dtype) -> int:
    if dtype.hasobject or dtype.itemsize not in (1, 2, 4, 8):
        raise UnsupportedDTypeError(
            f"the XPU {op} kernel moves elements of 1, 2, 4 or 8 bytes, got {dtype}; run this "
            "node on the cpu"
        )
    return dtype.itemsize


def _strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of a dense tensor."""
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _norm_axis(op: str, axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise KernelError(f"{op}: axis {axis} is out of range for a rank-{rank} tensor")
    return axis + rank if axis < 0 else axis


def _same_driver(op: str, tensors: Sequence[XpuTensor]) -> XpuDriver:
    driver = tensors[0].driver
    for t in tensors[1:]:
        if t.driver is not driver:
            raise KernelError(f"{op}: inputs live on different XPU devices; copy them first")
    return driver


def _output(
    driver: XpuDriver, out: XpuTensor | None, shape: Sequence[int], dtype: np.dtype
) -> XpuTensor:
    """``out`` (a planned tensor, ``core/run/memory.py``) when it has exactly this shape and
    dtype and is on ``driver``; else a new tensor (the out protocol: never write a misfit)."""
    shape = tuple(int(d) for d in shape)
    if out is not None and out.driver is driver and out.shape == shape and out.dtype == dtype:
        return out
    return driver.empty(shape, dtype)


def _launch(
    op: str,
    kernel: str,
    out: XpuTensor,
    inputs: Sequence[XpuTensor | None],
    iargs: Sequence[int],
    fargs: Sequence[float] = (),
) -> XpuTensor:
    """Launches ``kernel`` with buffers ``inputs + [out]``; frees ``out`` if the launch fails."""
    handles = [0 if t is None else t.handle for t in inputs] + [out.handle]
    try:
        out.driver.launch(kernel, handles, iargs, fargs)
    except BaseException:
        out.free()
        raise
    return out


def _broadcast(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's multidirectional broadcasting, with a KernelError naming the shapes."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        dims = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise KernelError(
                f"{op}: shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast"
            )
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides that read a dense ``shape`` as if it had ``out_shape`` (0 = repeat)."""
    pad = len(out_shape) - len(shape)
    dense = _strides(shape)
    return [0 if d < pad or shape[d - pad] == 1 else dense[d - pad] for d in range(len(out_shape))]


# ---- element-wise ----------------------------------------------------------------------------
