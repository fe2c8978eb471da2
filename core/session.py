"""``Session`` and ``load``: a model compiled for a set of devices, run like onnxruntime.

The walk (DESIGN.md): import -> resolve schemas -> generic passes -> placement -> partitions
and copies -> per-backend passes -> compile each partition (kernel mode: a ``Program``; graph
mode: ``backend.compile``) -> a flat list of steps (copies and partition runs) that ``run``
interprets. There is no CPU-only shortcut: one device is the general case with one partition.

Memory: each kernel-mode partition gets a ``PartitionMemory`` (``core/run_memory.py``): its
liveness plan, made at compile time for static shapes or per input-shape signature on first
run, and the arena of kernels that write into planned memory, taken from the device's pool
(``registry.pools``). A partition whose plan does not fit its device is placed elsewhere like
one a graph-mode compiler refused. ``Session.memory()`` reports the figures. A run that fails
releases the device tensors it made, and a ``MemoryError`` reaches the caller as
``OutOfMemoryError``: the session stays usable.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from anychip.core.executor import Program, evaluate_node, release_quietly
from anychip.core.memory_report import DeviceMemory, MemoryReport
from anychip.core.partition import HOST, partition_graph
from anychip.core.placement import PlacementOptions, place
from anychip.core.plugins import get_registry
from anychip.core.report import CopyInfo, NodeRecord, PartitionRecord, PlacementReport
from anychip.core.run_memory import PartitionMemory, default_pool
from anychip.errors import (
    AnychipError,
    DeviceError,
    InputError,
    OutOfMemoryError,
    PlacementError,
)
from anychip.ir.dtypes import DType
from anychip.ir.graph import Model
from anychip.ir.passes import EliminateDeadCodePass, FoldConstantsPass, PassManager
from anychip.ir.passes.fold_batch_norm import fold_batch_norm
from anychip.ir.value import Value, format_shape
from anychip.opsets.schemas import resolve

__all__ = ["Session", "IOInfo", "load", "resolve_devices"]

log = logging.getLogger("anychip")


class IOInfo:
    """A model input or output: ``name``, ``dtype`` (DType), ``shape`` (ints, str or None),
    ``optional``."""

    __slots__ = ("name", "dtype", "shape", "type", "optional")

    def __init__(self, v: Value) -> None:
        self.name = v.name
        #: True when an initializer gives the input a default (old ONNX models list weights
        #: among the inputs); a feed then overrides it.
        self.optional = v.const is not None
        self.dtype = v.dtype
        self.shape = list(v.shape) if v.shape is not None else None
        self.type = v.type_str()

    @property
    def numpy_dtype(self) -> np.dtype | None:
        return self.dtype.numpy if self.dtype else None

    def __repr__(self) -> str:
        return f"IOInfo({self.name!r}, {self.type})"


def resolve_devices(devices: Sequence[str] | str | None, strict: bool = False) -> list[str]:
    """The device names a session uses, from the argument, ``ANYCHIP_DEVICES``, or all.

    Without an explicit list, every available backend is used, highest priority first, cpu
    last. ``cpu`` is appended as the fallback unless ``strict`` or already listed.
    """
    registry = get_registry()
    if devices is None:
        devices = os.environ.get("ANYCHIP_DEVICES") or None
    if isinstance(devices, str):
        devices = [d.strip() for d in devices.split(",") if d.strip()]
    if devices is None:
        avail = [b for b in registry.backends.values() if b.available()[0]]
        avail.sort(key=lambda b: (b.name == "cpu", -b.priority, b.name))
        names = [b.name for b in avail]
    else:
        names = []
        for d in devices:
            name = d.lower()
            b = registry.backends.get(name)
            if b is None:
                known = ", ".join(sorted(registry.backends)) or "none"
                raise DeviceError(
                    f"unknown device {d!r}; known devices: {known}. "
                    "See `anychip devices` for what is installed and why a "
                    "device may be missing."
                )
            ok, why = b.available()
            if not ok:
                raise DeviceError(f"device {name!r} is not available here: {why}")
            if name not in names:
                names.append(name)
    if not names:
        raise DeviceError("no device is available; `anychip devices` shows why")
    if "cpu" not in names and not strict:
        names.append("cpu")
    return names


class _Step:
    __slots__ = ("kind", "fn", "ins", "outs", "frees", "device", "label")

    def __init__(
        self, kind: str, fn: Any, ins: list[int], outs: list[int], label: str, device: str
    ) -> None:
        self.kind = kind
        self.fn = fn
        self.ins = ins
        self.outs = outs
        self.frees: list[tuple[int, Any]] = []
        #: The device whose memory the step's outputs take (a copy's destination).
        self.device = device
        self.label = label


class Session:
    """A model compiled for a list of devices. Use ``anychip.load`` to make one."""

    def __init__(
        self,
        model: Model,
        devices: list[str],
        options: PlacementOptions,
        device_options: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        plan_cache_size: int = 8,
        optimize: bool = True,
    ) -> None:
        self._registry = registry = get_registry()
        self.model = model
        self.devices = devices
        self.options = options
        device_options = dict(device_options or {})
        unknown = sorted(set(device_options) - set(devices))
        if unknown:
            raise DeviceError(
                f"device_options name {unknown}, which are not among this "
                f"session's devices {devices}"
            )
        self._backends = [
            registry.backends[d].configure(**device_options.get(d, {})) for d in devices
        ]
        self._lock = threading.Lock()
        if int(plan_cache_size) < 1:
            raise AnychipError(f"plan_cache_size must be >= 1, got {plan_cache_size}")
        self._plan_cache_size = int(plan_cache_size)
        self._pools: dict[str, Any] = {}
        self._memory_notes: list[str] = []
        graph = model.graph
        self._resolve_schemas()
        self._run_generic_passes(optimize)
        tables = {b.name: registry.kernel_table(b.name) for b in self._backends}
        excluded: dict[str, dict[str, str]] = {}
        for _attempt in range(len(self._backends)):
            place(graph, self._backends, tables, options, excluded)
            self.partitions, self.copies = partition_graph(graph)
            if not self._check_copies_and_compile(tables, excluded):
                break
        self._build_steps()
        self.inputs = [IOInfo(v) for v in graph.inputs]
        self.outputs = [IOInfo(v) for v in graph.outputs]
        self._input_values = list(graph.inputs)
        self._defaults = {v.name: v.const for v in graph.inputs if v.const is not None}
        self._log_fallbacks()

    def _check_copies_and_compile(self, tables: dict, excluded: dict) -> bool:
        """Compile the partitions; True when one did not fit its device and placement must
        run again without that device for its nodes."""
        options = self.options
        if options.max_copies is not None and len(self.copies) > options.max_copies:
            raise PlacementError(
                f"this placement makes {len(self.copies)} copies per run, more than "
                f"max_copies={options.max_copies}: "
                + ", ".join(f"{c.tensor} {c.src}->{c.dst}" for c in self.copies[:8])
                + ". Pin nodes to fewer devices or raise max_copies."
            )
        return self._compile_partitions(tables, excluded)

    # -- compilation -----------------------------------------------------------------------
    def _resolve_schemas(self) -> None:
        for node in self.model.graph.walk():
            if node.version is None:
                node.version = self.model.opset_imports.get(node.domain, 1)
            schema = resolve(node.op_type, node.domain, node.version, self._registry.schemas)
            node.meta["since"] = schema.since_version

    def _run_generic_passes(self, optimize: bool) -> None:
        """Constant folding and dead-code elimination, the graph optimizations (``optimize``),
        then plugins' generic passes."""
        cpu = self._registry.kernel_table(HOST)
        schemas = self._registry.schemas
        fold = FoldConstantsPass(lambda node, ins: evaluate_node(node, ins, cpu, schemas))
        PassManager([fold, EliminateDeadCodePass()], max_iterations=2)(self.model.graph)
        self.folded = fold.folded
        #: What the graph optimizations rewrote, by pass (the nodes they removed).
        self.optimizations: dict[str, int] = {}
        if optimize:
            pins = self.options.pin_for
            n = fold_batch_norm(
                self.model.graph, accept=lambda conv, bn: pins(conv) is None and pins(bn) is None
            )
            self.optimizations["fold_batch_norm"] = n
        for entry in self._registry.passes_for(None):
            entry.pass_(self.model.graph)

    def _compile_partitions(self, tables: dict, excluded: dict) -> bool:
        by_name = {b.name: b for b in self._backends}
        self._load_copies: list[CopyInfo] = []
        self._part_memory: dict[int, PartitionMemory] = {}
        for p in self.partitions:
            backend = by_name[p.device]
            for entry in self._registry.passes_for(p.device):
                entry.pass_(p.graph)
            if backend.graph_mode:
                try:
                    compiled = backend.compile(p.graph)
                except OutOfMemoryError as e:
                    if self.options.strict or p.device == self._backends[-1].name:
                        raise
                    why = (
                        f"partition {p.index} needs {e.need} bytes, {p.device} has "
                        f"{e.capacity} (out of memory)"
                    )
                    self._exclude(p, why, excluded)
                    return True
                p.program = compiled.run
                p.info.update(compiled.info)
            else:
                program = Program(p.graph, backend, tables[p.device], self._registry.schemas)
                pm = PartitionMemory(program, self._pool_for(backend), self._plan_cache_size)
                if self._over_budget(p, backend, pm, excluded):
                    return True
                self._part_memory[p.index] = pm
                p.program = pm.runner
            if not backend.host_memory:
                for v in p.graph.initializers.values():
                    self._load_copies.append(CopyInfo(v.name, HOST, p.device, v.nbytes))
        return False

    def _pool_for(self, backend: Any) -> Any:
        """The session's pool for a host-memory device: the registered factory for its kind
        (``anychip_register_memory_pools``), else ``run_memory.default_pool``."""
        if not backend.host_memory:
            return None  # device tensors are not numpy arrays: kernels allocate them
        pool = self._pools.get(backend.name)
        if pool is None:
            factory = self._registry.pools.get(backend.kind) or default_pool
            try:
                pool = factory(backend)
            except AnychipError:
                raise
            except Exception as e:  # noqa: BLE001 - a plugin's factory failed
                raise DeviceError(
                    f"{backend.name}: the memory pool factory {factory!r} for kind "
                    f"{backend.kind!r} failed: {type(e).__name__}: {e}"
                ) from e
            self._pools[backend.name] = pool
        return pool

    def _over_budget(self, p: Any, backend: Any, pm: PartitionMemory, excluded: dict) -> bool:
        """True when the partition's planned memory exceeds its device's capacity and its
        nodes must be placed again elsewhere; raises when there is nowhere else."""
        capacity = backend.device.memory_capacity
        if pm.current is None or not capacity:
            return False
        planned = pm.current.plan.total_size
        boundary = pm.boundary_bytes()
        need = planned + boundary
        if need <= capacity:
            return False
        why = (
            f"partition {p.index} needs {need} bytes ({planned} planned for intermediate "
            f"tensors + {boundary} of inputs, outputs and weights), {p.device} has {capacity} "
            "(out of memory)"
        )
        if self.options.strict or p.device == self._backends[-1].name:
            raise OutOfMemoryError(
                f"{p.device}: {why}. Use a smaller input, or add a device with more memory.",
                device=p.device,
                need=need,
                capacity=capacity,
            )
        self._exclude(p, why, excluded)
        return True

    def _exclude(self, p: Any, why: str, excluded: dict) -> None:
        """Keep partition ``p``'s nodes off its device on the next placement, and say why."""
        for n in p.nodes:
            excluded.setdefault(n.name, {})[p.device] = why
        self._memory_notes.append(f"{p.device}: {why}; its nodes went elsewhere")
        log.warning("anychip: %s: %s; placing its %d nodes elsewhere", p.device, why, len(p.nodes))

    def _build_steps(self) -> None:
        graph = self.model.graph
        by_name = {b.name: b for b in self._backends}
        by_name.setdefault(HOST, self._registry.backends[HOST])
        slot: dict[tuple[Value, str], int] = {}

        def get(v: Value, dev: str) -> int:
            key = (v, dev)
            if key not in slot:
                slot[key] = len(slot)
            return slot[key]

        self._feed_slots = [get(v, HOST) for v in graph.inputs]
        steps: list[_Step] = []
        copies_before: dict[int, list] = {}
        for c in self.copies:
            copies_before.setdefault(c.before, []).append(c)
        values = {v.name: v for v in graph.values()}
        for p in self.partitions + [None]:
            index = p.index if p is not None else len(self.partitions)
            for c in copies_before.get(index, []):
                v = values[c.tensor]
                src, dst = by_name[c.src], by_name[c.dst]
                steps.append(
                    _Step(
                        "copy",
                        _copier(src, dst),
                        [get(v, c.src)],
                        [get(v, c.dst)],
                        f"copy {c.tensor} {c.src}->{c.dst}",
                        c.dst,
                    )
                )
            if p is not None:
                steps.append(
                    _Step(
                        "run",
                        p.program,
                        [get(v, p.device) for v in p.inputs],
                        [get(v, p.device) for v in p.outputs],
                        f"partition {p.index} on {p.device}",
                        p.device,
                    )
                )
        self._consts: list[tuple[int, Any]] = []
        self._output_slots = []
        for v in graph.outputs:
            if (v, HOST) not in slot and v.const is not None:
                s = get(v, HOST)
                self._consts.append((s, v.const))
            self._output_slots.append(get(v, HOST))
        keep = set(self._output_slots) | {s for s, _ in self._consts}
        last: dict[int, int] = {}
        for i, st in enumerate(steps):
            for s in st.ins + st.outs:
                last[s] = i
        device_of = {s: dev for (_, dev), s in slot.items()}
        # Slots holding device tensors: released when a run fails half way.
        self._device_slots = [
            (s, by_name[dev].release)
            for s, dev in device_of.items()
            if not by_name[dev].host_memory
        ]
        for s, i in last.items():
            if s not in keep:
                b = by_name[device_of[s]]
                steps[i].frees.append((s, None if b.host_memory else b.release))
        self._steps = steps
        self._nslots = len(slot)
        self._output_names = [v.name for v in graph.outputs]

    def _log_fallbacks(self) -> None:
        fb = [
            n
            for n in self.model.graph.nodes
            if str(n.meta.get("placement_reason", "")).startswith("fallback")
        ]
        if fb and len(self.devices) > 1:
            ops = Counter(n.op_type for n in fb)
            log.warning(
                "anychip: %d node(s) fell back from %s: %s (see Session.placement())",
                len(fb),
                self.devices[0],
                ", ".join(f"{op} x{c}" for op, c in ops.most_common()),
            )

    # -- public ----------------------------------------------------------------------------
    def get_inputs(self) -> list[IOInfo]:
        """The model's inputs (onnxruntime's spelling)."""
        return self.inputs

    def get_outputs(self) -> list[IOInfo]:
        """The model's outputs (onnxruntime's spelling)."""
        return self.outputs

    def placement(self) -> PlacementReport:
        """Which node runs where and why, the partitions, and the copies per run."""
        part_of = {n: p.index for p in self.partitions for n in p.nodes}
        nodes = [
            NodeRecord(n.name, n.op_type, n.meta["device"], n.meta["placement_reason"], part_of[n])
            for n in self.model.graph.nodes
        ]
        parts = [
            PartitionRecord(p.index, p.device, [n.name for n in p.nodes], dict(p.info))
            for p in self.partitions
        ]
        copies = [CopyInfo(c.tensor, c.src, c.dst, c.bytes) for c in self.copies]
        return PlacementReport(nodes, parts, copies, list(self._load_copies), self.devices)

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], run_options: Any = None
    ) -> list[Any]:
        """Run the model: ``feeds`` maps input names to arrays; returns the outputs as numpy.

        Raises:
            InputError: a feed is missing, unknown, or of the wrong dtype, rank or shape.
            KernelError: a kernel failed (the message names the node and device).
        """
        slots: list[Any] = [None] * self._nslots
        for s, arr in zip(self._feed_slots, self._check_feeds(feeds)):
            slots[s] = arr
        for s, c in self._consts:
            slots[s] = c
        wanted = self._select(output_names)
        with self._lock:
            try:
                for st in self._steps:
                    if st.kind == "copy":
                        slots[st.outs[0]] = st.fn(slots[st.ins[0]])
                    else:
                        res = st.fn([slots[i] for i in st.ins])
                        for s, r in zip(st.outs, res):
                            slots[s] = r
                    for s, release in st.frees:
                        if release is not None and slots[s] is not None:
                            release(slots[s])
                        slots[s] = None
            except BaseException as e:
                self._release_slots(slots)
                if isinstance(e, MemoryError) and not isinstance(e, AnychipError):
                    raise OutOfMemoryError(
                        f"out of memory while running {st.label}: {type(e).__name__}: {e}. "
                        "Run with a smaller input, or place part of the model on another device.",
                        device=st.device,
                    ) from e
                raise
        outs = [slots[self._output_slots[i]] for i in wanted]
        return [_detach(o, feeds) for o in outs]

    def _release_slots(self, slots: list[Any]) -> None:
        """Give back the device tensors a failed run still holds."""
        for s, release in self._device_slots:
            t = slots[s]
            if t is not None:
                slots[s] = None
                release_quietly(release, [t])

    def memory(self) -> MemoryReport:
        """Memory figures per device: plan, lower bound, peak, reserved, plan cache (see
        ``core/memory_report.py``)."""
        by_name = {b.name: b for b in self._backends}
        records = {
            b.name: DeviceMemory(b.name, capacity=b.device.memory_capacity) for b in self._backends
        }
        for p in self.partitions:
            rec = records[p.device]
            rec.partitions += 1
            pm = self._part_memory.get(p.index)
            if pm is None:  # graph mode: the compiler's own plan
                rec.planned = max(rec.planned, int(p.info.get("activation_bytes", 0)))
                rec.lower_bound = max(rec.lower_bound, int(p.info.get("activation_lower_bound", 0)))
                continue
            rec.planned = max(rec.planned, pm.planned)
            rec.lower_bound = max(rec.lower_bound, pm.lower_bound)
            rec.peak = max(rec.peak, pm.program.peak)
            rec.declined += pm.program.declined
            rec.arena = max(rec.arena, pm.arena)
            rec.source = "executor"
            if pm.cache is not None:
                rec.dynamic_partitions += 1
                rec.hits += pm.cache.hits
                rec.misses += pm.cache.misses
                rec.replans += pm.cache.replans
        for name, rec in records.items():
            stats = getattr(by_name[name], "memory_stats", None)
            pool = self._pools.get(name)
            if callable(stats):
                st = stats()
                rec.peak, rec.reserved, rec.source = st.peak, st.reserved, "device pool"
            elif pool is not None:
                rec.reserved = pool.stats().reserved
        return MemoryReport(records, list(self._memory_notes))

    # -- feeds -----------------------------------------------------------------------------
    def _select(self, output_names: Sequence[str] | None) -> list[int]:
        if output_names is None:
            return list(range(len(self._output_names)))
        if isinstance(output_names, str):
            raise InputError(
                f"output_names must be a list of names, not the string "
                f"{output_names!r}; write [{output_names!r}]"
            )
        idx = []
        for name in output_names:
            if name not in self._output_names:
                raise InputError(
                    f"unknown output {name!r}; the model's outputs are {self._output_names}"
                )
            idx.append(self._output_names.index(name))
        return idx

    def _check_feeds(self, feeds: Mapping[str, Any]) -> list[Any]:
        if not isinstance(feeds, Mapping):
            raise InputError(
                f"feeds must be a dict of input name -> array, got {type(feeds).__name__}"
            )
        names = [v.name for v in self._input_values]
        unknown = [k for k in feeds if k not in names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model's inputs are {names}")
        out = []
        for v in self._input_values:
            if v.name not in feeds:
                if v.name in self._defaults:
                    out.append(self._defaults[v.name])
                    continue
                raise InputError(
                    f"missing input {v.name!r} ({v.type_str()}); the model's inputs are {names}"
                )
            out.append(_check_feed(v, feeds[v.name]))
        return out

    def __repr__(self) -> str:
        return (
            f"<anychip.Session devices={self.devices} inputs={[i.name for i in self.inputs]}"
            f" outputs={self._output_names}>"
        )


def _check_feed(v: Value, x: Any) -> Any:
    if not v.is_tensor:
        return x
    if not isinstance(x, np.ndarray):
        if isinstance(x, (np.generic, int, float, bool, list, tuple)):
            x = np.asarray(x)
            if v.dtype and x.dtype != v.dtype.numpy and x.dtype.kind == v.dtype.numpy.kind:
                x = x.astype(v.dtype.numpy)
        else:
            raise InputError(
                f"input {v.name!r} expects a numpy array ({v.type_str()}), got {type(x).__name__}"
            )
    if v.dtype:
        want = v.dtype.numpy
        ok = x.dtype == want or (v.dtype == DType.STRING and x.dtype.kind in "OUS")
        if not ok:
            raise InputError(
                f"input {v.name!r} expects dtype {want} ({v.type_str()}), got "
                f"{x.dtype}; convert it with .astype(np.{want})"
            )
        if v.dtype == DType.STRING and x.dtype.kind != "O":
            x = x.astype(object)
    if v.shape is not None:
        if x.ndim != len(v.shape):
            raise InputError(
                f"input {v.name!r} expects rank {len(v.shape)} "
                f"{format_shape(v.shape)}, got rank {x.ndim} with shape "
                f"{list(x.shape)}"
            )
        for i, (want_d, got_d) in enumerate(zip(v.shape, x.shape)):
            if isinstance(want_d, int) and want_d != got_d:
                raise InputError(
                    f"input {v.name!r} expects shape {format_shape(v.shape)}, got "
                    f"{list(x.shape)} (dimension {i} is {got_d}, expected "
                    f"{want_d})"
                )
    return x


def _detach(out: Any, feeds: Mapping[str, Any]) -> Any:
    """Outputs never alias a feed or a constant the session keeps."""
    if isinstance(out, np.ndarray) and (not out.flags.owndata or not out.flags.writeable):
        return out.copy()
    if isinstance(out, np.ndarray) and any(out is f for f in feeds.values()):
        return out.copy()
    return out


def _copier(src: Any, dst: Any) -> Any:
    if src.host_memory:
        return dst.to_device
    if dst.host_memory:
        return src.to_host
    return lambda t: dst.from_device(t, src)


def load(
    model: Any,
    devices: Sequence[str] | str | None = None,
    *,
    placement: dict[str, str] | None = None,
    strict: bool = False,
    max_copies: int | None = None,
    device_options: Mapping[str, Mapping[str, Any]] | None = None,
    cost_model: bool = True,
    plan_cache_size: int = 8,
    optimize: bool = True,
    **options: Any,
) -> Session:
    """Compile a model for a set of devices.

    Args:
        model: a path to an ``.onnx`` file, its bytes, an ``onnx.ModelProto`` or an
            ``anychip.ir.Model``.
        devices: device names in priority order (``["npu", "cpu"]`` or ``"npu,cpu"``);
            default ``ANYCHIP_DEVICES``, else every available device, cpu last.
        placement: pins by node name, op type or glob on node names -> device.
        strict: fail instead of falling back to a later device.
        max_copies: fail when a run would copy more tensors between devices than this.
        device_options: per-device settings, e.g. ``{"npu": {"precision": "fp16"}}``.
        cost_model: let the cost model keep small islands off accelerators (default True).
        plan_cache_size: memory plans kept per partition for dynamic input shapes (default 8).
        optimize: run the graph optimizations before placement (default True): a Conv's
            BatchNormalization is folded into its weights, as onnxruntime's basic level does.
            False keeps every node as written (constant folding always runs).

    Returns:
        A ``Session``; ``session.run(None, {"x": x})`` runs it.
    """
    if options:
        raise AnychipError(
            f"unknown load option(s) {sorted(options)}; known: devices, "
            "placement, strict, max_copies, device_options, cost_model, plan_cache_size, optimize"
        )
    from anychip.ir.onnx import import_model

    registry = get_registry()
    if not isinstance(model, Model):
        model = import_model(model, custom_schemas=registry.schemas)
    names = resolve_devices(devices, strict=strict)
    opts = PlacementOptions(
        pins=placement, strict=strict, max_copies=max_copies, cost_model=cost_model
    )
    return Session(
        model, names, opts, device_options, plan_cache_size=plan_cache_size, optimize=optimize
    )
