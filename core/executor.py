"""The executor: runs compiled partitions in order and moves tensors between devices.

``Program`` is an interpreter over one graph on one kernel-mode backend (torch.fx's
Interpreter is the model). Compilation turns every node into an instruction
``(kernel, input slots, output slots, attributes, slots to free)`` so the per-node loop does no
lookups. A subclass may override:

    * ``on_error(instr, args, exc)``: how a failure is reported (default: ``KernelError``
      with the node's text, device, and input types; ``OutOfMemoryError`` for a raw
      ``MemoryError``).

Memory (see ``core/run_memory.py``): ``memory_steps()`` lists what each instruction reads and
writes, for the liveness planner. ``run(..., arena=...)`` hands a kernel that accepts an
``out=`` keyword the planned view of its output (the *out protocol*: ``out`` has the output's
expected shape and dtype; the kernel writes its result there and returns ``out``, or returns a
fresh array when the result does not fit it; for the element-wise ops in
``run_memory.INPLACE_OPS`` ``out`` may be the very memory of its first input). Results that view
the arena without the plan knowing are copied out, and so are outputs, so nothing the caller
holds is overwritten by a later run. A top-level program counts the bytes of the arrays it
holds (``peak``: arrays owning their memory, views count nothing) and the ``out`` views its
kernels declined (``declined``).

Invariants:
    * Each value's slot is cleared right after its last reader (readers inside nested graphs
      count as reads by the node that owns the graph), and the backend's ``release`` is
      called for device tensors, so device memory is returned as soon as possible.
    * Constants are moved to the device once, when the program is built.
    * Kernel errors never escape raw: they are re-raised as ``KernelError`` naming the node
      (``OutOfMemoryError`` for a ``MemoryError``), after the device tensors the failed run
      made are released, so the program stays usable.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.memory import Step
from anychip.core.placement import find_kernel
from anychip.errors import AnychipError, KernelError, OutOfMemoryError, UnsupportedOpError
from anychip.opsets.schemas import attribute_defaults, resolve

if TYPE_CHECKING:
    from anychip.core.backend import Backend
    from anychip.core.kernels import Kernel, KernelTable
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value
    from anychip.opsets.schemas import SchemaRegistry

__all__ = [
    "Program",
    "KernelContext",
    "Instr",
    "Arena",
    "describe_args",
    "evaluate_node",
    "release_quietly",
]


class KernelContext:
    """What a ``context=True`` kernel receives as its first argument.

    Attributes:
        node: the IR node being run.
        num_outputs: how many outputs the node declares (omitted optional ones included).
        backend: the backend running it.
    """

    __slots__ = ("node", "num_outputs", "backend", "_program", "_frame", "_subprograms")

    def __init__(self, node: Node, program: Program | None) -> None:
        self.node = node
        self.num_outputs = len(node.outputs)
        self.backend = program.backend if program is not None else None
        self._program = program
        self._frame: list[Any] | None = None
        self._subprograms: dict[int, Program] = {}
        for g in node.subgraphs() if program is not None else ():
            self._subprograms[id(g)] = Program(
                g, program.backend, program.table, program.schemas, parent=program
            )

    @property
    def outputs_used(self) -> list[bool]:
        """For each declared output, whether the node has it (omitted optional: False)."""
        return [v is not None and bool(v.name) for v in self.node.outputs]

    def run_graph(self, graph: Graph, inputs: Sequence[Any]) -> list[Any]:
        """Run a nested graph of this node with its formal inputs bound to ``inputs``.

        Values the nested graph reads from enclosing scopes are taken from the running frame.
        """
        prog = self._subprograms.get(id(graph))
        if prog is None:
            raise KernelError(
                f"graph {graph.name!r} is not an attribute of node {self.node.name!r}"
            )
        return prog.run(inputs, outer=self._frame)


class Instr:
    """One compiled node. ``reads`` adds the slots its nested graphs read to ``ins``;
    ``takes_out``: the kernel accepts ``out=`` (see the module docstring)."""

    __slots__ = ("fn", "ins", "outs", "attrs", "frees", "node", "ctx", "reads", "takes_out")

    def __init__(
        self,
        fn: Any,
        ins: tuple[int, ...],
        outs: tuple[int, ...],
        attrs: dict[str, Any],
        node: Node,
        ctx: KernelContext | None,
    ) -> None:
        self.fn = fn
        self.ins = ins
        self.outs = outs
        self.attrs = attrs
        self.frees: tuple[int, ...] = ()
        self.node = node
        self.ctx = ctx
        self.reads: tuple[int, ...] = tuple(i for i in ins if i >= 0)
        # Only single-output kernels are handed an ``out`` view.
        self.takes_out = len(outs) == 1 and outs[0] >= 0 and _takes_out(fn)


class Arena:
    """The planned memory of one run: ``views[slot]`` is the array a kernel may write slot's
    value into (None: not planned); ``base`` the array owning them; ``nbytes`` its size."""

    __slots__ = ("views", "base", "nbytes")

    def __init__(self, views: list[Any], base: np.ndarray, nbytes: int) -> None:
        self.views = views
        self.base = base
        self.nbytes = nbytes


_TAKES_OUT: dict[Any, bool] = {}


def _takes_out(fn: Any) -> bool:
    """Whether ``fn`` has an ``out`` keyword parameter (asked once per function)."""
    known = _TAKES_OUT.get(fn)
    if known is None:
        try:
            param = inspect.signature(fn).parameters.get("out")
        except (TypeError, ValueError):
            param = None
        known = param is not None and param.kind in (
            inspect.Parameter.KEYWORD_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        )
        _TAKES_OUT[fn] = known
    return known


def describe_args(args: Sequence[Any]) -> str:
    parts = []
    for a in args:
        if a is None:
            parts.append("_")
        elif hasattr(a, "dtype") and hasattr(a, "shape"):
            parts.append(f"{a.dtype}{list(a.shape)}")
        else:
            parts.append(type(a).__name__)
    return "(" + ", ".join(parts) + ")"


def _node_attrs(node: Node, schemas: SchemaRegistry | None) -> dict[str, Any]:
    """Schema defaults overlaid with the node's attributes, as kernel keyword arguments."""
    since = node.meta.get("since")
    attrs: dict[str, Any] = {}
    try:
        schema = resolve(node.op_type, node.domain, node.version or 1, schemas)
        attrs.update(attribute_defaults(schema))
        if since is None:
            node.meta["since"] = schema.since_version
    except UnsupportedOpError:
        if since is None:
            raise
    for k, a in node.attributes.items():
        attrs[k] = a.value
    return attrs


