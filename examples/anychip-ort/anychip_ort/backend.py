"""``OrtBackend``: each claimed partition becomes one onnxruntime session on the CPU provider.

Top to bottom: availability, the device model, capability (``support.check_node``), and
``compile``: the partition graph is exported to ONNX by ``anychip.ir.onnx.export_model`` (with
the opset versions its nodes were imported at), loaded by onnxruntime, and wrapped in a
``CompiledGraph`` whose ``run`` feeds numpy arrays by input name. The device is host memory
(``host_memory = True``): tensors are numpy arrays, so the runtime makes no copies for it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.errors import DeviceError
from anychip.ir.graph import Model
from anychip.ir.onnx import export_model
from anychip_ort.support import PROVIDER, check_node

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["OrtBackend"]


class OrtBackend(Backend):
    """Graph mode: onnxruntime compiles and runs whole partitions."""

    name = "ort"
    kind = "ort"
    priority = 5
    graph_mode = True
    host_memory = True

    def __init__(self, threads: int = 0) -> None:
        super().__init__()
        self.threads = threads  # onnxruntime's intra-op threads; 0 lets it choose

    def _configure(self, **options: Any) -> None:
        unknown = sorted(set(options) - {"threads"})
        if unknown:
            raise DeviceError(f"ort: unknown device option(s) {unknown}; known: threads")
        self.threads = int(options["threads"])

    def _available(self) -> tuple[bool, str]:
        try:
            import onnxruntime
        except ImportError as e:
            return False, f"onnxruntime is not installed ({e}); pip install onnxruntime"
        if PROVIDER not in onnxruntime.get_available_providers():
            return False, f"onnxruntime {onnxruntime.__version__} has no {PROVIDER}"
        return True, ""

    def device_model(self) -> DeviceModel:
        # Host memory (host_link None: no copies). onnxruntime's CPU kernels (MLAS) outrun
        # anychip's numpy ones on convolutions and matrix products, and one call runs a whole
        # partition, so the per-node overhead is small.
        return DeviceModel("ort", "ort", flops=2e11, mem_bandwidth=2e10, launch_overhead=1e-6)

    def check_node(self, node: Node) -> str | None:
        return check_node(node)

    def compile(self, graph: Graph) -> CompiledGraph:
        """Export ``graph`` and load it into onnxruntime.

        Raises:
            DeviceError: onnxruntime refused the exported partition (the message has its
                reason); the placement should not have given it such a node.
        """
        import onnxruntime

        opsets: dict[str, int] = {}
        for node in graph.nodes:
            opsets[node.domain] = max(opsets.get(node.domain, 1), int(node.version or 1))
        proto = export_model(Model(graph, opsets or {"": 21}))
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self.threads
        try:
            session = onnxruntime.InferenceSession(
                proto.SerializeToString(), options, providers=[PROVIDER]
            )
        except Exception as e:
            raise DeviceError(
                f"ort: onnxruntime cannot load partition {graph.name!r} "
                f"({len(graph.nodes)} nodes): {type(e).__name__}: {e}"
            ) from e
        inputs = [v.name for v in graph.inputs]
        outputs = [v.name for v in graph.outputs]

        def run(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
            return session.run(outputs, dict(zip(inputs, arrays)))

        info = {"onnxruntime": onnxruntime.__version__, "nodes": len(graph.nodes)}
        return CompiledGraph(run, info=info)
