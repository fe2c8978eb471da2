"""The IREE plugin: real GPU APIs (Vulkan; CUDA, HIP and Metal where present) and IREE's CPU
target as anychip devices (graph mode).

Devices ``vulkan`` / ``vulkan:<i>``, ``iree-cpu``, ``iree-cuda``, ``iree-hip``,
``iree-metal``; they join a session only when named (``devices=["vulkan", "cpu"]``). Without
IREE (``pip install 'anychip[iree]'``) or without the driver, they are listed unavailable with
the reason.

Layout, in the order a partition meets it: ``claims.py`` (the ops offered), ``probe.py``
(each node signature measured on the device against the CPU, cached on disk),
``backend.py`` (devices, options, compile), ``compiler.py`` (partition -> ONNX -> IREE's
importer -> vmfb -> module), ``check.py`` (each compiled partition checked against the CPU),
``runtime.py`` (the shared instance and devices, aligned host copies).
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.iree.backend import backends

    for b in backends():
        registry.add_backend(b)
