"""The executor: runs compiled partitions in order and moves tensors between devices.

``Program`` is an interpreter over one graph on one kernel-mode backend (torch.fx's
Interpreter is the model). Compilation turns every node into an instruction
``(kernel, input slots, output slots, attributes, slots to free)``, sealed for the flat per-node
loop of ``core/run/dispatch.py`` (no lookups, parsing or checks beyond one comparison per node).
A subclass may override:

    * ``on_error(instr, args, exc)``: how a failure is reported (default: ``KernelError``
      with the node's text, device, and input types; ``OutOfMemoryError`` for a raw
      ``MemoryError``).

Memory (see ``core/run/memory.py``): ``memory_steps()`` lists what each instruction reads and
writes, for the liveness planner. ``run(..., arena=...)`` hands a kernel that accepts an
``out=`` keyword the planned view of its output (the *out protocol*: ``out`` has the output's
expected shape and dtype; the kernel writes its result there and returns ``out``, or returns a
fresh array when the result does not fit it; for the element-wise ops in
``inplace=True`` kernels ``out`` may be the very memory of its first input). Results that view
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

import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.memory import Step
from anychip.core.plugin.kernels import find_kernel
from anychip.core.run.checks import expectations, kernel_name
from anychip.core.run.dispatch import Run, run_instrs
from anychip.core.run.kernel_call import (
    Arena,
    Instr,
    KernelContext,
    describe_args,
    evaluate_node,
    node_attrs,
)
from anychip.core.run.slots import free_after_last_use, release_quietly
from anychip.errors import (
    AnychipError,
    DeviceError,
    KernelError,
    OutOfMemoryError,
    UnsupportedOpError,
)

if TYPE_CHECKING:
    from anychip.core.plugin.backend import Backend
    from anychip.core.plugin.kernels import Kernel, KernelTable
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
        check_kernels: bool = True,
    ) -> None:
        self.graph = graph
        #: Check each kernel's outputs against inference's dtype and shape (``core/run/checks.py``).
        self.check_kernels: bool = check_kernels if parent is None else parent.check_kernels
        self.backend: Backend = backend
        self.table: KernelTable | None = table
        self.schemas: SchemaRegistry | None = schemas
        self.slot_of: dict[Value, int] = {}
        self.consts: list[tuple[int, Any]] = []
        self.captures: list[tuple[int, int]] = []  # (parent slot, own slot)
        self._release = None if backend.host_memory else backend.release
        #: A top-level program counts the bytes it holds; ``peak`` is the most in one run.
        self.track: bool = parent is None
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
            self._read_slot(v, parent)  # a slot, and the device copy of its ``const``
        self.instrs: list[Instr] = []
        static = all(
            v.shape is not None and all(isinstance(d, int) and d >= 0 for d in v.shape)
            for v in g.inputs
        )
        for node in g.nodes:
            kernel = node.meta.get("kernel")
            if kernel is None or kernel.backend != self.backend.name:
                kernel = self._lookup(node)
            ins = [-1 if u is None else self._read_slot(u, parent) for u in node.inputs]
            self._captures_of(node, parent)
            outs = tuple(-1 if v is None else self._slot(v) for v in node.outputs)
            attrs = node_attrs(node, self.schemas)
            instr = Instr(kernel.fn, tuple(ins), outs, attrs, node, None, kernel)
            if self.check_kernels:
                instr.expect = expectations(node, dims=static)
            if kernel.context:
                instr.ctx = KernelContext(node, self)
            self.instrs.append(instr)
        self.output_slots = [self._read_slot(v, parent) for v in g.outputs]
        self._plan_frees()
        self.nslots: int = len(self.slot_of)
        #: A run's slots before its inputs: the constants in place (the last slot: omitted
        #: inputs' None); each run copies it.
        self._blank: list[Any] = [None] * (self.nslots + 1)
        for s, t in self.consts:
            self._blank[s] = t
        for instr in self.instrs:
            instr.seal(self.nslots)
        #: The nodes' contexts, whose frame (the run's slots) is dropped after each run.
        self.contexts = tuple(ins.ctx for ins in self.instrs if ins.ctx is not None)

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
        """Free each slot after its last reader; a node reads what its nested graphs read."""
        for ins in self.instrs:
            inner = [
                s
                for g in ins.node.subgraphs()
                for v, s in self.slot_of.items()
                if _reads_inside(g, v)
            ]
            if inner:
                ins.reads = tuple(dict.fromkeys(ins.reads + tuple(inner)))
        keep = set(self.output_slots) | self.external_slots()
        touches = [ins.reads + ins.outs for ins in self.instrs]
        for ins, frees in zip(self.instrs, free_after_last_use(touches, keep)):
            ins.frees = frees

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
        hook: Any = None,
    ) -> list[Any]:
        """Run with ``inputs`` (device tensors, in graph input order); returns outputs.

        Args:
            inputs: Device tensors in graph input order.
            outer: The enclosing program's slots (nested graphs only).
            arena: Planned output views for kernels that accept ``out=``.
            record: Filled with ``slot -> (shape, dtype)`` of every array a kernel returns
                (the sizes a plan for these input shapes needs).
            hook: Called after each instruction of a recorded run
            (``backends/cpu/replay/record.py``).
        """
        slots = self._frame(inputs, outer)
        run = Run(self, arena, record, hook)
        try:
            run_instrs(self, slots, run)
        except BaseException:
            self._drop(slots)
            raise
        finally:
            for ctx in self.contexts:  # not held past the run: its outputs, inputs, all
                ctx._frame = None
        if run.track and run.peak > self.peak:
            self.peak = run.peak
        outs = [slots[s] for s in self.output_slots]
        base = run.base
        if base is not None:
            outs = [o.copy() if type(o) is np.ndarray and o.base is base else o for o in outs]
        return outs

    def _frame(self, inputs: Sequence[Any], outer: list[Any] | None) -> list[Any]:
        """The slots of one run: constants, captured outer values, then the inputs."""
        slots = self._blank.copy()
        if self.captures:
            assert outer is not None, "a nested graph's program runs in its parent's frame"
            for ps, s in self.captures:
                slots[s] = outer[ps]
        for s, t in zip(self.input_slots, inputs):
            slots[s] = t
        return slots

    def _release_failed(self, ins: Instr, e: BaseException) -> None:
        """A ``release`` that raised: a ``DeviceError`` naming the backend and node."""
        if isinstance(e, KeyboardInterrupt):
            raise e
        raise DeviceError(
            f"{self.backend.name}: release() of a tensor after node {ins.node.name!r} raised "
            f"{type(e).__name__}: {e}"
        ) from e

    def _drop(self, slots: list[Any]) -> None:
        """Release the device tensors a failed run made (host arrays are left to the GC)."""
        if self._release is None:
            return
        external = self.external_slots()
        mine = [s for s, t in enumerate(slots) if t is not None and s not in external]
        release_quietly(self._release, [slots[s] for s in mine])
        for s in mine:
            slots[s] = None

    def on_error(self, ins: Instr, args: list[Any], exc: BaseException) -> None:
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
        kernel = f"\n  kernel: {kernel_name(ins)}"
        if not isinstance(exc, AnychipError) and (blame := self._foreign_input(ins, shown)):
            raise KernelError(
                f"{where}: {blame}\n  inputs: {describe_args(shown)}{kernel}"
            ) from exc
        if isinstance(exc, AnychipError):
            # Keep the class (OutOfMemoryError, InputError...) and its figures; add the node.
            exc.args = (f"{where}: {exc}\n  inputs: {describe_args(shown)}{kernel}",) + exc.args[1:]
            raise exc
        raise KernelError(
            f"{self.backend.name}: node {ins.node.name!r} ({ins.node.qualified_op}) failed: "
            f"{type(exc).__name__}: {exc}\n  node: {format_node(ins.node).strip()}\n"
            f"  inputs: {describe_args(shown)}{kernel}"
        ) from exc

    def _foreign_input(self, ins: Instr, args: list[Any]) -> str:
        """Where a kernel failed on an input that is no tensor of this device (a host array,
        another runtime's handle), the node and kernel that produced it ("" otherwise). Asked
        on the error path only: it reads each input back with ``to_host``."""
        if self.backend.host_memory:
            return ""
        for i, (v, a) in enumerate(zip(ins.node.inputs, args)):
            if v is None or a is None or isinstance(a, (list, tuple)):
                continue
            if not isinstance(a, (np.ndarray, np.generic)):
                try:
                    self.backend.to_host(a)
                    continue
                except Exception:
                    pass
            producer = next((p for p in self.instrs if v in p.node.outputs), None)
            if producer is None:
                return ""
            kind = f"{type(a).__module__}.{type(a).__qualname__}"
            return (
                f"its input {i} ({v.name!r}) is a {kind}, not a {self.backend.name} tensor: "
                f"kernel {kernel_name(producer)} of node {producer.node.name!r} "
                f"({producer.node.qualified_op}) returned it. A {self.backend.name} kernel "
                "returns the tensors its backend's to_device makes"
            )
        return ""


def _reads_inside(g: Graph, v: Value) -> bool:
    return any(user.graph is not None and _inside(user.graph, g) for user, _ in v.uses)


def _inside(graph: Graph | None, root: Graph) -> bool:
    while graph is not None:
        if graph is root:
            return True
        graph = graph.parent.graph if graph.parent is not None else None
    return False