class Program:
    """A graph compiled for one kernel-mode backend."""

    def __init__(
        self,
        graph: Graph,
        backend: Backend,
        table: KernelTable | None,
        schemas: SchemaRegistry | None = None,
        *,
        parent: Program | None = None,
    ) -> None:
        self.graph = graph
        self.backend = backend
        self.table = table
        self.schemas = schemas
        self.slot_of: dict[Value, int] = {}
        self.consts: list[tuple[int, Any]] = []
        self.captures: list[tuple[int, int]] = []  # (parent slot, own slot)
        self._release = None if backend.host_memory else backend.release
        #: A top-level program counts the bytes it holds; ``peak`` is the most in one run.
        self.track = parent is None
        self.peak = 0
        #: Planned ``out`` views a kernel was handed but did not return (it allocated instead).
        self.declined = 0
        #: Slots whose values may view an arena tensor with the plan's knowledge (alias ops).
        self.alias_slots: frozenset[int] = frozenset()
        self._compile(parent)
        if self._release is not None and self.consts:
            # Device copies of constants live as long as the program: give them back then.
            weakref.finalize(self, release_quietly, self._release, [t for _, t in self.consts])

    # -- compilation -----------------------------------------------------------------------
    def _slot(self, v: Value) -> int:
        s = self.slot_of.get(v)
        if s is None:
            s = self.slot_of[v] = len(self.slot_of)
        return s

    def _compile(self, parent: Program | None) -> None:
        g = self.graph
        self.input_slots = [self._slot(v) for v in g.inputs]
        for v in g.initializers.values():
            if v not in self.slot_of:
                self.consts.append((self._slot(v), self.backend.to_device(v.const)))
        self.instrs: list[Instr] = []
        for node in g.nodes:
            kernel = node.meta.get("kernel")
            if kernel is None or kernel.backend != self.backend.name:
                kernel = self._lookup(node)
            ins = []
            for v in node.inputs:
                ins.append(-1 if v is None else self._read_slot(v, parent))
            self._captures_of(node, parent)
            outs = tuple(-1 if v is None else self._slot(v) for v in node.outputs)
            instr = Instr(kernel.fn, tuple(ins), outs, _node_attrs(node, self.schemas), node, None)
            if kernel.context:
                instr.ctx = KernelContext(node, self)
            self.instrs.append(instr)
        self.output_slots = [self._read_slot(v, parent) for v in g.outputs]
        self._plan_frees()
        self.nslots = len(self.slot_of)

    def _lookup(self, node: Node) -> Kernel:
        kernel, why = find_kernel(self.table, node)
        if kernel is None:
            raise UnsupportedOpError(
                f"{self.backend.name}: cannot run node {node.name!r} ({node.qualified_op}) "
                f"inside graph {self.graph.name!r}: {why}"
            )
        return kernel

    def _read_slot(self, v: Value, parent: Program | None) -> int:
        s = self.slot_of.get(v)
        if s is not None:
            return s
        if v.const is not None:
            s = self._slot(v)
            self.consts.append((s, self.backend.to_device(v.const)))
            return s
        if parent is not None and v in parent.slot_of:
            s = self._slot(v)
            self.captures.append((parent.slot_of[v], s))
            return s
        from anychip.errors import GraphError

        raise GraphError(f"graph {self.graph.name!r} reads %{v.name}, which is not defined")

    def _captures_of(self, node: Node, parent: Program | None) -> None:
        """Give a slot to every outer value read inside ``node``'s nested graphs."""
        for g in node.subgraphs():
            inner_defined: set[Value] = set()
            for sub_node in g.walk():
                inner_defined.update(v for v in sub_node.outputs if v is not None)
                for sg in sub_node.subgraphs():
                    inner_defined.update(sg.inputs)
                    inner_defined.update(sg.initializers.values())
            inner_defined.update(g.inputs)
            inner_defined.update(g.initializers.values())
            for sub_node in g.walk():
                for v in sub_node.inputs:
                    if v is not None and v not in inner_defined:
                        self._read_slot(v, parent)
            for v in g.outputs:
                if v not in inner_defined:
                    self._read_slot(v, parent)

    def _plan_frees(self) -> None:
        last: dict[int, int] = {}
        for i, ins in enumerate(self.instrs):
            for s in ins.ins:
                if s >= 0:
                    last[s] = i
            inner: list[int] = []
            for g in ins.node.subgraphs():
                for v, s in self.slot_of.items():
                    if _reads_inside(g, v):
                        last[s] = max(last.get(s, i), i)
                        inner.append(s)
            if inner:
                ins.reads = tuple(dict.fromkeys(ins.reads + tuple(inner)))
            for s in ins.outs:
                if s >= 0:
                    last.setdefault(s, i)
        keep = set(self.output_slots) | self.external_slots()
        frees: dict[int, list[int]] = {}
        for s, i in last.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
        for i, ins in enumerate(self.instrs):
            ins.frees = tuple(frees.get(i, ()))

    # -- memory --------------------------------------------------------------------------
    def external_slots(self) -> set[int]:
        """Slots the program does not write: inputs, constants and captured outer values."""
        return set(self.input_slots) | {s for s, _ in self.consts} | {s for _, s in self.captures}

    def memory_steps(self) -> list[Step]:
        """One ``Step`` per instruction, in order: the slots it reads (nested graphs' reads
        included) and writes; the liveness planner's input."""
        return [Step(ins.reads, tuple(s for s in ins.outs if s >= 0)) for ins in self.instrs]

    # -- execution -------------------------------------------------------------------------
    def run(
        self,
        inputs: Sequence[Any],
        outer: list[Any] | None = None,
        *,
        arena: Arena | None = None,
        record: dict[int, tuple[tuple[int, ...], Any]] | None = None,
    ) -> list[Any]:
        """Run with ``inputs`` (device tensors, in graph input order); returns outputs.

        Args:
            inputs: Device tensors in graph input order.
            outer: The enclosing program's slots (nested graphs only).
            arena: Planned output views for kernels that accept ``out=``.
            record: Filled with ``slot -> (shape, dtype)`` of every array a kernel returns
                (the sizes a plan for these input shapes needs).
        """
        slots: list[Any] = [None] * self.nslots
        for s, t in self.consts:
            slots[s] = t
        if self.captures:
            for ps, s in self.captures:
                slots[s] = outer[ps]
        for s, t in zip(self.input_slots, inputs):
            slots[s] = t
        release = self._release
        track = self.track
        held = [0] * self.nslots if track else None
        views = base = None
        aliases = self.alias_slots
        live = peak = 0
        if arena is not None:
            views, base, live = arena.views, arena.base, arena.nbytes
        try:
            for ins in self.instrs:
                args = [slots[i] if i >= 0 else None for i in ins.ins]
                if ins.ctx is not None:
                    ins.ctx._frame = slots
                    args.insert(0, ins.ctx)
                out = views[ins.outs[0]] if views is not None and ins.takes_out else None
                try:
                    if out is not None:
                        res = ins.fn(*args, out=out, **ins.attrs)
                    else:
                        res = ins.fn(*args, **ins.attrs)
                except Exception as e:  # noqa: BLE001 - re-raised with the node's text
                    self.on_error(ins, args, e)
                results = res if type(res) is tuple or type(res) is list else (res,)
                if out is not None and (not results or results[0] is not out):
                    self.declined += 1
                for s, r in zip(ins.outs, results):
                    if s < 0:
                        continue
                    if isinstance(r, np.generic):
                        r = np.asarray(r)
                    if (
                        base is not None
                        and type(r) is np.ndarray
                        and r is not views[s]
                        and r.base is base
                        and s not in aliases
                    ):
                        # A view of planned memory the plan did not expect: its bytes may be
                        # reused while it lives, so it gets its own.
                        r = r.copy()
                    slots[s] = r
                    if track:
                        nb = _owned_bytes(r)
                        held[s] = nb
                        live += nb
                    if record is not None and type(r) is np.ndarray:
                        record[s] = (r.shape, r.dtype)
                if live > peak:
                    peak = live
                for s in ins.frees:
                    if release is not None and slots[s] is not None:
                        release(slots[s])
                    slots[s] = None
                    if track:
                        live -= held[s]
                        held[s] = 0
        except BaseException:
            self._drop(slots)
            raise
        if track and peak > self.peak:
            self.peak = peak
        outs = [slots[s] for s in self.output_slots]
        if base is not None:
            outs = [o.copy() if type(o) is np.ndarray and o.base is base else o for o in outs]
        return outs

    def _drop(self, slots: list[Any]) -> None:
        """Release the device tensors a failed run made (host arrays are left to the GC)."""
        if self._release is None:
            return
        external = self.external_slots()
        mine = [s for s, t in enumerate(slots) if t is not None and s not in external]
        release_quietly(self._release, [slots[s] for s in mine])
        for s in mine:
            slots[s] = None

    def on_error(self, ins: Instr, args: list[Any], exc: Exception) -> None:
        from anychip.ir.printer import format_node

        shown = args[1:] if ins.ctx is not None else args
        where = f"{self.backend.name}: node {ins.node.name!r} ({ins.node.qualified_op}) failed"
        if isinstance(exc, MemoryError) and not isinstance(exc, AnychipError):
            need = sum(v.nbytes or 0 for v in ins.node.outputs if v is not None)
            capacity = self.backend.device.memory_capacity
            raise OutOfMemoryError(
                f"{where}: out of memory ({type(exc).__name__}: {exc}); it needed about "
                f"{need} bytes for its outputs, the device has "
                f"{capacity if capacity is not None else 'an unknown number of'} bytes. Run with "
                "a smaller batch or input, or place part of the model on another device.\n"
                f"  inputs: {describe_args(shown)}",
                device=self.backend.name,
                need=need,
                capacity=capacity or 0,
            ) from exc
        if isinstance(exc, AnychipError):
            # Keep the class (OutOfMemoryError, InputError...) and its figures; add the node.
            exc.args = (f"{where}: {exc}\n  inputs: {describe_args(shown)}",) + exc.args[1:]
            raise exc
        raise KernelError(
            f"{self.backend.name}: node {ins.node.name!r} ({ins.node.qualified_op}) failed: "
            f"{type(exc).__name__}: {exc}\n  node: {format_node(ins.node).strip()}\n"
            f"  inputs: {describe_args(shown)}"
        ) from exc


