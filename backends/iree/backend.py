"""``IREEBackend``: one IREE target on one HAL device, compiling anychip's partitions.

Devices (``backends()``): ``vulkan`` (the first Vulkan physical device IREE enumerates) and
``vulkan:<i>`` for each; ``iree-cpu`` (``llvm-cpu`` for the host's own CPU, on IREE's
``local-task`` executor); ``iree-cuda``, ``iree-hip``, ``iree-metal``, unavailable with the
reason where their driver or device is missing. All are used only when named
(``auto_select = False``): ``anychip.load(m, devices=["vulkan", "cpu"])``.

Options (``device_options={"vulkan": {...}}``): ``flags``, more ``iree-compile`` flags (a
list of str; ``iree-hip`` needs ``--iree-hip-target=gfx...``), part of every cache key.

Tensors are IREE ``DeviceArray``s: they stay on the device between partitions of the same
device; copies in and out go through ``runtime.py`` (4096-aligned host buffers) and are
counted by the runtime like every device's.
"""

from __future__ import annotations

import platform
import threading
import time
from typing import TYPE_CHECKING, Any

from anychip.backends.iree import runtime
from anychip.backends.iree.claims import CPU_DTYPES, GPU_DTYPES, OPS
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.core.plugin.claims import Constraint, OpClaim
from anychip.errors import DeviceError
from anychip.ir.node import AttrType

if TYPE_CHECKING:
    import numpy as np

    from anychip.backends.iree.probe import Prober
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["IREEBackend", "backends"]

#: The compiled bytes' format and the probes' rules; with IREE's version, the caches' key.
REVISION = "anychip-iree-10"
_NESTED = (AttrType.GRAPH, AttrType.GRAPHS)
#: The name of ``core/compile/specialize.py``'s background compile threads.
_COMPILE_THREAD = "anychip-compile"
#: name -> (IREE target backend, HAL driver, priority, flops, bandwidth, launch overhead).
#: The launch overhead is a call of a partition from Python (IREE's FunctionInvoker, the
#: arrays in and out): about 1 ms here (bench/iree_compare.py); the cost model's calibration
#: replaces these figures once it has measured the device.
_TARGETS = {
    "iree-cpu": ("llvm-cpu", "local-task", 12, 5e10, 1.2e10, 1e-3),
    "vulkan": ("vulkan-spirv", "vulkan", 20, 2e11, 3e10, 2e-3),
    "iree-cuda": ("cuda", "cuda", 40, 1e13, 5e11, 2e-5),
    "iree-hip": ("rocm", "hip", 40, 1e13, 5e11, 2e-5),
    "iree-metal": ("metal-spirv", "metal", 30, 2e12, 1e11, 5e-5),
}
_MISSING = {
    "vulkan": "a Vulkan driver (a GPU's, or Mesa's lavapipe: apt-get install "
    "mesa-vulkan-drivers libvulkan1)",
    "cuda": "an NVIDIA GPU and its driver",
    "hip": "an AMD GPU and ROCm",
    "metal": "macOS on Apple silicon (IREE's macOS wheels)",
}


