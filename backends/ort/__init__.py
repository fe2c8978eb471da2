"""The onnxruntime plugin: each execution provider of the installed onnxruntime is a device.

Devices ``ort:cpu``, ``ort:cuda``, ``ort:tensorrt``... (``providers.py``): the provider's
partitions are exported to ONNX and run as onnxruntime sessions with CPU fallback disabled
(``session.py``), so a partition the provider cannot take whole goes to another device with
the reason. Capability comes from onnxruntime's own kernel registry and schemas
(``capability.py``). Layout, in the order a partition meets it: ``providers.py`` (which
devices, which options) -> ``capability.py`` (what each claims) -> ``backend.py`` (the
``Backend``: memory, copies, ``compile``) -> ``session.py`` (the session and its runs).

Registered under the entry-point name ``ort`` (the device kind); imported only when a session
names an ``ort:`` device, or when every device is listed. Never part of a session that names
no devices (``auto_select = False``).
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.ort.backend import OrtBackend
    from anychip.backends.ort.providers import all_providers

    providers, why = all_providers()
    for provider in providers:
        registry.add_backend(OrtBackend(provider, why))
