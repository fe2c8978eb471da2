"""The CUDA plugin: the array-API kernel family on CuPy (``backends/arrayapi``), per device.

Devices are registered as ``cuda`` (device 0) and ``cuda:<i>``. Without CuPy, a driver or a
GPU, ``cuda`` still registers and ``anychip devices`` says why it is unavailable. CuPy is
imported on first use of a device, never when the plugin loads.
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.cuda.backend import backends

    for b in backends():
        registry.add_backend(b)


@hookimpl
def anychip_register_kernels(registry: Registry) -> None:
    from anychip.backends.cuda.backend import backends

    for b in backends():  # every name runs the one family
        registry.add_kernels(b.kernel_table())


@hookimpl
def anychip_register_passes(registry: Registry) -> None:
    # The shared element-wise fusion (ir/passes/patterns) on CUDA partitions: a chain becomes
    # one generated kernel (backends/cuda/fused.py through the array-API family's
    # FusedElementwise).
    from anychip.backends.cuda.backend import backends
    from anychip.ir.passes import patterns

    patterns.enable(registry, "elementwise", backends=[b.name for b in backends()])