def _owned_bytes(t: Any) -> int:
    """Bytes ``t`` holds of its own: a numpy view or a device view holds none."""
    if type(t) is np.ndarray:
        return t.nbytes if t.base is None else 0
    if getattr(t, "is_view", False):
        return 0
    nb = getattr(t, "nbytes", 0)
    return nb if type(nb) is int else 0


def _reads_inside(g: Graph, v: Value) -> bool:
    return any(user.graph is not None and _inside(user.graph, g) for user, _ in v.uses)


def _inside(graph: Graph, root: Graph) -> bool:
    while graph is not None:
        if graph is root:
            return True
        graph = graph.parent.graph if graph.parent is not None else None
    return False


def evaluate_node(
    node: Node, inputs: Sequence[Any], table: KernelTable, schemas: SchemaRegistry | None = None
) -> list[Any]:
    """Run one node (without nested graphs) on host arrays with ``table``'s kernel.

    Used by constant folding; raises ``UnsupportedOpError`` when no kernel fits.
    """
    kernel, why = find_kernel(table, node)
    if kernel is None:
        raise UnsupportedOpError(why)
    args = list(inputs)
    if kernel.context:
        args.insert(0, KernelContext(node, None))
    res = kernel.fn(*args, **_node_attrs(node, schemas))
    if type(res) is not tuple and type(res) is not list:
        res = [res]
    return [np.asarray(r) if isinstance(r, np.generic) else r for r in res]


def release_quietly(release: Any, tensors: Sequence[Any]) -> None:
    """Release every tensor, ignoring failures: used on error paths (the run's own error is the
    one to report) and at teardown (the driver may already be gone)."""
    for t in tensors:
        try:
            release(t)
        except Exception:  # noqa: BLE001, S110
            pass
