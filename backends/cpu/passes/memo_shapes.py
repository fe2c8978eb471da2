"""``MemoShapesPass``: the nodes that compute from input *shapes* only become one
``anychip::ShapeMemo`` node, run once per input shape.

Transformer exports with a symbolic sequence length build their position ids and causal masks
at run time: ``Shape -> Gather/Squeeze -> Range -> Unsqueeze -> Expand -> GatherND -> ... ->
Where``, about 45 of the 99 nodes of the tiny GPT-2 export, each a Python dispatch and a small
numpy call. Constant folding cannot touch them (the length is not known at load), but their
results are a function of the partition inputs' shapes alone. The pass takes the forward
closure of ``Shape``/``Size`` of partition inputs over deterministic default-domain nodes
whose other inputs are constants, moves it into the memo node's ``body`` graph (the inputs'
shapes are its key; its outputs are the values read outside it) and the kernel
(``kernels/op_shape_memo.py``) runs the body on a shape it has not seen, and returns the kept
results after. Nothing is folded from a guess: a new shape runs the body again.

Left alone: graphs with nested graphs (their captured reads are not in the use lists), random
and non-tensor ops, closures under ``MIN_NODES`` nodes.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import Names, fused_node, record
from anychip.ir.value import Value

__all__ = ["MemoShapesPass", "MIN_NODES"]

#: Fewer nodes than this in the closure: not worth a memo node.
MIN_NODES = 4

_RANDOM = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)


def _closure(graph: Graph) -> list[Node]:
    """The nodes whose outputs depend on the partition inputs' shapes and constants only, in
    graph order."""
    inputs = {id(v) for v in graph.inputs}
    members: set[int] = set()
    order: list[Node] = []
    for n in graph.nodes:
        if n.domain or n.op_type in _RANDOM or not n.outputs:
            continue
        if any(v is not None and not v.is_tensor for v in n.outputs):
            continue
        if n.op_type in ("Shape", "Size"):
            x = n.inputs[0] if n.inputs else None
            ok = x is not None and (
                id(x) in inputs or x.producer is not None and id(x.producer) in members
            )
        else:
            ok = all(
                v is None or v.is_const or (v.producer is not None and id(v.producer) in members)
                for v in n.inputs
            ) and any(v is not None and not v.is_const for v in n.inputs)
        if ok:
            members.add(id(n))
            order.append(n)
    return order


class MemoShapesPass(Pass):
    """Shape-only subgraphs of a CPU partition → one ``anychip::ShapeMemo`` node."""

    name = "memo_shapes"

    def call(self, graph: Graph) -> PassResult:
        if any(n.subgraphs() for n in graph.nodes):
            return PassResult(graph, False)
        group = _closure(graph)
        if len(group) < MIN_NODES:
            return PassResult(graph, False)
        inside = set(map(id, group))
        names = Names(graph)
        shapes_of = [n for n in group if n.op_type in ("Shape", "Size")]
        sources: list[Value] = []
        for n in shapes_of:
            if n.inputs[0] in graph.inputs and n.inputs[0] not in sources:
                sources.append(n.inputs[0])
        formals = [Value(names.fresh(f"{s.name}_shape_of"), s.dtype, s.shape) for s in sources]
        for n in shapes_of:
            if n.inputs[0] in sources:
                n.replace_input(0, formals[sources.index(n.inputs[0])])
        outer, inner = [], []
        for n in group:
            for i, v in enumerate(n.outputs):
                if v is None or not (
                    v in graph.outputs or any(id(u) not in inside for u, _ in v.uses)
                ):
                    continue
                w = Value(names.fresh(f"{v.name}_memo"), v.dtype, v.shape)
                for u, k in list(v.uses):
                    if id(u) in inside:
                        u.replace_input(k, w)
                n.outputs[i], w.producer, w.index = w, n, i
                outer.append(v)
                inner.append(w)
        if not outer:
            return PassResult(graph, False)
        at = graph.nodes.index(group[0])
        for n in group:
            graph.nodes.remove(n)
        body = Graph(f"{group[0].name or 'shapes'}_memo", formals, inner, group)
        memo = fused_node(
            group[0],
            "ShapeMemo",
            sources,
            outer,
            {"body": Attr("body", AttrType.GRAPH, body)},
            domain="anychip",
            version=1,
            name=f"{group[0].name}+memo{len(group)}" if group[0].name else "",
        )
        graph.insert(at, memo)
        record(graph, self.name, len(group))
        return PassResult(graph, True)
