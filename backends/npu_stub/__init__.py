"""The simulated NPU plugin: a graph-compiling accelerator with its own fixed-size memory.

Registered through the same hooks as any third-party backend: the ``npu`` backend
(``backend.py``), its operators ``anychip::NpuConv`` / ``anychip::NpuPool``
(``kernels/schemas.py``), and its partition passes (``passes/``). Layout of this folder (the
shape of every backend), in the order a partition meets it: ``kernels/support.py`` (what it
claims) -> ``passes/`` -> ``compiler.py`` (a ``program.py`` ``Program``: kernels from
``kernels/``, packed weights, memory plan; placed by ``NpuExecutable``) -> ``blob.py`` (the
program as bytes, for the compile cache) -> ``driver/`` (the simulated device memory and its
tensors).
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_ops(registry: Registry) -> None:
    from anychip.backends.npu_stub.kernels.schemas import npu_schemas

    for schema in npu_schemas():
        registry.add_schema(schema)


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.npu_stub.backend import NpuBackend

    registry.add_backend(NpuBackend())


@hookimpl
def anychip_register_passes(registry: Registry) -> None:
    from anychip.backends.npu_stub.passes import npu_passes

    for p in npu_passes():
        registry.add_pass(p, backend="npu")
