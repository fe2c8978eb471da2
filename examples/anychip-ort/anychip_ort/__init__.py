"""anychip-ort: a graph-mode anychip backend that hands each partition it claims to onnxruntime.

The ``ort`` device claims every node onnxruntime's CPU execution provider has a kernel for
(``support.py``), and compiles each partition by exporting it to ONNX with anychip's exporter
and building an ``onnxruntime.InferenceSession`` for it (``backend.py``). Its device memory is
host memory: tensors stay numpy arrays and no copies are made between it and the CPU.
"""

from __future__ import annotations

from anychip import hookimpl
from anychip.core.plugin.registry import Registry

__all__ = ["ANYCHIP_API_VERSION"]

ANYCHIP_API_VERSION = 1


@hookimpl
def anychip_register_backends(registry: Registry) -> None:
    from anychip_ort.backend import OrtBackend

    registry.add_backend(OrtBackend())
