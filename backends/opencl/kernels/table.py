"""The OpenCL kernel table: every kernel module registers into it where it is defined."""

from __future__ import annotations

from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

__all__ = ["KERNELS", "kernel", "F"]

KERNELS = KernelTable("opencl")
kernel = KERNELS.register
#: float types the arithmetic kernels compute (narrowed to what the device reports)
F = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16})
