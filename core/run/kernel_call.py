"""What the executor hands a kernel: its context, its compiled call, and its attributes.

``Instr`` is one compiled node (kernel, slots, attributes, slots to free); ``KernelContext`` is
what a ``context=True`` kernel gets first (the node, its backend, ``run_graph`` for nested
graphs); ``Arena`` the planned memory of one run. ``evaluate_node`` runs one node on host
arrays outside any program (constant folding uses it).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.plugin.kernels import find_kernel
from anychip.errors import KernelError, UnsupportedOpError
from anychip.opsets.schemas import attribute_defaults, resolve

if TYPE_CHECKING:
    from anychip.core.plugin.kernels import Kernel, KernelTable
    from anychip.core.run.program import Program
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.opsets.schemas import SchemaRegistry

__all__ = ["KernelContext", "Instr", "Arena", "describe_args", "node_attrs", "evaluate_node"]


class KernelContext:
    """What a ``context=True`` kernel receives as its first argument.

    Attributes:
        node: the IR node being run.
        num_outputs: how many outputs the node declares (omitted optional ones included).
        outputs_used: for each declared output, whether the node has it (omitted optional:
            False); worked out once, as the node's outputs are fixed once it is compiled.
        backend: the backend running it.
    """

    __slots__ = (
        "node",
        "num_outputs",
        "outputs_used",
        "backend",
        "_program",
        "_frame",
        "_subprograms",
    )

    def __init__(self, node: Node, program: Program | None) -> None:
        self.node = node
        self.num_outputs = len(node.outputs)
        self.outputs_used = [v is not None and bool(v.name) for v in node.outputs]
        self.backend = program.backend if program is not None else None
        self._program = program
        self._frame: list[Any] | None = None
        self._subprograms: dict[int, Program] = {}
        if program is None:
            return
        from anychip.core.run.program import Program  # a nested graph is a program of its own

        for g in node.subgraphs():
            self._subprograms[id(g)] = Program(
                g, program.backend, program.table, program.schemas, parent=program
            )

    def program(self, graph: Graph) -> Program:
        """The compiled program of a nested graph of this node: its ``instrs`` hold each inner
        node's kernel, context and attributes as the executor calls them."""
        prog = self._subprograms.get(id(graph))
        if prog is None:
            raise KernelError(
                f"graph {graph.name!r} is not an attribute of node {self.node.name!r}"
            )
        return prog

    def run_graph(self, graph: Graph, inputs: Sequence[Any]) -> list[Any]:
        """Run a nested graph of this node with its formal inputs bound to ``inputs``.

        Values the nested graph reads from enclosing scopes are taken from the running frame.
        """
        return self.program(graph).run(inputs, outer=self._frame)


class Instr:
    """One compiled node. ``reads`` adds the slots its nested graphs read to ``ins``;
    ``takes_out``: the kernel accepts ``out=`` (see the module docstring)."""

    __slots__ = (
        "fn",
        "ins",
        "outs",
        "attrs",
        "frees",
        "node",
        "ctx",
        "reads",
        "takes_out",
        "inplace",
        "alias",
        "expect",
        "args",
        "out0",
        "want",
    )

    def __init__(
        self,
        fn: Any,
        ins: tuple[int, ...],
        outs: tuple[int, ...],
        attrs: dict[str, Any],
        node: Node,
        ctx: KernelContext | None,
        kernel: Kernel | None = None,
    ) -> None:
        self.fn = fn
        #: The kernel's declared memory facts (``@kernel(..., inplace=True / alias=True)``).
        self.inplace = bool(kernel is not None and kernel.inplace)
        self.alias = bool(kernel is not None and kernel.alias)
        #: Per output, the (numpy dtype, shape) inference declared, for checked kernels
        #: (``core/run/checks.py``); None when nothing is known or checks are off.
        self.expect: tuple | None = None
        self.ins = ins
        self.outs = outs
        self.attrs = attrs
        self.frees: tuple[int, ...] = ()
        self.node = node
        self.ctx = ctx
        self.reads: tuple[int, ...] = tuple(i for i in ins if i >= 0)
        # Only single-output kernels are handed an ``out`` view, and not for small outputs.
        self.takes_out = (
            len(outs) == 1 and outs[0] >= 0 and _takes_out(fn) and not _small_output(node)
        )
        self.seal(-1)

    def seal(self, none_slot: int) -> None:
        """Resolve what the dispatch loop (``core/run/dispatch.py``) reads: ``args``, the argument
        slots (an omitted input reads ``none_slot``, a slot that stays None); ``out0``, the
        output slot of a node with exactly one (else -1); ``want``, output 0's declared
        ``(dtype, shape or None, rank)`` (None: nothing to check). Called once compiled."""
        self.args = tuple(none_slot if i < 0 else i for i in self.ins)
        self.out0 = self.outs[0] if len(self.outs) == 1 else -1
        want = self.expect[0] if self.expect is not None and len(self.outs) == 1 else None
        self.want = None if want is None else (want[0], want[2], want[3])


class Arena:
    """The planned memory of one run: ``views[slot]`` is the array a kernel may write slot's
    value into (None: not planned); ``base`` the array owning them; ``nbytes`` its size."""

    __slots__ = ("views", "base", "nbytes")

    def __init__(self, views: list[Any], base: np.ndarray | None, nbytes: int) -> None:
        self.views = views
        self.base = base
        self.nbytes = nbytes


#: Outputs of fewer bytes than this (static shapes) are not handed a planned ``out`` view:
#: there the out protocol's checks cost more than numpy's own small allocation (measured on the
#: CPU kernels, 16 B to 1 KiB: Add 2.0 against 0.6 µs, Relu 1.3 against 0.95 µs), and the
#: arena gains nothing. They are still in the memory plan's figures and counted when held.
MIN_OUT_BYTES = 1024

_TAKES_OUT: dict[Any, bool] = {}


def _small_output(node: Node) -> bool:
    v = node.outputs[0] if node.outputs else None
    nbytes = v.nbytes if v is not None else None
    return nbytes is not None and nbytes < MIN_OUT_BYTES


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
    """``(float32[2, 3], _, int)``: the dtype and shape of each argument, for error messages."""
    parts = []
    for a in args:
        if a is None:
            parts.append("_")
        elif hasattr(a, "dtype") and hasattr(a, "shape"):
            parts.append(f"{a.dtype}{list(a.shape)}")
        else:
            parts.append(type(a).__name__)
    return "(" + ", ".join(parts) + ")"


def node_attrs(node: Node, schemas: SchemaRegistry | None) -> dict[str, Any]:
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
    res = kernel.fn(*args, **node_attrs(node, schemas))
    if type(res) is not tuple and type(res) is not list:
        res = [res]
    return [np.asarray(r) if isinstance(r, np.generic) else r for r in res]
