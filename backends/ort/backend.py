"""``OrtBackend``: one onnxruntime execution provider as one graph-mode anychip device.

Top to bottom: options (``providers.settings_from``), availability (the provider is offered
and loads a one-node model on its own), the device model, memory and copies (host arrays, or
``OrtTensor``s in the provider's memory counted by a pool), capability
(``capability.check_node`` / ``claims``), and ``compile``: each partition becomes one
``InferenceSession`` with CPU fallback disabled (``session.py``), so a partition the provider
cannot take whole is refused and anychip places it elsewhere, with onnxruntime's reason.

Options: ``anychip.load(..., device_options={"ort:cuda": {"device_id": 0, "threads": 2}})``:
``threads``, ``optimization``, ``spinning`` are anychip's (``providers.ANYCHIP_OPTIONS``);
every other key is a provider option, handed to onnxruntime as a string.

These devices join a session only when named (``auto_select = False``): ``ort:cpu`` shares
the host's cores with anychip's ``cpu``, and each provider's device is usually another name
for hardware an anychip backend drives too.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.ort import capability
from anychip.backends.ort.providers import Provider, SessionSettings, settings_from
from anychip.backends.ort.session import (
    BoundRun,
    HostRun,
    OrtTensor,
    export_partition,
    open_session,
)
from anychip.backends.ort.values import EXOTIC, is_exotic
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.ir.dtypes import ALL_TYPES, DType

if TYPE_CHECKING:
    from anychip.core.plugin.claims import OpClaim
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["OrtBackend", "probe_model"]


class OrtBackend(Backend):
    """Graph mode: onnxruntime's provider ``provider`` compiles and runs whole partitions.

    Args:
        provider: the execution provider this device stands for.
        unavailable: why it cannot be used here, when known before asking onnxruntime
            (onnxruntime missing, or the build lacks the provider).
    """

    kind = "ort"
    graph_mode = True
    #: Joins a session only when named (see the module docstring).
    auto_select = False
    #: Dynamic dimensions stay symbolic: onnxruntime runs any input shape.
    shape_policy = "symbolic"

    def __init__(self, provider: Provider, unavailable: str = "") -> None:
        super().__init__()
        self.provider = provider
        self.name = provider.device
        self.priority = 5 if provider.memory is None else 15
        self.host_memory = provider.memory is None
        self.settings = SessionSettings()
        self._unavailable = unavailable

    @property
    def version(self) -> str:
        """onnxruntime's version: another one optimizes and runs partitions differently."""
        return f"onnxruntime-{_ort_version()}"

    @property
    def about(self) -> str:
        """What ``anychip devices`` says of it: the runtime, its version and the provider."""
        return f"onnxruntime {_ort_version()} {self.provider.ep} ({self.provider.about})"

    # -- options -------------------------------------------------------------------------------
    def _configure(self, **options: Any) -> None:
        self.settings = settings_from(self.name, self.provider.ep, options)

    # -- availability and description ----------------------------------------------------------
    def _available(self) -> tuple[bool, str]:
        if self._unavailable:
            return False, self._unavailable
        import onnxruntime

        offered = onnxruntime.get_available_providers()
        if self.provider.ep not in offered:
            return False, (
                f"{_package()} has no {self.provider.ep} (it offers {', '.join(offered)}); "
                f"{_hint(self.provider.key)}"
            )
        if self.provider.ep != "CPUExecutionProvider":
            # offered means built in: the provider's own runtime (CUDA, QNN...) may still be
            # missing, which only loading a model tells
            open_session(probe_model(), self.provider, self.settings, "a one-node Relu model")
        return True, ""

    def device_model(self) -> DeviceModel:
        # Priors only (the cost model measures): a provider with its own memory is behind a
        # bus; onnxruntime's CPU kernels (MLAS) are about as fast as anychip's oneDNN ones.
        if self.host_memory:
            return DeviceModel(
                self.name, self.kind, flops=2e11, mem_bandwidth=2e10, launch_overhead=5e-6
            )
        # copies into the provider's memory go through numpy: its own types only
        return DeviceModel(
            self.name,
            self.kind,
            dtypes=ALL_TYPES - set(EXOTIC) - {DType.STRING},
            flops=5e12,
            mem_bandwidth=3e11,
            host_link=1.2e10,
            launch_overhead=2e-5,
        )

    # -- memory and copies (providers with memory of their own) --------------------------------
    def _alloc(self, nbytes: int) -> int:
        return nbytes  # onnxruntime allocates; the pool counts what anychip holds

    def _free(self, buffer: Any) -> None:
        pass

    def adopt_value(self, value: Any) -> OrtTensor:
        """An ``OrtValue`` in this device's memory as an ``OrtTensor`` counted by the pool."""
        tensor = OrtTensor(value, None)
        tensor.block = self.allocate(tensor.nbytes)
        return tensor

    def _copy_in(self, array: np.ndarray) -> OrtTensor:
        import onnxruntime

        memory, device_id = self.provider.memory or "cpu", self.settings.device_id
        block = self.allocate(array.nbytes)
        try:
            value = onnxruntime.OrtValue.ortvalue_from_shape_and_type(
                list(array.shape), array.dtype, memory, device_id
            )
            if array.size:
                value.update_inplace(np.require(array, None, "C"))
        except BaseException:
            self.deallocate(block)
            raise
        tensor = OrtTensor(value, block)
        return tensor

    def _copy_out(self, tensor: OrtTensor) -> np.ndarray:
        return np.array(tensor.value.numpy(), copy=True)

    def release(self, tensor: Any) -> None:
        if isinstance(tensor, OrtTensor) and tensor.block is not None and tensor.block.live:
            self.deallocate(tensor.block)
            tensor.value = None

    # -- capability ----------------------------------------------------------------------------
    def check_node(self, node: Node) -> str | None:
        return capability.check_node(self.provider.ep, node)

    def claims(self) -> list[OpClaim]:
        """The provider's ops as data (``capability.claims``; ``anychip devices --ops``)."""
        if not self.available()[0]:
            return []
        return capability.claims(self.provider.ep)

    # -- compile -------------------------------------------------------------------------------
    def compile(self, graph: Graph) -> CompiledGraph:
        """One ``InferenceSession`` for the partition, on the provider alone.

        Raises:
            PartitionRefused: the provider does not take the partition whole (onnxruntime's
                reason in the message); anychip places its nodes on the next device.
        """
        what = f"partition {graph.name!r} ({len(graph.nodes)} nodes)"
        session = open_session(export_partition(graph), self.provider, self.settings, what)
        inputs = [v.name for v in graph.inputs]
        outputs = [v.name for v in graph.outputs]
        run: Any
        if self.host_memory:
            values = list(graph.inputs) + list(graph.outputs)
            exotic = any(is_exotic(v.dtype) for v in values)
            run = HostRun(session, inputs, outputs, exotic)
        else:
            memory = self.provider.memory or "cpu"
            run = BoundRun(
                session, inputs, outputs, memory, self.settings.device_id, self.adopt_value
            )
        info = {
            "onnxruntime": _ort_version(),
            "provider": self.provider.ep,
            "nodes": len(graph.nodes),
        }
        return CompiledGraph(run, info=info)


