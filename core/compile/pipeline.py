"""The compiler: a model and a device list in, a ``CompiledModel`` out.

The walk, in order (each step's module in brackets):

1. copy the caller's ``ir.Model`` (``ir/clone.copy_model``): compiling never rewrites it;
2. resolve every node's schema once (``opsets/schemas.resolve``): ``node.meta["since"]``;
3. generic passes (``ir/passes``): constant folding and dead code, then the graph
   optimizations (BatchNormalization folding) and plugins' whole-graph passes;
4. placement (``core/plan/placement.place``), partitions and copies
   (``core/plan/partition.partition_graph``);
5. per partition: the backend's passes, then kernel mode (an executor ``Program`` with its
   ``PartitionMemory``) or graph mode (``backend.compile``);
6. a partition that does not fit its device's memory is excluded from that device and the
   walk goes back to 4 (at most once per device);
7. the steps a run interprets (``core/run/steps.build_steps``).
"""

from __future__ import annotations

import logging
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from anychip.core.compile.cache import compile_graph_cached
from anychip.core.compile.per_signature import (
    disk_for,
    process_disk,
    specialized,
    specializes,
    static_key,
)
from anychip.core.compile.specialize import SpecializedPartition, release_executables
from anychip.core.compile.static_shapes import complete_shapes
from anychip.core.plan.calibration import calibrations
from anychip.core.plan.cost_search import Costs
from anychip.core.plan.partition import HOST, CopyInfo, CopyRecord, Partition, partition_graph
from anychip.core.plan.placement import PlacementOptions, place
from anychip.core.plugin.budget import Deadline, check_timeout, default_timeout, within
from anychip.core.progress import task
from anychip.core.run.feedback import explain_partitions, predicted_time
from anychip.core.run.memory import PartitionMemory, default_pool
from anychip.core.run.program import Program, evaluate_node
from anychip.core.run.steps import StepProgram, build_steps
from anychip.errors import (
    AnychipError,
    CompileTimeout,
    DeviceError,
    OutOfMemoryError,
    PlacementError,
)
from anychip.ir.clone import copy_model
from anychip.ir.graph import Model
from anychip.ir.passes import EliminateDeadCodePass, FoldConstantsPass, PassManager
from anychip.ir.passes.decompose_com_microsoft import decompose_for_devices, recompose_unmoved
from anychip.ir.passes.fold_batch_norm import fold_batch_norm
from anychip.opsets.schemas import resolve

__all__ = ["CompiledModel", "CompileOptions", "compile_model", "disk_for"]

log = logging.getLogger("anychip")


