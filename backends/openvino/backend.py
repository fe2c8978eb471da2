"""``OpenVINOBackend``: an OpenVINO device (CPU, GPU, NPU) compiling anychip's partitions.

Top to bottom: options, availability, the device model, capability, ``compile`` and its
inverse of ``CompiledGraph.serialize()``, ``load_compiled``.

Options (``device_options={"openvino:cpu": {...}}``):

* ``precision``: ``"f32"`` (default: OpenVINO's inference precision hint pinned to f32, so
  results match the CPU backend and onnxruntime; OpenVINO's own default on a CPU with AMX or
  AVX-512-BF16 is bf16, on a GPU f16), ``"bf16"`` or ``"f16"`` (opt-in, shown per partition in
  the placement report as the precision OpenVINO compiled with). A device that cannot compute
  the precision asked for (an NPU at f32) refuses every node, saying how to opt in.
* ``threads``: OpenVINO's ``INFERENCE_NUM_THREADS`` (default: its own choice, every core).
* ``config``: more OpenVINO properties for ``compile_model``, passed as given
  (``{"PERFORMANCE_HINT": "THROUGHPUT"}``); part of the compile cache's key.

The device's tensors are host numpy arrays (``host_memory``): OpenVINO copies to a GPU or NPU
inside its infer request, so those copies are part of the partition's time in the profile.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from anychip.backends.openvino import driver
from anychip.backends.openvino.claims import (
    DOMAINS,
    DTYPES,
    F16_DTYPES,
    claims_by_op,
    op_claims,
)
from anychip.backends.openvino.constraints import read
from anychip.backends.openvino.memory import HeldWeights, capacity
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.errors import DeviceError
from anychip.ir.node import AttrType

if TYPE_CHECKING:
    from anychip.backends.openvino.capability import Prober
    from anychip.core.memory import MemoryStats
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["OpenVINOBackend", "backends"]

#: The compiled bytes' format (``compiler.py``); with OpenVINO's version, the cache's key.
REVISION = "anychip-openvino-2"
_NESTED = (AttrType.GRAPH, AttrType.GRAPHS)
#: Rough priors for the cost model, which measures each device where it runs.
_FIGURES = {
    "CPU": {"flops": 7e10, "mem_bandwidth": 1.5e10, "launch_overhead": 2e-5, "priority": 10},
    "GPU": {"flops": 1e12, "mem_bandwidth": 1e11, "launch_overhead": 1e-4, "priority": 30},
    "NPU": {"flops": 5e11, "mem_bandwidth": 5e10, "launch_overhead": 2e-4, "priority": 25},
}
_MISSING = {
    "GPU": "an Intel GPU and its compute runtime (intel-opencl-icd or Level Zero)",
    "NPU": "an Intel NPU (Core Ultra) and its driver (intel/linux-npu-driver)",
}


class OpenVINOBackend(Backend):
    """One OpenVINO device; graph mode, host memory, used only when named."""

    kind = "openvino"
    graph_mode = True
    host_memory = True
    auto_select = False

    def __init__(self, ov_device: str) -> None:
        super().__init__()
        self.ov_device = ov_device  # OpenVINO's name: CPU, GPU, GPU.1, NPU
        self.family = ov_device.split(".", 1)[0]
        self.name = f"openvino:{ov_device.lower()}"
        figures = _FIGURES.get(self.family, _FIGURES["GPU"])
        self.priority = int(figures["priority"])
        # OpenVINO's NPU compiles static shapes only: one executable per input signature.
        self.shape_policy = "static" if self.family == "NPU" else "symbolic"
        self.precision = "f32"
        self.threads: int | None = None
        self.config: dict[str, Any] = {}
        self._prober: Prober | None = None
        self._lock = threading.Lock()
        self.held = HeldWeights(self.name)

    # -- options -------------------------------------------------------------------------------
    def _configure(self, **options: Any) -> None:
        unknown = sorted(set(options) - {"precision", "threads", "config"})
        if unknown:
            raise DeviceError(
                f"{self.name}: unknown device option(s) {unknown}; known: precision ('f32' "
                "default, 'bf16', 'f16'), threads (an int), config (a dict of OpenVINO "
                "properties)"
            )
        if "precision" in options:
            self.precision = driver.parse_precision(options["precision"], self.name)
        if "threads" in options:
            threads = options["threads"]
            if not isinstance(threads, int) or isinstance(threads, bool) or threads < 0:
                raise DeviceError(f"{self.name}: threads must be an int >= 0, got {threads!r}")
            self.threads = threads or None
        if "config" in options:
            config = options["config"]
            if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
                raise DeviceError(
                    f"{self.name}: config must be a dict of OpenVINO property names to values, "
                    f"got {config!r}"
                )
            self.config = dict(config)
        self._lock = threading.Lock()  # not shared with the backend it was copied from

    @property
    def version(self) -> str:  # type: ignore[override]
        """OpenVINO's version and the format of the compiled bytes (the cache's key)."""
        if driver.import_error() is not None:
            return REVISION
        return f"{REVISION}+openvino-{driver.ov_version()}"

    @property
    def cache_tag(self) -> str:
        return f"device={self.ov_device};precision={self.precision}"

    # -- availability and description -------------------------------------------------------------
    def _available(self) -> tuple[bool, str]:
        why = driver.import_error()
        if why is not None:
            return False, why
        found = driver.device_ids()
        if self.ov_device in found or any(d.startswith(self.ov_device + ".") for d in found):
            return True, ""
        need = _MISSING.get(self.family, "the device and its OpenVINO plugin")
        return False, (
            f"OpenVINO {driver.ov_version().split('-')[0]} finds no {self.ov_device} here "
            f"(it lists {', '.join(found) or 'nothing'}); it needs {need}"
        )

    @property
    def about(self) -> str:  # type: ignore[override]
        """OpenVINO's version and the device's full name (``anychip devices``)."""
        if driver.import_error() is not None:
            return ""
        text = f"OpenVINO {driver.ov_version().split('-')[0]}"
        if self.available()[0]:
            name = driver.properties(self.ov_device).get("FULL_DEVICE_NAME")
            text += f", {name}" if name else ""
        return text

    def device_model(self) -> DeviceModel:
        f = _FIGURES.get(self.family, _FIGURES["GPU"])
        return DeviceModel(
            self.name,
            self.kind,
            memory_capacity=capacity(self.family, self.ov_device),
            # float16 tensors only where the session opted into less than f32 (claims.py)
            dtypes=DTYPES if self.precision == "f32" else F16_DTYPES,
            flops=f["flops"],
            mem_bandwidth=f["mem_bandwidth"],
            host_link=None,
            launch_overhead=f["launch_overhead"],
        )

    # -- capability ----------------------------------------------------------------------------
    def claims(self) -> list[Any]:
        """The measured claims of ``claims.py`` (the same for every OpenVINO device; float16
        only at a precision below f32)."""
        return list(op_claims(self.precision != "f32"))

    def _precision_refusal(self) -> str | None:
        caps = driver.properties(self.ov_device).get("OPTIMIZATION_CAPABILITIES")
        if driver.supports_precision(caps, self.precision):
            return None
        offered = [p for p in driver.PRECISIONS if driver.supports_precision(caps, p)]
        return (
            f"OpenVINO's {self.ov_device} does not compute {self.precision} (it offers "
            f"{', '.join(offered) or 'none of f32, bf16, f16'}); anychip never lowers precision "
            f"by default: opt in with device_options={{{self.name!r}: {{'precision': "
            f"{offered[0] if offered else 'f16'!r}}}}}"
        )

    def check_node(self, node: Node) -> str | None:
        """Refuses what a standalone ONNX partition cannot carry or OpenVINO does not claim,
        then asks OpenVINO (``capability.Prober``)."""
        why = _standalone_refusal(node)
        if why is not None:
            return why
        why = self._precision_refusal()
        if why is not None:
            return why
        if not self._claimed(node):
            version = node.meta.get("since", node.version)
            return (
                f"{node.op_type}-{version} is not among the ops claimed for OpenVINO "
                "(backends/openvino/claims.py)"
            )
        # the nodes of the graph asked about in the same batch: those that got this far
        return self.prober.reason(node, eligible=self._askable)

    def _askable(self, node: Node) -> bool:
        return _standalone_refusal(node) is None and self._claimed(node)

    def _claimed(self, node: Node) -> bool:
        claim = claims_by_op(self.precision != "f32").get(node.op_type)
        if claim is None:
            return False
        x = next((v for v in node.inputs if v is not None and v.dtype), None)
        return claim.covers(node.domain, node.op_type, int(node.version or 1), x and x.dtype)

    @property
    def prober(self) -> Prober:
        """The device's ``capability.Prober`` (one per backend object, made on first use)."""
        if self._prober is None:
            with self._lock:
                if self._prober is None:
                    from anychip.backends.openvino.capability import Prober

                    self._prober = Prober(self.ov_device)
        return self._prober

    # -- compilation ---------------------------------------------------------------------------
    def compile_config(self) -> dict[str, Any]:
        """The properties ``compile_model`` gets: precision first, then threads and ``config``;
        only those the device lists among its supported properties."""
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": driver.PRECISIONS[self.precision][0],
            "PERFORMANCE_HINT": "LATENCY",
        }
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = self.threads
        supported = driver.properties(self.ov_device).get("SUPPORTED_PROPERTIES") or {}
        if supported:
            config = {k: v for k, v in config.items() if k in supported}
        config.update(self.config)
        return config

    def compile(self, graph: Graph) -> CompiledGraph:
        """Compile one partition with OpenVINO.

        Raises:
            DeviceError: OpenVINO could not read or compile it (the runtime then gives its
                nodes to the next device, with this reason in the placement report).
        """
        from anychip.backends.openvino.compiler import as_compiled_graph, compile_partition

        t0 = time.perf_counter()
        exe = compile_partition(graph, self.ov_device, self.compile_config(), self.precision)
        self.held.hold(exe, exe.weights)
        return as_compiled_graph(exe, time.perf_counter() - t0, loaded=False)

    def load_compiled(self, data: bytes) -> CompiledGraph:
        """The executable ``CompiledGraph.serialize()`` wrote (OpenVINO's ``export_model``),
        imported with ``Core.import_model`` instead of compiling.

        Raises:
            DeviceError: the bytes are not this format, or of another OpenVINO, device or
                precision.
        """
        from anychip.backends.openvino.compiler import as_compiled_graph, from_bytes

        t0 = time.perf_counter()
        exe = from_bytes(data, self.ov_device, self.compile_config(), self.precision)
        self.held.hold(exe, exe.weights)
        return as_compiled_graph(exe, time.perf_counter() - t0, loaded=True)

    def memory_stats(self) -> MemoryStats:
        """The weights OpenVINO holds for this device's live partitions (``memory.py``)."""
        return self.held.stats(self.device.memory_capacity)


