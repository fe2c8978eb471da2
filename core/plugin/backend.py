"""The backend contract: what a chip vendor writes.

A backend subclasses ``Backend`` and fills in, top to bottom:

* ``name`` (device name: ``cpu``, ``npu``, ``xpu``, ``cuda:0``), ``kind``, ``priority``
  (higher is preferred when devices are chosen automatically; cpu is lowest);
* ``device_model()``: memory capacity, dtypes it computes, throughput figures for the cost model;
* ``_available()``: ``(True, "")`` or ``(False, "why")`` (driver missing, no GPU, ...);
* transfers ``_copy_in(array) -> device tensor`` and ``_copy_out(tensor) -> np.ndarray``
  (and optionally ``_copy_device(tensor, src_backend)``);
* either kernels (registered through ``anychip_register_kernels``; ``graph_mode = False``), or
  ``compile(graph) -> CompiledGraph`` for whole-subgraph backends (``graph_mode = True``),
  and, to have compiled partitions kept on disk, ``CompiledGraph.serialize() -> bytes`` with
  its inverse ``load_compiled(data) -> CompiledGraph`` (see "Compiled bytes" below);
* optionally ``check_node(node) -> str | None`` for constraints a kernel table cannot express
  (static shapes only, attribute values, memory), returning the reason it cannot run the node.

The base class validates and wraps errors, so the underscore methods stay small.

Compiled bytes (graph mode): ``compile`` returns a ``CompiledGraph``; built with
``serialize=``, its ``serialize()`` gives the executable as bytes, and the backend's
``load_compiled(data)`` turns those bytes back into an executable that computes the same
numbers, without compiling. ``core/compile/cache.py`` stores the bytes on disk, keyed by the
partition (its ONNX with opset imports, weights included), the input signature, the backend's
``name``, ``version``, ``cache_tag`` and ``options``, and anychip's version; a second process
loads instead of compiling. A backend that does not override ``load_compiled`` is never looked
up on disk, and one whose ``serialize()`` returns None (or raises) is simply not stored.
``load_compiled`` must refuse bytes it did not write (another format, another version, a
corrupt file) by raising; the cache then logs, deletes the file and compiles again. The bytes
are read from a cache folder, so the format is data (a header, JSON, raw arrays), never a
pickle.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from anychip.core.plugin.kernels import KernelTable, find_kernel
from anychip.errors import AnychipError, DeviceError
from anychip.ir.dtypes import ALL_TYPES, DType

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["Backend", "DeviceModel", "CompiledGraph"]


class DeviceModel:
    """What the runtime knows about a device, for placement and the cost model.

    Throughput figures are rough and only compared against each other: ``flops`` (FLOP/s),
    ``mem_bandwidth`` (bytes/s on the device), ``host_link`` (bytes/s between host and device;
    ``None`` means the device *is* host memory), ``launch_overhead`` (seconds per kernel or per
    compiled graph call).
    """

    __slots__ = (
        "name",
        "kind",
        "memory_capacity",
        "dtypes",
        "flops",
        "mem_bandwidth",
        "host_link",
        "launch_overhead",
    )

    def __init__(
        self,
        name: str,
        kind: str,
        *,
        memory_capacity: int | None = None,
        dtypes: frozenset[DType] = ALL_TYPES,
        flops: float = 1e10,
        mem_bandwidth: float = 1e10,
        host_link: float | None = None,
        launch_overhead: float = 5e-6,
    ) -> None:
        self.name = name
        self.kind = kind
        self.memory_capacity = memory_capacity
        self.dtypes = frozenset(dtypes)
        self.flops = flops
        self.mem_bandwidth = mem_bandwidth
        self.host_link = host_link
        self.launch_overhead = launch_overhead

    def __repr__(self) -> str:
        return f"DeviceModel({self.name!r}, kind={self.kind!r})"

    def problems(self) -> list[str]:
        """What is wrong with these figures (empty when they can be used): throughputs finite
        and positive, overhead finite and not negative, capacity a non-negative integer."""
        out = []
        figures = {"flops": self.flops, "mem_bandwidth": self.mem_bandwidth}
        if self.host_link is not None:
            figures["host_link"] = self.host_link
        for field, value in figures.items():
            if not _finite(value) or value <= 0:
                out.append(f"{field}={value!r} (a finite number > 0)")
        if not _finite(self.launch_overhead) or self.launch_overhead < 0:
            out.append(f"launch_overhead={self.launch_overhead!r} (finite seconds >= 0)")
        cap = self.memory_capacity
        if cap is not None and (not isinstance(cap, (int, np.integer)) or cap < 0):
            out.append(f"memory_capacity={cap!r} (bytes as an int >= 0, or None)")
        return out


#: Guards the backends' lazily created pools (one pool per backend, whatever the threads).
_LAZY_LOCK = threading.Lock()


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float, np.number)) and bool(np.isfinite(value))


class CompiledGraph:
    """What a graph-mode backend's ``compile`` returns: a callable over device tensors.

    ``run(inputs)`` takes device tensors in ``graph.inputs`` order and returns device tensors in
    ``graph.outputs`` order. ``info`` is shown in the placement report (e.g. memory plan size).
    ``serialize`` (optional) returns the executable as bytes that the same backend's
    ``load_compiled`` turns back into an equal executable (see the module docstring).
    """

    def __init__(
        self,
        run: Callable[[Sequence[Any]], Sequence[Any]],
        *,
        info: dict[str, Any] | None = None,
        serialize: Callable[[], bytes | None] | None = None,
        checked_later: bool = False,
    ) -> None:
        self.run = run
        self.info = dict(info or {})
        self._serialize = serialize
        #: The backend checks this executable at its first run, not at compile time (IREE's
        #: background compiles): ``serialize`` gives nothing until ``checked()``, so no disk
        #: cache keeps an unchecked executable.
        self.checked_later = checked_later
        #: Called (no arguments) by ``checked()``: ``compile_and_store`` puts the store of
        #: the bytes here for an executable checked later.
        self.when_checked: list[Callable[[], None]] = []

    def checked(self) -> None:
        """The backend's check of this executable passed: its bytes may be written now, and
        what waited for that runs (the disk cache's store of a background compile)."""
        self.checked_later = False
        waiting, self.when_checked = self.when_checked, []
        for fn in waiting:
            fn()

    def serialize(self) -> bytes | None:
        """The executable as bytes for ``Backend.load_compiled``, or None when it cannot be
        written (no serializer given, the backend declines for this partition, or its check
        is still to come)."""
        if self._serialize is None or self.checked_later:
            return None
        data = self._serialize()
        return None if data is None else bytes(data)


class Backend:
    """Base class of every device backend."""

    name: str = ""
    kind: str = ""
    priority: int = 0
    graph_mode: bool = False
    #: True when device tensors are host numpy arrays (the CPU); no copies are needed then.
    host_memory: bool = False
    #: "symbolic": takes symbolic dimensions (every kernel-mode backend); "static": compiles
    #: for concrete shapes only, so the runtime specializes each partition per input
    #: signature and caches the executables (graph-mode devices; ``core/compile/specialize.py``).
    shape_policy: str = "symbolic"
    #: A graph-mode "symbolic" device whose compiles are slow (IREE's): True has each partition
    #: compiled once in the background while the host serves it (with ``background_compile``,
    #: never under ``strict``; ``core/compile/specialize.py``'s dynamic partitions).
    compiles_in_background: bool = False
    #: False: used only when named, never in a session with no device list (an alias of
    #: another device, or a device sharing the host's cores; ``core/plan/devices.py``).
    auto_select: bool = True
    #: True: named in ``devices=[...]`` while unavailable, it stays in the session, refuses
    #: every node with the reason, and placement goes on with the others (``cuda`` without a
    #: GPU); False: naming it is an error (``core/plan/devices.py``).
    kept_when_unavailable: bool = False
    #: The registry this backend was added to (``Registry.add_backend`` sets it).
    registry: Any = None
    #: Bucketed dimensions of a static-shape device (``core/plugin/shapes.py``): symbol ->
    #: "pow2" or sizes; None pads nothing.
    buckets: dict[str, Any] | None = None
    #: True where ``adopt`` takes a caller's array already on this device (array-API devices).
    adopts_arrays: bool = False
    #: The revision of this backend's code and driver (a class attribute or a property): part
    #: of the calibration key and of the compile cache's, so change it when the kernels, the
    #: compiler or the format of ``CompiledGraph.serialize()`` change.
    version: str = ""
    #: The per-session options ``configure`` was given (``device_options``); part of the
    #: compile cache's key.
    options: dict[str, Any] = {}  # replaced by configure, never mutated
    #: One line for ``anychip devices``: the runtime or driver behind the device, with its
    #: version ("onnxruntime 1.32.0 CPUExecutionProvider"); a class attribute or a property.
    about: str = ""
    #: True for a device simulated on the host (the ``npu`` and ``xpu`` stubs): ``anychip
    #: devices`` says so, and its times say nothing of a real chip.
    simulated: bool = False

    def __init__(self) -> None:
        self.origin = "?"
        self._device: DeviceModel | None = None
        self._availability: tuple[bool, str] | None = None
        self._pool: Any = None

    # -- description ---------------------------------------------------------------------------
    def device_model(self) -> DeviceModel:
        """Override: the device's capacity, dtypes and throughput."""
        return DeviceModel(self.name, self.kind or self.name)

    @property
    def device(self) -> DeviceModel:
        """``device_model()``, validated once: a bad figure is a ``DeviceError`` naming it."""
        if self._device is None:
            try:
                model = self.device_model()
            except KeyboardInterrupt:
                raise
            except BaseException as e:
                raise DeviceError(
                    f"{self.name}: device_model() raised {type(e).__name__}: {e}"
                ) from e
            if not isinstance(model, DeviceModel):
                raise DeviceError(
                    f"{self.name}: device_model() returned {type(model).__name__}, not a "
                    "DeviceModel",
                )
            if bad := model.problems():
                raise DeviceError(
                    f"{self.name}: its DeviceModel has {'; '.join(bad)}; fix the figures the "
                    "backend's device_model() returns",
                )
            self._device = model
        return self._device

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``; computed once."""
        if self._availability is None:
            try:
                self._availability = self._available()
            except AnychipError as e:
                self._availability = (False, str(e))
            except Exception as e:
                self._availability = (False, f"{type(e).__name__}: {e}")
        return self._availability

    def _available(self) -> tuple[bool, str]:
        return True, ""

    def claims(self) -> list[Any] | None:
        """What this device claims to run, as ``OpClaim``s (``core/plugin/claims.py``); None
        (the default) derives the claims from the kernel table. Graph-mode backends, which have
        no table, state theirs here."""
        return None

    def adopt(self, x: Any) -> Any | None:
        """``x`` as this device's tensor when the caller's array already lives on this device
        (DLPack), else None; only where ``adopts_arrays`` is True."""
        return None

    # -- per-session options -------------------------------------------------------------------
    def configure(self, **options: Any) -> Backend:
        """A copy of this backend set up with per-session ``options`` (self when none).

        ``anychip.load(..., device_options={"npu": {"precision": "fp16"}})`` calls this; a
        backend accepts options by overriding ``_configure``.
        """
        if not options:
            return self
        clone = copy.copy(self)
        clone._device = None
        clone.__dict__.pop("_claims_memo", None)  # options may change what it claims
        clone._pool = None  # a configured copy (other capacity) gets a pool of its own
        clone._configure(**options)
        clone.options = {**self.options, **options}
        return clone

    def _configure(self, **options: Any) -> None:
        raise DeviceError(f"device {self.name!r} takes no options (given: {sorted(options)})")

    # -- what plugins registered for this backend ------------------------------------------------
    @property
    def kernels(self) -> KernelTable | None:
        """This backend's kernel table (every plugin's kernels for its name merged)."""
        return self.registry.kernel_table(self.name) if self.registry is not None else None

    @property
    def passes(self) -> list[Any]:
        """The graph passes registered for this backend, in registration order."""
        if self.registry is None:
            return []
        return [entry.pass_ for entry in self.registry.passes_for(self.name)]

    @property
    def pool_factory(self) -> Any:
        """The memory pool factory registered for this backend's kind, or None."""
        return self.registry.pools.get(self.kind) if self.registry is not None else None

    # -- device memory -------------------------------------------------------------------------
    @property
    def memory_pool(self) -> Any:
        """The pool this device's tensors come from (created on first use): the factory a
        plugin registered for this kind (``anychip_register_memory_pools``), else a plain
        ``MemoryPool`` over this backend's raw allocator (``_alloc(nbytes)`` / ``_free``)."""
        if self._pool is not None:
            return self._pool
        with _LAZY_LOCK:  # two threads' first allocations must share one pool
            if self._pool is None:
                self._pool = self._new_pool()
        return self._pool

    def _new_pool(self) -> Any:
        factory = self.pool_factory
        if factory is not None:
            return factory(self)
        if not all(callable(getattr(self, m, None)) for m in ("_alloc", "_free")):
            raise DeviceError(
                f"backend {self.name!r} has no memory pool: define _alloc(nbytes) and "
                "_free(buffer) (raw device memory), or register a pool for kind "
                f"{self.kind!r}"
            )
        from anychip.core.memory.pool import MemoryPool, RawAllocator

        raw = cast(RawAllocator, self)  # both methods checked above
        return MemoryPool(self.name, capacity=self.device.memory_capacity, allocator=raw)

    def allocate(self, nbytes: int) -> Any:
        """A ``Block`` of ``nbytes`` of device memory from ``memory_pool``; raises
        ``OutOfMemoryError`` with the figures when the device is full."""
        return self.memory_pool.alloc(nbytes)

    def deallocate(self, block: Any) -> None:
        """Give a block from ``allocate`` back to its pool."""
        block.pool.free(block)

    def memory_stats(self) -> Any:
        """``MemoryStats`` of this device's pool, or None when it never allocated (override
        when the driver keeps its own figures)."""
        return self._pool.stats() if self._pool is not None else None

    def runner(self, partition: Any, memory: Any) -> Callable[[list[Any]], list[Any]]:
        """How this device runs one of its kernel-mode partitions: the one place a backend
        wraps or intercepts a partition's runs. ``memory`` is the partition's
        ``core/run/memory.PartitionMemory`` (its ``program``, planned arena and outputs);
        ``memory.runner`` (device tensors in, outputs out) is the plain run, returned as is by
        default. A device may wrap it (the XPU waits for its queue; CUDA captures a
        static-shape partition as a graph: ``backends/cuda/graphs.py``) or install a per-run
        interceptor with ``memory.intercept(around)`` before taking ``memory.runner`` (the
        CPU's replay of recorded kernel calls: ``backends/cpu/replay/``)."""
        return memory.runner

    # -- capability ----------------------------------------------------------------------------
    def supports(self, node: Node, table: KernelTable | None = None) -> str | None:
        """None when this backend can run ``node``, else the reason it cannot.

        Checks, in order: the dtypes the device computes (constant inputs such as shapes are
        read at compile time and do not count), a kernel for the node's op, version and dtype
        in ``table`` (default: ``self.kernels``; graph-mode backends have none) and the
        constraints declared on that kernel, the constraints declared on the claim covering
        the node (``claims()``: ``core/plugin/claims.Constraint``), then ``check_node``.
        Placement asks this of every device for every node.
        """
        for v in list(node.inputs) + list(node.outputs):
            if v is None or v.const is not None or not v.is_tensor or not v.dtype:
                continue
            if v.dtype not in self.device.dtypes:
                return f"dtype {v.dtype.short} not supported by {self.name}"
        if not self.graph_mode:
            kernel, why = find_kernel(table if table is not None else self.kernels, node)
            if kernel is None:
                return why
            if kernel.constraints:  # declared on the kernel: KernelTable.register(constraints=)
                from anychip.core.plugin.claims import first_refusal

                if (declared := first_refusal(kernel.constraints, node)) is not None:
                    return declared
        if (stated := self._stated_claims()) is not None:
            from anychip.core.plugin.claims import declared_refusal

            if (refused := declared_refusal(stated, node)) is not None:
                return refused
        try:
            return self.check_node(node)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return f"{self.name}.check_node raised {type(e).__name__}: {e}"[:300]

    def check_node(self, node: Node) -> str | None:
        """Override: the reason this backend cannot run ``node`` beyond its kernel table."""
        return None

    def _stated_claims(self) -> list[Any] | None:
        """``claims()`` once per backend object, as ``OpClaim``s, where any carries a declared
        constraint (None otherwise: nothing to check per node)."""
        if "_claims_memo" not in self.__dict__:
            from anychip.core.plugin.claims import claims_of

            stated = self.claims()
            found = claims_of(self) if stated is not None else None
            self.__dict__["_claims_memo"] = (
                found if found and any(c.constraints for c in found) else None
            )
        return self.__dict__["_claims_memo"]

    # -- transfers -----------------------------------------------------------------------------
    def to_device(self, array: np.ndarray) -> Any:
        """Copy a host array into device memory."""
        if self.host_memory:
            return array
        try:
            return self._copy_in(np.asarray(array, order="C"))  # keeps 0-d shapes
        except AnychipError:
            raise
        except Exception as e:
            raise DeviceError(
                f"{self.name}: copy to device of {array.dtype}{list(array.shape)} failed: {e}"
            ) from e

    def to_host(self, tensor: Any) -> np.ndarray:
        """Copy a device tensor into a fresh host array."""
        if self.host_memory:
            return tensor
        try:
            return self._copy_out(tensor)
        except AnychipError:
            raise
        except Exception as e:
            raise DeviceError(f"{self.name}: copy to host failed: {e}") from e

    def from_device(self, tensor: Any, src: Backend) -> Any:
        """Copy a tensor of device ``src`` into this device (through the host by default)."""
        if src is self:
            return tensor
        direct = self._copy_device(tensor, src)
        if direct is not None:
            return direct
        return self.to_device(src.to_host(tensor))

    def _copy_in(self, array: np.ndarray) -> Any:
        raise DeviceError(f"backend {self.name!r} does not implement _copy_in")

    def _copy_out(self, tensor: Any) -> np.ndarray:
        raise DeviceError(f"backend {self.name!r} does not implement _copy_out")

    def _copy_device(self, tensor: Any, src: Backend) -> Any | None:
        return None

    def release(self, tensor: Any) -> None:
        """Return a device tensor's memory (called when the executor drops its last use)."""

    def device_arena(self, nbytes: int) -> Any:
        """Override in own-memory kernel devices whose kernels take ``out=``: one block of
        ``nbytes`` for a partition's planned tensors, as an object with ``view(offset, shape,
        dtype)`` (a device tensor at that offset, whose ``release`` does nothing: it is the
        arena's) and ``close()`` (gives the block back; called once, at the session's
        ``close()`` or when its placement is collected). None (the default): each kernel
        allocates its outputs (``core/run/memory.py``)."""
        return None

    def streams(self) -> Any:
        """Override to declare a copy stream and events (a ``core/plugin/streams.Streams``):
        the session's copies to and from this device then run on it, ordered with the kernels
        by events, instead of one synchronous copy after another. None (the default): no."""
        return None

    # -- graph mode ----------------------------------------------------------------------------
    def release_compiled(self, compiled: CompiledGraph) -> None:
        """Override in graph-mode backends: give back what ``compile`` put on the device for
        ``compiled`` (weights, plans, code). Called once per executable, never while it runs:
        when its session closes (or is collected), when a per-signature executable is evicted
        from its LRU cache, or when a new placement replaces it."""

    def compile(self, graph: Graph) -> CompiledGraph:
        """Override in graph-mode backends: compile a partition into one executable."""
        raise DeviceError(f"backend {self.name!r} is not a graph-mode backend")

    @property
    def cache_tag(self) -> str:
        """Override: what besides the partition, ``version`` and ``options`` changes the
        compiled code (a precision mode, a driver's version); part of the compile cache's key."""
        return ""

    def load_compiled(self, data: bytes) -> CompiledGraph:
        """Override in graph-mode backends whose ``CompiledGraph.serialize()`` returns bytes:
        the executable those bytes describe, placed on this device, without compiling.

        Raises:
            DeviceError (or any exception): ``data`` is not this backend's format, is of
                another version or options, or is corrupt; the caller compiles again.
            OutOfMemoryError: the executable does not fit in free device memory.
        """
        raise DeviceError(f"backend {self.name!r} does not load compiled bytes")

    @property
    def loads_compiled(self) -> bool:
        """Whether this backend overrides ``load_compiled`` (the compile cache asks)."""
        return type(self).load_compiled is not Backend.load_compiled

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r}>"