@dataclass
class CompileOptions:
    """What ``anychip.load`` says about compiling (placement has ``PlacementOptions``).

    ``plan_cache_size``: memory plans kept per kernel-mode partition for dynamic shapes;
    ``optimize``: the graph optimizations (BatchNorm folding); ``check_kernels``: kernel outputs
    checked against inference; ``compile_cache_size``: executables kept per partition of a
    static-shape device (one per input signature, LRU); ``background_compile``: such devices
    compile in a background thread while runs go to the host (``core/compile/specialize.py``; None:
    ``ANYCHIP_BACKGROUND_COMPILE``, default on); ``compile_timeout``: seconds one graph
    compile may take before it is abandoned (``core/plugin/budget.py``; None: no limit).
    """

    plan_cache_size: int = 8
    optimize: bool = True
    check_kernels: bool = True
    compile_cache_size: int = 8
    background_compile: bool | None = True
    #: Bring-up (``core/run/bring_up.py``): every device kernel watched and compared with the
    #: CPU's on the same inputs.
    bring_up: bool = False
    #: Compiled artifacts of graph-mode backends that opt in, on disk (``core/compile/cache.py``);
    #: off with ``ANYCHIP_COMPILE_CACHE=0``.
    disk_cache: bool = field(
        default_factory=lambda: os.environ.get("ANYCHIP_COMPILE_CACHE", "1") != "0"
    )
    compile_timeout: float | None = field(default_factory=default_timeout)

    def __post_init__(self) -> None:
        if self.background_compile is None:
            env = os.environ.get("ANYCHIP_BACKGROUND_COMPILE", "1")
            self.background_compile = env != "0"
        self.background_compile = bool(self.background_compile)
        self.compile_timeout = check_timeout(self.compile_timeout)
        for name in ("plan_cache_size", "compile_cache_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AnychipError(f"{name} must be an int >= 1, got {value!r}")


class CompiledModel:
    """What compilation produced: the model (a copy), its partitions, copies and steps."""

    def __init__(self, model: Model, backends: list[Any]) -> None:
        self.model = model
        self.backends = backends
        self.partitions: list[Partition] = []
        self.copies: list[CopyRecord] = []
        #: Constants moved to a device once, when its partition was compiled.
        self.load_copies: list[CopyInfo] = []
        #: Kernel-mode partitions' memory, by partition index.
        self.part_memory: dict[int, PartitionMemory] = {}
        #: The session's pools of host-memory devices, by device name.
        self.pools: dict[str, Any] = {}
        self.memory_notes: list[str] = []
        self.folded = 0
        #: What the graph optimizations rewrote, by pass (the nodes they removed).
        self.optimizations: dict[str, int] = {}
        #: The run steps, set by ``compile_model`` before it returns (never None after).
        self.steps: StepProgram
        self.check_kernels = True
        #: The cost model this placement was made with, and its estimate of one run.
        self.costs: Costs | None = None
        self.predicted: float | None = None
        #: Set when run-time feedback chose this placement over the first one.
        self.replaced = ""
        #: Partitions of static-shape devices compiled per input signature, by index.
        self.specialized: dict[int, SpecializedPartition] = {}
        #: Bring-up: each watched partition's comparison with the CPU (``bring_up.py``).
        self.bring_up: dict[int, Any] = {}
        #: Graph-mode executables of this placement, ``(backend, CompiledGraph)``: held as long
        #: as the placement, and given back to their backend (``Backend.release_compiled``)
        #: by ``release()`` or when the placement is collected.
        self.executables: list[tuple[Any, Any]] = []
        self.release = weakref.finalize(self, release_executables, self.executables)

    def close(self) -> None:
        """Stop its background compiles and give every executable back now (a session's
        ``close()``, a re-placement); later calls do nothing more."""
        for sp in self.specialized.values():
            sp.close()  # a compile still running would put an executable back
        self.release()
        for pm in self.part_memory.values():
            pm.close()  # planned device memory (Backend.device_arena)


def compile_model(
    model: Model,
    backends: list[Any],
    options: PlacementOptions,
    registry: Any,
    copts: CompileOptions | None = None,
) -> CompiledModel:
    """Compile ``model`` (left unchanged) for ``backends`` in priority order."""
    copts = copts or CompileOptions()
    out = CompiledModel(copy_model(model), backends)
    out.check_kernels = copts.check_kernels
    resolve_schemas(out.model, registry.schemas)
    _generic_passes(out, registry, options, copts.optimize)
    graph = out.model.graph
    if options.cost_model:
        options.calibrations = calibrations(backends, options.calibration)
    tables = {b.name: registry.kernel_table(b.name) for b in backends}
    decomposed = decompose_for_devices(
        out.model, backends, tables, options.pin_for, registry.schemas
    )
    if decomposed:  # com.microsoft nodes a preferred device runs only in standard ops
        out.optimizations["decompose_contrib"] = decomposed
    excluded: dict[str, dict[str, str]] = {}
    # Each retry moves at least one node off a device that is not its last: bounded.
    for _attempt in range(len(graph.nodes) * len(backends) + 1):
        place(graph, backends, tables, options, excluded)
        recompose_unmoved(graph, backends, tables)  # decomposed nodes no device took
        out.partitions, out.copies = partition_graph(graph)
        _check_copy_budget(out.copies, options)
        if not _compile_partitions(out, registry, tables, options, excluded, copts):
            break
    out.steps = build_steps(graph, out.partitions, out.copies, backends, registry)
    out.steps.max_copy_bytes = options.max_copy_bytes
    if options.cost_model and len(backends) > 1:
        _explain(out, options, tables)
    return out


def _explain(out: CompiledModel, options: PlacementOptions, tables: dict) -> None:
    """The cost model's view of the placement: per partition (here / best elsewhere) and the
    whole run (what feedback compares measured times with)."""
    by_name = {b.name: b for b in out.backends}

    def capable(device: str, node: Any) -> bool:
        return by_name[device].supports(node, tables.get(device)) is None

    out.costs = Costs(out.backends, options.calibrations, options.factors, capable)
    explain_partitions(out, out.costs)
    out.predicted = predicted_time(out)


def resolve_schemas(model: Model, schemas: Any) -> None:
    """Give every node its opset version and ``meta["since"]``, the schema version it uses."""
    for node in model.graph.walk():
        if node.version is None:
            node.version = model.opset_imports.get(node.domain, 1)
        node.meta["since"] = resolve(node.op_type, node.domain, node.version, schemas).since_version


def _generic_passes(
    out: CompiledModel, registry: Any, options: PlacementOptions, optimize: bool
) -> None:
    """Constant folding and dead code, the graph optimizations, then plugins' passes."""
    graph = out.model.graph
    cpu = registry.kernel_table(HOST)
    schemas = registry.schemas
    fold = FoldConstantsPass(lambda node, ins: evaluate_node(node, ins, cpu, schemas))
    PassManager([fold, EliminateDeadCodePass()], max_iterations=2)(graph)
    out.folded = fold.folded
    if optimize:
        pins = options.pin_for
        out.optimizations["fold_batch_norm"] = fold_batch_norm(
            graph, accept=lambda conv, bn: pins(conv) is None and pins(bn) is None
        )
    for entry in registry.passes_for(None):
        # On a copy (weights shared): a pass that raises halfway leaves nothing behind.
        trial = copy_model(out.model)
        try:
            PassManager([entry.pass_], max_iterations=1)(trial.graph)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            why = f"pass {entry.pass_.name} of plugin {entry.origin!r} failed, skipped: "
            out.memory_notes.append(why + f"{type(e).__name__}: {e}"[:300])
            log.warning("anychip: %s", out.memory_notes[-1])
            continue
        out.model = trial


def _check_copy_budget(copies: list[CopyRecord], options: PlacementOptions) -> None:
    """The transfer budget: copies and (static) bytes per run, with every edge listed."""

    def edges() -> str:
        return ", ".join(
            f"{c.tensor} {c.src}->{c.dst} ({'size unknown' if c.bytes is None else c.bytes} B)"
            for c in copies
        )

    if options.max_copies is not None and len(copies) > options.max_copies:
        raise PlacementError(
            f"this placement makes {len(copies)} copies per run, more than "
            f"max_copies={options.max_copies}: {edges()}. Pin nodes to fewer devices or raise "
            "max_copies."
        )
    budget = options.max_copy_bytes
    known = sum(c.bytes for c in copies if c.bytes is not None)
    if budget is not None and known > budget:
        raise PlacementError(
            f"this placement copies {known} bytes per run, more than max_copy_bytes={budget}: "
            f"{edges()}. Pin nodes to fewer devices or raise max_copy_bytes."
        )


def _compile_partitions(
    out: CompiledModel,
    registry: Any,
    tables: dict,
    options: PlacementOptions,
    excluded: dict,
    copts: CompileOptions,
) -> bool:
    """Compile every partition; True when some did not fit their device and placement must
    run again without that device for their nodes (all of them are excluded at once)."""
    by_name = {b.name: b for b in out.backends}
    last = out.backends[-1].name
    out.release()  # a placement tried before: its executables go back
    out.release = weakref.finalize(out, release_executables, out.executables)
    out.load_copies, out.part_memory, out.specialized = [], {}, {}
    retry = False
    with task("compiling partitions", len(out.partitions)) as advance:
        for p in out.partitions:
            advance(1)
            backend = by_name[p.device]
            # bring-up of a graph-mode partition: the CPU program of its graph as placed
            reference = (
                _graph_reference(p, registry) if copts.bring_up and backend.graph_mode else None
            )
            traced = False  # shapes only a run tells: traced on the first run, then compiled
            if backend.graph_mode and backend.shape_policy == "static":
                if all(v.is_static for v in p.graph.inputs):
                    traced = not complete_shapes(p.graph)  # what folding made known
            per_signature = specializes(backend, p.graph, copts, options.strict)
            if backend.graph_mode and (traced or per_signature):
                p.program = out.specialized[p.index] = specialized(
                    out, p, backend, registry, copts, options.strict
                )
                p.program = _checked(p, backend, reference)
                continue
            must_fit = options.strict or p.device == last
            if backend.graph_mode:
                why = _compile_graph(p, backend, registry, copts, must_fit, out.executables)
            else:
                why = _compile_kernels(out, p, backend, registry, tables, copts, must_fit)
            if why is not None:
                _exclude(out, p, why, excluded)
                retry = True
                continue
            if backend.graph_mode:
                p.program = _checked(p, backend, reference)
            if not backend.host_memory:
                for v in p.graph.initializers.values():
                    out.load_copies.append(CopyInfo(v.name, HOST, p.device, v.nbytes))
    return retry


def _checked(p: Any, backend: Any, reference: Any) -> Any:
    """``p.program``, compared with ``reference`` on every run in bring-up (else as is)."""
    if reference is None:
        return p.program
    from anychip.core.run.bring_up import bring_up_graph

    return bring_up_graph(p.program, p, backend, reference)


def _graph_reference(p: Any, registry: Any) -> Any:
    """Bring-up of a graph-mode partition: the CPU's program of its graph as placed, made
    before the device's compile rewrites the graph (``core/run/bring_up.bring_up_graph``)."""
    from anychip.core.run.bring_up import cpu_reference

    return cpu_reference(p, registry.backends[HOST], registry.kernel_table(HOST), registry.schemas)


def _compile_graph(
    p: Any, backend: Any, registry: Any, copts: CompileOptions, must_fit: bool, held: list
) -> str | None:
    """A graph-mode partition through the backend's compiler (and the disk cache); the reason
    it does not fit its device, or None once ``p.program`` is set. The compile has
    ``compile_timeout`` seconds (``budget.py``); one that ends late is given back."""
    deadline = Deadline(copts.compile_timeout, f"compile of partition {p.index} on {p.device}")
    try:
        compiled, _ = within(
            deadline,
            lambda: compile_graph_cached(
                backend, p.graph, static_key(p.graph), process_disk(copts)
            ),
            late=lambda done: release_executables([(backend, done[0])]),
        )
    except CompileTimeout:
        if must_fit:
            raise
        return f"{deadline.what} abandoned {deadline.reason}"
    except OutOfMemoryError as e:
        if must_fit:
            raise
        why = f"partition {p.index} needs {e.need} bytes, {p.device} has {e.capacity}"
        if e.in_use:
            why += f" with {e.in_use} in use by other sessions"
        return why + " (out of memory)"
    except KeyboardInterrupt:
        raise
    except BaseException as e:
        return _failed(p, "compile", e, must_fit)
    p.program = compiled.run
    p.info.update(compiled.info)
    held.append((backend, compiled))  # the placement holds it: Backend.release_compiled
    return None


def _compile_kernels(
    out: CompiledModel,
    p: Any,
    backend: Any,
    registry: Any,
    tables: dict,
    copts: CompileOptions,
    must_fit: bool,
) -> str | None:
    """A kernel-mode partition: its program, passes and planned memory; the reason it does not
    fit its device's budget, or None once ``p.program`` is set."""
    # optimize=False keeps the nodes as written: passes marked optimization=True are left out
    passes = [x for x in backend.passes if copts.optimize or not getattr(x, "optimization", 0)]
    if passes:  # one manager: the graph is verified after every pass
        try:  # before the program: it is built from the rewritten graph
            PassManager(passes, max_iterations=1)(p.graph)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            return _failed(p, "a graph pass", e, must_fit)
        if p.graph.meta.get("fusions"):  # what each fusion pass rewrote, for the report
            p.info["fusions"] = dict(p.graph.meta["fusions"])
    try:  # the constants go to the device here
        program = Program(
            p.graph, backend, tables[p.device], registry.schemas, check_kernels=out.check_kernels
        )
    except OutOfMemoryError as e:
        if must_fit:
            raise
        return f"partition {p.index}'s weights do not fit: {e}"[:400]
    pool = _pool_for(out, backend, registry.pools.get(backend.kind))
    pm = PartitionMemory(program, pool, copts.plan_cache_size)
    why = _over_budget(p, backend, pm)
    if why is not None:
        if must_fit:
            raise OutOfMemoryError(
                f"{p.device}: {why}. Use a smaller input, or add a device with more memory.",
                device=p.device,
                need=pm.current.plan.total_size + pm.boundary_bytes(),
                capacity=backend.device.memory_capacity,
            )
        return why
    out.part_memory[p.index] = pm
    if copts.bring_up and p.device != HOST:
        from anychip.core.run.bring_up import bring_up_program

        ref = bring_up_program(program, registry.kernel_table(HOST))
        p.info["bring-up"] = "every kernel watched and compared with the CPU's"
        out.bring_up[p.index] = ref
    p.program = backend.runner(p, pm)
    return None


def _pool_for(out: CompiledModel, backend: Any, factory: Callable | None) -> Any:
    """The session's pool for a host-memory device: the factory registered for its kind
    (``anychip_register_memory_pools``), else ``core.memory.partition.default_pool``."""
    if not backend.host_memory:
        return None  # device tensors are not numpy arrays: kernels allocate them
    pool = out.pools.get(backend.name)
    if pool is None:
        factory = factory or default_pool
        try:
            pool = factory(backend)
        except AnychipError:
            raise
        except Exception as e:
            raise DeviceError(
                f"{backend.name}: the memory pool factory {factory!r} for kind "
                f"{backend.kind!r} failed: {type(e).__name__}: {e}"
            ) from e
        out.pools[backend.name] = pool
    return pool


def _over_budget(p: Partition, backend: Any, pm: PartitionMemory) -> str | None:
    """Why the partition's planned memory exceeds its device's capacity, or None."""
    capacity = backend.device.memory_capacity
    if pm.current is None or not capacity:
        return None
    planned = pm.current.plan.total_size
    boundary = pm.boundary_bytes()
    if planned + boundary <= capacity:
        return None
    return (
        f"partition {p.index} needs {planned + boundary} bytes ({planned} planned for "
        f"intermediate tensors + {boundary} of inputs, outputs and weights), {p.device} has "
        f"{capacity} (out of memory)"
    )


def _failed(p: Partition, stage: str, e: BaseException, must_fit: bool) -> str:
    """Why partition ``p`` cannot go to its device after ``stage`` raised ``e``; raised as a
    ``DeviceError`` when there is no fallback (strict, or the last device)."""
    why = f"{stage} failed on partition {p.index}: {type(e).__name__}: {e}"[:400]
    if must_fit and isinstance(e, AnychipError):
        raise e
    if must_fit:
        raise DeviceError(f"{p.device}: {why}") from e
    return why


def _exclude(out: CompiledModel, p: Partition, why: str, excluded: dict) -> None:
    """Keep partition ``p``'s nodes off its device on the next placement, and say why."""
    for n in p.nodes:
        excluded.setdefault(n.name, {})[p.device] = why
    out.memory_notes.append(f"{p.device}: {why}; its nodes went elsewhere")
    log.warning("anychip: %s: %s; placing its %d nodes elsewhere", p.device, why, len(p.nodes))