def _standalone_refusal(node: Node) -> str | None:
    """Why ``node`` cannot go to OpenVINO in an exported partition, or None."""
    if node.domain not in DOMAINS:
        return f"domain {node.domain!r} is not one OpenVINO's ONNX frontend reads"
    if any(a.type in _NESTED for a in node.attributes.values()):
        return f"{node.op_type} has nested graphs (left to devices that run them in place)"
    for v in node.inputs:
        if v is not None and not (v.is_tensor and v.dtype):
            return f"input {v.name!r} is not a tensor of known element type"
    for v in node.outputs:
        if v is not None and not (v.is_tensor and (v.dtype or not read(v))):
            return f"output {v.name!r} is not a tensor of known element type"
    return None


def backends() -> list[OpenVINOBackend]:
    """One backend per OpenVINO device: CPU, GPU and NPU always (unavailable ones say why),
    and ``GPU.<i>`` for each GPU OpenVINO numbers."""
    names = list(driver.FIXED)
    if driver.import_error() is None:
        try:
            found = driver.device_ids()
        except Exception:  # OpenVINO imports but cannot list: the fixed three say why
            found = []
        names += [d for d in found if d not in names and d.split(".", 1)[0] in ("GPU", "NPU")]
    return [OpenVINOBackend(d) for d in names]
