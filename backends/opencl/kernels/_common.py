"""Helpers the OpenCL kernel families share (not a kernel module).

``launch`` finds (building on first use) a kernel of a family's program for an element type
and enqueues it; ``launch1d`` rounds a 1-D size up to the device's work-group size (kernels
check ``i < n``). ``collapse`` merges adjacent axes that every operand walks contiguously, so
the strided kernels do as few divisions per element as the layout allows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anychip.backends.opencl.driver import ClDevice, ClTensor
from anychip.backends.opencl.driver.programs import CTYPES
from anychip.errors import KernelError, UnsupportedDTypeError

__all__ = [
    "ctype",
    "launch",
    "launch1d",
    "collapse",
    "contiguous_strides",
    "ints",
    "scalar",
    "norm_axis",
    "dev",
    "MAX_DIMS",
]

_CT: dict = {}

#: the most axes the strided kernels index (after ``collapse``)
MAX_DIMS = 8


def dev(*tensors: ClTensor | None) -> ClDevice:
    """The device of the first tensor given (all must share it)."""
    found = None
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, ClTensor):
            raise KernelError(f"expected an OpenCL device tensor, got {type(t).__name__}")
        if found is None:
            found = t.device
        elif t.device is not found:
            raise KernelError("the inputs live on different OpenCL devices; copy them first")
    if found is None:
        raise KernelError("no input tensor")
    return found


def ctype(dtype: np.dtype, op: str) -> str:
    """The OpenCL C type computing ``dtype`` (float32 / float64 / float16)."""
    ct = _CT.get(dtype)  # numpy's dtype.name costs microseconds on every launch
    if ct is None:
        name = np.dtype(dtype).name
        if name not in CTYPES:
            raise UnsupportedDTypeError(f"{op}: the OpenCL kernels compute float types, not {name}")
        ct = _CT[dtype] = CTYPES[name]
    return ct


def launch(
    d: ClDevice,
    family: str,
    ct: str,
    name: str,
    source: Callable[[], str],
    gsize: Sequence[int],
    args: Sequence[Any],
    lsize: Sequence[int] | None = None,
) -> None:
    """Enqueue kernel ``name`` of ``family`` built for ``ct``."""
    k = d.programs.kernel(family, ct, name, source)
    d.programs.launch(k, gsize, lsize, args)


def launch1d(
    d: ClDevice,
    family: str,
    ct: str,
    name: str,
    source: Callable[[], str],
    n: int,
    args: Sequence[Any],
) -> None:
    """Enqueue a 1-D kernel over ``n`` items; its last argument must be ``n`` (bounds check)."""
    if n <= 0:
        return
    wg = d.wg
    launch(d, family, ct, name, source, [-(-n // wg) * wg], [*args, np.int32(n)], [wg])


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Row-major element strides of ``shape``."""
    out, acc = [], 1
    for s in reversed(list(shape)):
        out.append(acc)
        acc *= s
    return out[::-1]


def collapse(
    shape: Sequence[int], strides: Sequence[Sequence[int]]
) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours that every stride list walks contiguously."""
    dims: list[int] = []
    sts: list[list[int]] = [[] for _ in strides]
    for ax, size in enumerate(shape):
        if size == 1:
            continue
        if dims and all(s[-1] == st[ax] * size for s, st in zip(sts, strides)):
            dims[-1] *= size
            for s, st in zip(sts, strides):
                s[-1] = st[ax]
            continue
        dims.append(size)
        for s, st in zip(sts, strides):
            s.append(st[ax])
    if not dims:
        dims = [1]
        sts = [[0] for _ in strides]
    if len(dims) > MAX_DIMS:
        raise KernelError(f"a layout of {len(dims)} non-mergeable axes (at most {MAX_DIMS})")
    return dims, sts


def ints(t: ClTensor | None) -> list[int]:
    """The values of a small int tensor (shapes, axes): kept on the host at upload, else read."""
    if t is None:
        return []
    arr = t.host if t.host is not None else t.numpy()
    return [int(v) for v in np.asarray(arr).reshape(-1)]


def scalar(t: ClTensor | None) -> float | None:
    """The one value of a 1-element tensor (Clip's bounds), or None."""
    if t is None or t.size == 0:
        return None
    arr = t.host if t.host is not None else t.numpy()
    return float(np.asarray(arr).reshape(-1)[0])


def norm_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` in ``[0, rank)``; a ``KernelError`` naming the op when out of range."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise KernelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return a
