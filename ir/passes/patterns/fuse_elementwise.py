"""``FuseElementwisePass``: a connected group of element-wise nodes becomes one
``anychip::FusedElementwise`` whose ``expr`` is the group's expression (``anychip.codegen``).

A group grows backwards from its last node: a producer joins when it is element-wise (the ops
of ``codegen.onnx_ops.ELEMENTWISE_OPS``), of the same float type, and every reader of its
output is already in the group (and the output is not a graph output), so no intermediate is
needed outside. One-element float constants become literals; other inputs become the fused
node's inputs. A group of one node is fused only when it lowers to three primitives or more
(Gelu, HardSwish, HardSigmoid, LeakyRelu: numpy makes one pass over memory per primitive).
A group stops growing at ``MAX_NODES``: the expression is a tree as deep as the chain, and the
code that prints, parses and emits it recurses (a 1,000-node chain of Add, Mul, Relu, Neg and
Abs failed to load with Python's ``RecursionError``); a longer chain becomes several groups.

The shared pattern ``"elementwise"`` (``ir/passes/patterns``): a backend enables it when its
kernel table runs ``anychip::FusedElementwise`` (the CPU, OpenCL, CUDA, any array-API backend).
"""

from __future__ import annotations

from anychip.codegen.expr import Expr, const, inp
from anychip.codegen.onnx_ops import ELEMENTWISE_OPS, lower
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.patterns import pattern
from anychip.ir.passes.rewrite import FLOATS, attrs, fused_node, record, scalar_const
from anychip.ir.value import Value

__all__ = ["FuseElementwisePass", "MAX_NODES"]

#: Most nodes in one fused group (each lowers to a few primitives, each a level of the tree).
MAX_NODES = 32


def _fusible(node: Node) -> bool:
    if node.domain or node.op_type not in ELEMENTWISE_OPS or len(node.outputs) != 1:
        return False
    y = node.outputs[0]
    if y is None or y.dtype not in FLOATS or not node.inputs or node.inputs[0] is None:
        return False
    return node.inputs[0].dtype == y.dtype


def _group(root: Node, graph: Graph, taken: set[Node], pos: dict[Node, int]) -> list[Node]:
    group = {root}
    changed = True
    while changed:
        changed = False
        for n in list(group):
            for v in n.inputs:
                p = v.producer if v is not None else None
                if p is None or p in group or p in taken or p.graph is not graph:
                    continue
                if len(group) >= MAX_NODES:
                    return sorted(group, key=pos.__getitem__)
                if not _fusible(p) or p.outputs[0].dtype != root.outputs[0].dtype:
                    continue
                if v in graph.outputs or any(u not in group for u, _ in v.uses):
                    continue
                group.add(p)
                changed = True
    return sorted(group, key=pos.__getitem__)


class _Builder:
    """The expression of a group, its leaf values in order."""

    def __init__(self, group: list[Node], dtype: int) -> None:
        self.members = set(group)
        self.dtype = dtype
        self.leaves: list[Value] = []
        self.exprs: dict[Value, Expr] = {}

    def arg(self, v: Value | None) -> Expr | None:
        if v is None:
            return None
        if v in self.exprs:
            return self.exprs[v]
        c = scalar_const(v)
        if c is not None:
            return const(c)
        if v.dtype != self.dtype:
            raise ValueError("mixed types")
        if v not in self.leaves:
            self.leaves.append(v)
        return inp(self.leaves.index(v))

    def node(self, n: Node) -> Expr | None:
        args = [self.arg(v) for v in n.inputs]
        values = {k: a.value for k, a in n.attributes.items()}
        e = lower(n.op_type, args, values)
        if e is not None:
            self.exprs[n.outputs[0]] = e
        return e


def _expression(group: list[Node]) -> tuple[Expr, list[Value]] | None:
    b = _Builder(group, group[-1].outputs[0].dtype)
    try:
        for n in group:
            if b.node(n) is None:
                return None
    except ValueError:
        return None
    return b.exprs[group[-1].outputs[0]], b.leaves


@pattern("elementwise")
class FuseElementwisePass(Pass):
    """Fuse element-wise chains into ``anychip::FusedElementwise`` nodes."""

    name = "fuse_elementwise"
    #: ``anychip.load(..., optimize=False)`` leaves it out.
    optimization = True

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place (one pass over the nodes, then one rebuild of the list,
        so graphs of thousands of nodes stay linear)."""
        taken: set[Node] = set()
        pos = {n: i for i, n in enumerate(graph.nodes)}
        replace: dict[Node, Node] = {}
        for root in reversed(list(graph.nodes)):
            if root in taken or not _fusible(root):
                continue
            group = _group(root, graph, taken, pos)
            taken |= set(group)
            built = _expression(group)
            if built is None or not built[1] or (len(group) == 1 and built[0].size() < 3):
                continue
            expr, leaves = built
            replace[root] = fused_node(
                root,
                "FusedElementwise",
                list(leaves),
                [root.outputs[0]],
                attrs(expr=str(expr)),
                domain="anychip",
                version=1,
                name=f"{root.name}+fused{len(group)}" if root.name else "",
            )
            for n in group:
                n.detach()
                n.graph = None
        if replace:
            kept = [replace.get(n, n) for n in graph.nodes if n.graph is graph or n in replace]
            graph.nodes = []
            for n in kept:
                graph.append(n)
        record(graph, self.name, len(replace))
        return PassResult(graph, bool(replace))
