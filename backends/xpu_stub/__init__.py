"""The XPU stub plugin: a simulated kernel-launch accelerator whose driver is C bound with cffi.

It claims float32 (and some int64) elementwise ops, MatMul/Gemm, Softmax, reductions and data
movement; everything else falls back to the CPU, and the placement report says why.
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.xpu_stub.backend import XpuBackend

    registry.add_backend(XpuBackend())


@hookimpl
def anychip_register_passes(registry: Registry) -> None:
    # Scaled dot-product attention becomes anychip::FusedAttention on XPU partitions (the
    # shared pattern of ir/passes/patterns; an optimization): the XPU's kernel keeps each
    # block's scores in cache (driver/kernels_attention.c).
    from anychip.ir.passes import patterns

    patterns.enable(registry, "attention", backends="xpu")


@hookimpl
def anychip_register_kernels(registry: Registry) -> None:
    from anychip.backends.xpu_stub.kernels import XPU_KERNELS

    registry.add_kernels(XPU_KERNELS)
