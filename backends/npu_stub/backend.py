"""``NpuBackend``: a simulated graph-compiling NPU with its own fixed-size memory.

Top to bottom: options, device model, transfers (real byte copies into the device array),
capability (``support.check_node``), ``compile`` (``compiler.compile_graph``) and its inverse of
``CompiledGraph.serialize()``, ``load_compiled`` (``compiler.load_graph``). Options come
from ``anychip.load(..., device_options={"npu": {"memory": 64 << 20, "precision": "fp16"}})``
(``Backend.configure`` -> ``_configure``) or ``ANYCHIP_NPU_MEMORY``; ``buckets`` (e.g.
``{"S": "pow2"}`` or ``{"S": [32, 64, 128]}``) pads symbolic dimension ``S`` up to a bucket
where ``core/compile/bucketing.py`` proves the partition safe to pad. A configured copy gets its
own device memory of the configured size.

Threads: the device memory is created on first use under a lock (double-checked), so sessions
loaded at once from several threads share one ``NpuMemory``; without it each thread could make
its own and a session's inputs would land in another memory than its executable reads.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.npu_stub.driver import NpuMemory, NpuTensor, memory_from_env, parse_size
from anychip.backends.npu_stub.kernels.support import check_node
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.errors import AnychipError, DeviceError
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.core.memory import MemoryStats
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["NpuBackend", "PRECISIONS"]

PRECISIONS = ("fp32", "fp16")


class NpuBackend(Backend):
    """The NPU: claims static-shape float32 subgraphs of its op set and compiles them whole."""

    name = "npu"
    kind = "npu"
    priority = 20
    simulated = True
    about = "a simulation on the host CPU (no NPU hardware): a graph compiler with 256 MiB"
    graph_mode = True
    #: Compiles for concrete shapes only: the runtime specializes partitions per input
    #: signature and caches the executables (``core/compile/specialize.py``).
    shape_policy = "static"
    #: The compiler's revision and the format of its compiled bytes (``blob.py``): in the
    #: compile cache's key, so artifacts of another revision are never looked up.
    version = "npu-program-1"

    def __init__(self, memory: int | None = None, precision: str = "fp32") -> None:
        super().__init__()
        self._capacity = memory
        self.precision = precision
        self._memory: NpuMemory | None = None
        #: Bucketed dimensions (``core/compile/bucketing.py``): symbol -> "pow2" or sizes, or None.
        self.buckets: dict[str, Any] | None = None
        self._lock = threading.RLock()  # guards the lazy _capacity and _memory

    # -- options -------------------------------------------------------------------------------
    def _configure(self, **options: Any) -> None:
        unknown = sorted(set(options) - {"memory", "precision", "buckets"})
        if unknown:
            raise DeviceError(
                f"npu: unknown device option(s) {unknown}; known: memory (bytes, e.g. 64 << 20 "
                "or '64M'), precision ('fp32' or 'fp16'), buckets ({'S': 'pow2'} or "
                "{'S': [32, 64, 128]})"
            )
        if "buckets" in options:
            from anychip.core.plugin.shapes import parse_buckets

            try:
                self.buckets = parse_buckets(options["buckets"], "npu option buckets")
            except AnychipError as e:
                raise DeviceError(str(e)) from None
        if "memory" in options:
            self._capacity = parse_size(options["memory"], "npu option memory")
        if "precision" in options:
            precision = str(options["precision"]).lower()
            if precision not in PRECISIONS:
                raise DeviceError(
                    f"npu: precision must be one of {list(PRECISIONS)}, "
                    f"got {options['precision']!r}"
                )
            self.precision = precision
        self._lock = threading.RLock()  # not shared with the backend it was copied from
        self._memory = None  # a configured copy owns its own device memory

    @property
    def capacity(self) -> int:
        capacity = self._capacity
        if capacity is None:
            with self._lock:
                if self._capacity is None:
                    self._capacity = memory_from_env()
                capacity = self._capacity
        return capacity

    @property
    def memory(self) -> NpuMemory:
        """The device memory (created on first use, once, whichever thread comes first)."""
        memory = self._memory
        if memory is None:
            with self._lock:
                if self._memory is None:
                    self._memory = NpuMemory(self.capacity, self.name, self.pool_factory)
                memory = self._memory
        return memory

    def memory_stats(self) -> MemoryStats:
        return self.memory.pool.stats()

    # -- description ---------------------------------------------------------------------------
    def device_model(self) -> DeviceModel:
        return DeviceModel(
            "npu",
            "npu",
            memory_capacity=self.capacity,
            # float compute; int64/int32/bool on the index datapath (``kernels/op_index.py``)
            dtypes=frozenset({DType.FLOAT, DType.FLOAT16, DType.INT64, DType.INT32, DType.BOOL}),
            flops=2e11,
            mem_bandwidth=5e10,
            host_link=8e9,
            launch_overhead=2e-5,
        )

    # -- transfers: bytes really move between host arrays and the device array ----------------
    def _copy_in(self, array: np.ndarray) -> NpuTensor:
        tensor = self.memory.alloc_tensor(array.shape, array.dtype)
        self.memory.tensor_view(tensor)[...] = array
        return tensor

    def _copy_out(self, tensor: NpuTensor) -> np.ndarray:
        return self.memory.tensor_view(tensor).copy()

    def release(self, tensor: Any) -> None:
        if isinstance(tensor, NpuTensor) and tensor.live:
            self.memory.free(tensor)

    def view(self, tensor: NpuTensor) -> np.ndarray:
        """The device bytes of ``tensor`` as a writable array: a debugging and test hook
        (writing through it changes device memory, as a DMA from elsewhere would)."""
        return self.memory.tensor_view(tensor)

    @property
    def cache_tag(self) -> str:
        """What besides the graph changes the compiled code: the precision."""
        return f"precision={self.precision}"

    # -- capability and compilation ------------------------------------------------------------
    def check_node(self, node: Node) -> str | None:
        return check_node(node)

    def claims(self) -> list[Any]:
        """The NPU's op set as data (``anychip devices --ops npu``, the conformance kit):
        every op of ``NPU_OPS``, any opset, float32; the per-node rules stay in
        ``check_node`` (a claimed op refused there shows as a fallback in the kit)."""
        from anychip.backends.npu_stub.kernels.support import NPU_OPS
        from anychip.core.plugin.claims import OpClaim

        return [OpClaim("", op, 1, None, frozenset({DType.FLOAT})) for op in sorted(NPU_OPS)]

    def compile(self, graph: Graph) -> CompiledGraph:
        """Compile one partition (after the NPU passes ran on it) into an executable.

        Raises:
            OutOfMemoryError: weights plus planned activations do not fit in free NPU memory.
            UnsupportedOpError: a node the NPU cannot run (the placement should not give it one).
        """
        from anychip.backends.npu_stub.compiler import compile_graph

        return compile_graph(self.memory, graph, precision=self.precision)

    def load_compiled(self, data: bytes) -> CompiledGraph:
        """The executable ``CompiledGraph.serialize()`` wrote, placed in this NPU's memory
        without compiling (``compiler.load_graph``; the format is ``blob.py``'s).

        Raises:
            DeviceError: ``data`` is not a valid NPU program of this precision.
            OutOfMemoryError: it does not fit in free NPU memory.
        """
        from anychip.backends.npu_stub.compiler import load_graph

        return load_graph(self.memory, data, precision=self.precision)