def probe_model() -> bytes:
    """A one-node float Relu model: what availability loads on a provider."""
    return _probe()


@functools.cache
def _probe() -> bytes:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model.SerializeToString()


@functools.cache
def _ort_version() -> str:
    try:
        import onnxruntime
    except ImportError:
        return "(not installed)"
    return str(onnxruntime.__version__)


#: The package that brings a provider (``pip install`` it instead of onnxruntime).
_PACKAGES = {
    "cuda": "onnxruntime-gpu",
    "tensorrt": "onnxruntime-gpu (with TensorRT)",
    "dml": "onnxruntime-directml (Windows)",
    "qnn": "onnxruntime-qnn",
    "openvino": "onnxruntime-openvino",
    "coreml": "onnxruntime (macOS wheels)",
    "migraphx": "onnxruntime-migraphx (ROCm builds)",
    "cann": "onnxruntime-cann",
}


def _hint(key: str) -> str:
    package = _PACKAGES.get(key)
    return f"install {package} instead" if package else "another onnxruntime build may have it"


def _package() -> str:
    """The onnxruntime distribution installed (onnxruntime, onnxruntime-gpu...)."""
    import importlib.metadata

    dists = [p.split()[0] for p in _PACKAGES.values()] + ["onnxruntime"]
    for dist in dict.fromkeys(dists):
        try:
            return f"{dist} {importlib.metadata.version(dist)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    return "onnxruntime"