class IREEBackend(Backend):
    """One IREE target on one device; graph mode, tensors on the device, used when named."""

    graph_mode = True
    auto_select = False
    shape_policy = "symbolic"  # IREE compiles dynamic dimensions: one executable per partition
    #: A partition's first compile takes seconds (a minute for ResNet-50): with
    #: ``background_compile`` (the default) the CPU serves it meanwhile; ``strict``: at load.
    compiles_in_background = True

    def __init__(self, name: str, index: int | None = None) -> None:
        super().__init__()
        family = name.split(":", 1)[0]
        self.name = name
        self.kind = family
        self.family = family
        self.index = index
        target, driver, priority, *figures = _TARGETS[family]
        self.target, self.driver, self.priority = str(target), str(driver), int(priority)
        self.figures = figures
        self.extra_flags: list[str] = []
        self._prober: Prober | None = None
        self._lock = threading.Lock()

    # -- options ---------------------------------------------------------------------------------
    def _configure(self, **options: Any) -> None:
        unknown = sorted(set(options) - {"flags"})
        if unknown:
            raise DeviceError(
                f"{self.name}: unknown device option(s) {unknown}; known: flags (a list of "
                "iree-compile flags, e.g. ['--iree-hip-target=gfx1100'])"
            )
        flags = options.get("flags", [])
        if not isinstance(flags, (list, tuple)) or not all(isinstance(f, str) for f in flags):
            raise DeviceError(f"{self.name}: flags must be a list of str, got {flags!r}")
        self.extra_flags = list(flags)
        self._prober = None
        self._lock = threading.Lock()

    def flags(self) -> list[str]:
        """The compiler flags of this device: the host's CPU for llvm-cpu, then the options'."""
        base = ["--iree-llvmcpu-target-cpu=host"] if self.target == "llvm-cpu" else []
        return base + self.extra_flags

    @property
    def tag(self) -> str:
        """``IREE 3.13 vulkan-spirv``: how reasons name this compiler and target."""
        version = runtime.compiler_version().split("rc")[0] if not runtime.import_error() else "?"
        return f"IREE {'.'.join(version.split('.')[:2])} {self.target}"

    def identity(self) -> str:
        """What compiled code and measured answers depend on: IREE, target, flags, device."""
        return ";".join(
            [
                REVISION,
                runtime.compiler_version(),
                self.target,
                " ".join(self.flags()),
                self.driver,
                self.hardware(),
            ]
        )

    def hardware(self) -> str:
        """The device's own name (the Vulkan device's, the host CPU's model)."""
        if self.family == "vulkan":
            found = runtime.vulkan_devices()
            i = self.index or 0
            return str(found[i].get("name", "")) if i < len(found) else ""
        if self.family == "iree-cpu":
            return _cpu_model()
        return ""

    @property
    def version(self) -> str:  # type: ignore[override]
        if runtime.import_error() is not None:
            return REVISION
        return f"{REVISION}+iree-{runtime.compiler_version()}"

    @property
    def cache_tag(self) -> str:
        if runtime.import_error() is not None:
            return ""
        return f"target={self.target};flags={' '.join(self.flags())};device={self.hardware()}"

    # -- availability ----------------------------------------------------------------------------
    def _available(self) -> tuple[bool, str]:
        why = runtime.import_error()
        if why is not None:
            return False, why
        if self.driver not in runtime.drivers():
            need = _MISSING.get(self.driver, "its driver")
            return False, (
                f"this IREE runtime ({runtime.runtime_version()}) has no {self.driver} driver; "
                f"{self.name} needs {need}"
            )
        found = runtime.listed(self.driver)
        if len(found) <= (self.index or 0):
            need = _MISSING.get(self.driver, "a device")
            return False, f"IREE's {self.driver} driver finds no device here; it needs {need}"
        return True, ""

    @property
    def about(self) -> str:  # type: ignore[override]
        if runtime.import_error() is not None:
            return ""
        text = f"IREE {runtime.compiler_version()} {self.target}"
        if self.available()[0] and self.hardware():
            text += f", {self.hardware()}"
        return text

    def device_model(self) -> DeviceModel:
        flops, bandwidth, launch = self.figures
        return DeviceModel(
            self.name,
            self.kind,
            memory_capacity=None,
            dtypes=CPU_DTYPES if self.target == "llvm-cpu" else GPU_DTYPES,
            flops=flops,
            mem_bandwidth=bandwidth,
            host_link=None if self.target == "llvm-cpu" else 1e10,
            launch_overhead=launch,
        )

    # -- capability ------------------------------------------------------------------------------
    def claims(self) -> list[Any]:
        """Every op of ``claims.OPS``, each under the two declared constraints: a standalone
        ONNX partition can carry it, and its signature was measured right on this device."""
        constraints = (
            Constraint(
                "tensors of known rank and element type, no nested graphs",
                lambda node: _standalone_refusal(node) is None,
                explain=_standalone_refusal,
            ),
            Constraint(
                "compiles on this device and matches anychip's CPU on seeded random inputs "
                "(measured per node signature at bring-up)",
                lambda node: self.prober.reason(node, eligible=self._askable) is None,
                explain=lambda node: self.prober.reason(node, eligible=self._askable),
            ),
        )
        dtypes = self.device_model().dtypes
        return [OpClaim("", op, 1, None, dtypes, 0, constraints) for op in sorted(OPS)]

    def check_node(self, node: Node) -> str | None:
        """Refuses what ``claims.OPS`` does not list (the claims' constraints have run)."""
        if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
            return (
                f"{node.qualified_op} is not "
                "among the ops offered to IREE (backends/iree/claims.py)"
            )
        return None

    def _askable(self, node: Node) -> bool:
        if node.domain not in ("", "ai.onnx") or node.op_type not in OPS:
            return False
        if _standalone_refusal(node) is not None:
            return False
        return self.supports_dtypes(node)

    def supports_dtypes(self, node: Node) -> bool:
        dtypes = self.device.dtypes
        return all(
            v is None or v.const is not None or v.dtype in dtypes
            for v in [*node.inputs, *node.outputs]
        )

    def bring_up(self, graphs: list[Graph]) -> dict[str, int]:
        """Measure every claimed node of ``graphs`` now (``anychip calibrate --device X``
        passes the ONNX node cases of the claimed ops): the answers go to the probes' file,
        so later loads ask nothing. Returns the counts of nodes accepted and refused."""
        counts = {"accepted": 0, "refused": 0}
        for graph in graphs:
            for node in graph.nodes:
                if not self._askable(node):
                    continue
                ok = self.prober.reason(node, eligible=self._askable) is None
                counts["accepted" if ok else "refused"] += 1
        return counts

    @property
    def prober(self) -> Prober:
        if self._prober is None:
            with self._lock:
                if self._prober is None:
                    from anychip.backends.iree.probe import Prober

                    self._prober = Prober(self)
        return self._prober

    def cpu_table(self) -> Any:
        """The CPU backend's kernels: the reference the probes and checks compare with."""
        from anychip.core.plugin.host import get_registry

        registry = self.registry if self.registry is not None else get_registry()
        return registry.kernel_table("cpu")

    def schemas(self) -> Any:
        return getattr(self.registry, "schemas", None)

    # -- tensors ---------------------------------------------------------------------------------
    def _copy_in(self, array: np.ndarray) -> Any:
        key = (self.driver, self.index)
        return runtime.to_device(runtime.device(*key), array, key)

    def _copy_out(self, tensor: Any) -> np.ndarray:
        return runtime.to_host(runtime.device(self.driver, self.index), tensor)

    def release(self, tensor: Any) -> None:
        """Drop the ``DeviceArray``'s buffer now (the runtime calls this after its last use;
        IREE frees a buffer with its last reference)."""
        runtime.drop(tensor)

    def memory_stats(self) -> Any:
        """The device arrays anychip holds on this device (copies in and partitions'
        outputs, shared by every backend object of the device); the modules' constants are
        IREE's and not counted."""
        from anychip.core.memory import MemoryStats

        in_use, peak = runtime.held((self.driver, self.index))
        return MemoryStats(self.name, None, in_use, in_use, peak, in_use, 0, 0, 0.0, 0)

    # -- compilation -----------------------------------------------------------------------------
    def compile(self, graph: Graph) -> CompiledGraph:
        """Compile one partition, then check it on seeded random inputs against the CPU.

        Raises:
            DeviceError: IREE refused it, or it computes differently from the CPU (the
                runtime then places its nodes elsewhere and the report says so).
        """
        from anychip.backends.iree.check import check_partition
        from anychip.backends.iree.compiler import compile_vmfb

        t0 = time.perf_counter()
        what = f"{self.tag}, partition {graph.name!r} ({len(graph.nodes)} nodes)"
        vmfb = compile_vmfb(graph, self.target, self.flags(), what)
        exe = self._executable(vmfb, [v.dtype.numpy.str for v in graph.outputs], len(graph.nodes))
        seconds = time.perf_counter() - t0
        if threading.current_thread().name == _COMPILE_THREAD:
            # A background compile: the CPU's kernels serve the session's runs meanwhile, and
            # the reference must not run beside them (two threads in oneDNN crashed ResNet-like
            # here), so the check waits for the partition's first run, in the run's thread.
            extra = {"compile_ms": round(seconds * 1e3, 1), "checked": "at its first run"}
            return self._as_compiled(exe, extra, graph=graph, what=what, check_first=True)
        verdict = check_partition(self, graph, exe, what)
        extra = {"compile_ms": round(seconds * 1e3, 1), "checked": verdict}
        return self._as_compiled(exe, extra, graph=graph, what=what)

    def load_compiled(self, data: bytes) -> CompiledGraph:
        """The executable ``CompiledGraph.serialize()`` wrote (checked when it was compiled).

        Raises:
            DeviceError: not this format, or for another IREE, target, flags or device.
        """
        from anychip.backends.iree.compiler import from_bytes

        t0 = time.perf_counter()
        vmfb, meta = from_bytes(data, self._meta(0))
        exe = self._executable(vmfb, meta["dtypes"], int(meta.get("nodes", 0)))
        return self._as_compiled(exe, {"load_ms": round((time.perf_counter() - t0) * 1e3, 1)})

    def _meta(self, nodes: int) -> dict[str, Any]:
        meta: dict[str, Any] = {"identity": self.identity()}
        if nodes:
            meta["nodes"] = nodes
        return meta

    def _executable(self, vmfb: bytes, dtypes: list[str], nodes: int) -> Any:
        from anychip.backends.iree.compiler import Executable

        try:
            return Executable(vmfb, self.driver, self.index, dtypes, self._meta(nodes))
        except DeviceError:
            raise
        except Exception as e:
            raise DeviceError(f"{self.tag}: the device did not load the module: {e}") from e

    def _as_compiled(
        self,
        exe: Any,
        extra: dict[str, Any],
        graph: Graph | None = None,
        what: str = "",
        check_first: bool = False,
    ) -> CompiledGraph:
        info = {
            "iree": runtime.compiler_version(),
            "target": self.target,
            "shapes": "dynamic (one compile for every shape)",
            "vmfb_bytes": len(exe.vmfb),
            **extra,
        }
        run = exe.run
        if graph is not None:  # compiled here: its first run is checked against the CPU too
            from anychip.backends.iree.check import check_first_run, check_partition

            pending = [True]

            def run(inputs: Any) -> list[Any]:
                if pending[0] and check_first:  # compiled in the background: checked here
                    info["checked"] = check_partition(self, graph, exe, what)
                outputs = exe.run(inputs)
                if pending[0]:
                    pending[0] = False
                    check_first_run(self, graph, list(inputs), outputs, what)
                    if check_first:
                        compiled.checked()  # now the disk cache may keep it
                return outputs

        # Compiled in the background: its bytes are given only once its first run was checked
        # (``CompiledGraph.checked_later``); a later process never loads it unchecked. The
        # compile at load stores what it has checked.
        compiled = CompiledGraph(run, info=info, serialize=exe.to_bytes, checked_later=check_first)
        compiled.executable = exe  # type: ignore[attr-defined]
        return compiled

    def release_compiled(self, compiled: CompiledGraph) -> None:
        exe = getattr(compiled, "executable", None)
        if exe is not None:
            exe.close()


def _standalone_refusal(node: Node) -> str | None:
    """Why ``node`` cannot go to IREE in an exported partition, or None."""
    if any(a.type in _NESTED for a in node.attributes.values()):
        return f"{node.op_type} has nested graphs (left to devices that run them in place)"
    for v in node.inputs:
        if v is not None and not (v.is_tensor and v.dtype and v.shape is not None):
            return f"input {v.name!r} is not a tensor of known rank and element type"
    for v in node.outputs:
        if v is not None and not (v.is_tensor and v.dtype):
            return f"output {v.name!r} is not a tensor of known element type"
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def backends() -> list[IREEBackend]:
    """``vulkan``, ``vulkan:<i>`` per Vulkan device, ``iree-cpu``, ``iree-cuda``,
    ``iree-hip``, ``iree-metal`` (the unavailable ones say why)."""
    out = [IREEBackend("iree-cpu"), IREEBackend("vulkan", 0)]
    if runtime.import_error() is None:
        for i in range(len(runtime.vulkan_devices())):
            out.append(IREEBackend(f"vulkan:{i}", i))
    out += [IREEBackend(n) for n in ("iree-cuda", "iree-hip", "iree-metal")]
    return out
