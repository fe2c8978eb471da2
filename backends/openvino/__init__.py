"""The OpenVINO plugin: OpenVINO's CPU, GPU and NPU as anychip devices (graph mode).

Devices ``openvino:cpu``, ``openvino:gpu`` (and ``openvino:gpu.<i>`` where OpenVINO numbers
several GPUs), ``openvino:npu``; names are case-insensitive (``openvino:CPU`` works). They join
a session only when named: ``anychip.load(m, devices=["openvino:CPU", "cpu"])``. Without
OpenVINO (``pip install 'anychip[openvino]'``) or without the device, they are listed
unavailable with the reason.

Layout, in the order a partition meets it: ``claims.py`` and ``int64.py`` (what is claimed,
as data), ``capability.py`` (OpenVINO's own answer per node, ``Core.query_model``),
``backend.py`` (options, device model, compile), ``compiler.py`` (partition -> ONNX ->
compiled model, infer requests per thread, compiled bytes), ``driver.py`` (the ``ov.Core``).
"""

from __future__ import annotations

from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip.backends.openvino.backend import backends

    for b in backends():
        registry.add_backend(b)
