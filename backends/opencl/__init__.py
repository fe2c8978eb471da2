"""The OpenCL plugin: any vendor's OpenCL device through PyOpenCL; PoCL on every CI machine.

Devices are registered as ``opencl`` (the first GPU or accelerator, else the first device),
``opencl:<i>`` for every device the ICD loader lists, and ``opencl:gpu`` / ``opencl:cpu`` for
the first device of each type. Without pyopencl, a platform or a device, ``opencl`` still
registers and ``anychip devices`` says why it is unavailable.
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.opencl.backend import backends

    for b in backends():
        registry.add_backend(b)


@hookimpl
def anychip_register_kernels(registry: Registry) -> None:
    from anychip.backends.opencl.backend import backends
    from anychip.backends.opencl.kernels import KERNELS
    from anychip.core.plugin.kernels import KernelTable

    registry.add_kernels(KERNELS)
    for b in backends():  # every alias runs the one table
        if b.name != KERNELS.backend:
            alias = KernelTable(b.name)
            alias.merge(KERNELS)
            registry.add_kernels(alias)


@hookimpl
def anychip_register_passes(registry: Registry) -> None:
    # Two shared patterns (ir/passes/patterns): attention becomes one launch (op_attention),
    # then an element-wise chain becomes one launch (op_fused); attention first, as on the CPU.
    from anychip.backends.opencl.backend import backends
    from anychip.ir.passes import patterns

    names = [b.name for b in backends()]
    patterns.enable(registry, "attention", "elementwise", backends=names)
