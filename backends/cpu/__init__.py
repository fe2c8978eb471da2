"""The CPU backend plugin: registered through the same hooks as any third-party backend."""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.cpu.backend import CpuBackend

    registry.add_backend(CpuBackend())


@hookimpl
def anychip_register_ops(registry: Registry) -> None:
    # onnxruntime's contrib ops: the CPU backend has their kernels (kernels/op_contrib_*.py).
    from anychip.opsets.anychip_ops import anychip_schemas
    from anychip.opsets.com_microsoft import com_microsoft_schemas

    for schema in com_microsoft_schemas() + anychip_schemas():
        registry.add_schema(schema)


@hookimpl
def anychip_register_passes(registry: Registry) -> None:
    # Fusions (backends/cpu/passes), run on each CPU partition after placement.
    from anychip.backends.cpu.passes import cpu_passes

    for p in cpu_passes():
        registry.add_pass(p, backend="cpu")


@hookimpl
def anychip_register_kernels(registry: Registry) -> None:
    from anychip.backends.cpu.kernel_index import install
    from anychip.backends.cpu.table import CPU_KERNELS

    install(CPU_KERNELS)  # each op_*.py imported at its first lookup (kernel_index.py)
    registry.add_kernels(CPU_KERNELS)
    # oneDNN's Conv, pooling, LSTM and GRU (backends/cpu/onednn) after the numpy kernels, so
    # they win; each falls back to the numpy kernel per node. Loading waits for the first call.
    from anychip.backends.cpu import onednn

    if onednn.findable():
        from anychip.backends.cpu.onednn.kernels import ONEDNN_KERNELS

        registry.add_kernels(ONEDNN_KERNELS)
