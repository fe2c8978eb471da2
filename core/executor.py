"""The executor: runs compiled partitions in order and moves tensors between devices.

``Program`` is an interpreter over one graph on one kernel-mode backend (torch.fx's
Interpreter is the model). Compilation turns every node into an instruction
``(kernel, input slots, output slots, attributes, slots to free)`` so the per-node loop does no
lookups. A subclass may override:

    * ``call_kernel(instr, args)``: how one kernel is invoked (profiling, checking);
    * ``on_error(instr, args, exc)``: how a failure is reported (default: ``KernelError``
      with the node's text, device, and input types).

Invariants:
    * Each value's slot is cleared right after its last reader (readers inside nested graphs
      count as reads by the node that owns the graph), and the backend's ``release`` is
      called for device tensors, so device memory is returned as soon as possible.
    * Constants are moved to the device once, when the program is built.
    * Kernel errors never escape raw: they are re-raised as ``KernelError`` naming the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.errors import AnychipError, KernelError, UnsupportedOpError
from anychip.core.placement import find_kernel
from anychip.opsets.schemas import attribute_defaults, resolve

if TYPE_CHECKING:
    from anychip.core.backend import Backend
    from anychip.core.kernels import Kernel, KernelTable
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value
    from anychip.opsets.schemas import SchemaRegistry

__all__ = ["Program", "KernelContext", "Instr", "describe_args", "evaluate_node"]


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
    """One compiled node."""

    __slots__ = ("fn", "ins", "outs", "attrs", "frees", "node", "ctx")

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
        self._compile(parent)

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
        from anychip.core.errors import GraphError

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
            for g in ins.node.subgraphs():
                for v, s in self.slot_of.items():
                    if _reads_inside(g, v):
                        last[s] = max(last.get(s, i), i)
            for s in ins.outs:
                if s >= 0:
                    last.setdefault(s, i)
        keep = set(self.output_slots) | {s for s, _ in self.consts}
        keep |= {s for _, s in self.captures} | set(self.input_slots)
        frees: dict[int, list[int]] = {}
        for s, i in last.items():
            if s not in keep:
                frees.setdefault(i, []).append(s)
        for i, ins in enumerate(self.instrs):
            ins.frees = tuple(frees.get(i, ()))

    # -- execution -------------------------------------------------------------------------
    def run(self, inputs: Sequence[Any], outer: list[Any] | None = None) -> list[Any]:
        """Run with ``inputs`` (device tensors, in graph input order); returns outputs."""
        slots: list[Any] = [None] * self.nslots
        for s, t in self.consts:
            slots[s] = t
        if self.captures:
            for ps, s in self.captures:
                slots[s] = outer[ps]
        for s, t in zip(self.input_slots, inputs):
            slots[s] = t
        release = self._release
        for ins in self.instrs:
            args = [slots[i] if i >= 0 else None for i in ins.ins]
            if ins.ctx is not None:
                ins.ctx._frame = slots
                args.insert(0, ins.ctx)
            try:
                res = ins.fn(*args, **ins.attrs)
            except Exception as e:  # noqa: BLE001 - re-raised with the node's text
                self.on_error(ins, args, e)
            outs = ins.outs
            if type(res) is tuple or type(res) is list:
                for s, r in zip(outs, res):
                    if s >= 0:
                        slots[s] = np.asarray(r) if isinstance(r, np.generic) else r
            elif outs[0] >= 0:
                slots[outs[0]] = np.asarray(res) if isinstance(res, np.generic) else res
            for s in ins.frees:
                if release is not None and slots[s] is not None:
                    release(slots[s])
                slots[s] = None
        return [slots[s] for s in self.output_slots]

    def on_error(self, ins: Instr, args: list[Any], exc: Exception) -> None:
        from anychip.ir.printer import format_node

        shown = args[1:] if ins.ctx is not None else args
        where = f"{self.backend.name}: node {ins.node.name!r} ({ins.node.qualified_op}) failed"
        if isinstance(exc, AnychipError):
            # Keep the class (OutOfMemoryError, InputError...) and its figures; add the node.
            exc.args = (f"{where}: {exc}\n  inputs: {describe_args(shown)}",) + exc.args[1:]
            raise exc
        raise KernelError(
            f"{self.backend.name}: node {ins.node.name!r} ({ins.node.qualified_op}) failed: "
            f"{type(exc).__name__}: {exc}\n  node: {format_node(ins.node).strip()}\n"
            f"  inputs: {describe_args(shown)}"
        ) from exc


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
