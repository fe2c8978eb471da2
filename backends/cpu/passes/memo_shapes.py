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

``MemoShapesPass(values=True)`` runs again after the fusions (which match the shape nodes as
exports write them) and takes ``Shape``/``Size`` of any value, not only of the partition's
inputs: an export's attention heads are split by ``Reshape(x, Concat(Unsqueeze(Gather(
Shape(x), i)), ..))`` of each layer's intermediate ``x``, five such groups of ten nodes in
onnxruntime's ``gpt2_one_layer``. Each connected group becomes its own memo node, which takes
the arrays it reads the shapes of as inputs (its key is still their shapes), placed after
them and before the first node that reads its results; a group that cannot be so placed (a
source computed after one of its results is read) is left as it is.

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


def _closure(graph: Graph, values: bool = False) -> list[Node]:
    """The nodes whose outputs depend on the partition inputs' shapes (any value's shape with
    ``values``) and constants only, in graph order."""
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
                id(x) in inputs
                or (x.producer is not None and id(x.producer) in members)
                or (values and not x.is_const and x.is_tensor)
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


def _groups(group: list[Node]) -> list[list[Node]]:
    """``group`` split into its connected parts (by the values its members pass each other),
    each in graph order."""
    inside = {id(n): n for n in group}
    parent = {id(n): id(n) for n in group}

    def root(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    for n in group:
        for v in n.inputs:
            if v is not None and v.producer is not None and id(v.producer) in inside:
                parent[root(id(n))] = root(id(v.producer))
    parts: dict[int, list[Node]] = {}
    for n in group:
        parts.setdefault(root(id(n)), []).append(n)
    return list(parts.values())


def _memoize(graph: Graph, group: list[Node], names: Names, name: str) -> bool:
    """``group`` (shape-only, in graph order) as one ShapeMemo node; False when it has no
    result read outside it or cannot be placed after its sources and before its readers."""
    inside = set(map(id, group))
    shapes_of = [n for n in group if n.op_type in ("Shape", "Size")]
    sources: list[Value] = []
    for n in shapes_of:
        x = n.inputs[0]
        if (x.producer is None or id(x.producer) not in inside) and x not in sources:
            sources.append(x)
    results = [
        v
        for n in group
        for v in n.outputs
        if v is not None and (v in graph.outputs or any(id(u) not in inside for u, _ in v.uses))
    ]
    if not results:
        return False
    position = {id(n): i for i, n in enumerate(graph.nodes)}
    after = max((position[id(s.producer)] for s in sources if s.producer is not None), default=-1)
    readers = [position[id(u)] for v in results for u, _ in v.uses if id(u) not in inside]
    before = min(readers, default=len(graph.nodes))
    if after >= before:
        return False
    formals = [Value(names.fresh(f"{s.name}_shape_of"), s.dtype, s.shape) for s in sources]
    for n in shapes_of:
        if n.inputs[0] in sources:
            n.replace_input(0, formals[sources.index(n.inputs[0])])
    read_outside = set(map(id, results))
    outer, inner = [], []
    for n in group:
        for i, v in enumerate(n.outputs):
            if v is None or id(v) not in read_outside:
                continue
            w = Value(names.fresh(f"{v.name}_memo"), v.dtype, v.shape)
            for u, k in list(v.uses):
                if id(u) in inside:
                    u.replace_input(k, w)
            n.outputs[i], w.producer, w.index = w, n, i
            outer.append(v)
            inner.append(w)
    first_reader = graph.nodes[before] if before < len(graph.nodes) else None
    for n in group:
        graph.nodes.remove(n)
    at = len(graph.nodes) if first_reader is None else graph.nodes.index(first_reader)
    # Not before the sources (a result read only by graph outputs: the end).
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
    record(graph, name, len(group))
    return True


class MemoShapesPass(Pass):
    """Shape-only subgraphs of a CPU partition → ``anychip::ShapeMemo`` nodes: one for the
    partition inputs' shapes; with ``values``, one per connected group over any values'."""

    name = "memo_shapes"

    def __init__(self, values: bool = False) -> None:
        self.values = values
        if values:
            self.name = "memo_value_shapes"

    def call(self, graph: Graph) -> PassResult:
        if any(n.subgraphs() and n.op_type != "ShapeMemo" for n in graph.nodes):
            return PassResult(graph, False)  # a memo's body reads only its own inputs
        group = _closure(graph, self.values)
        if len(group) < MIN_NODES:
            return PassResult(graph, False)
        names = Names(graph)
        parts = _groups(group) if self.values else [group]
        changed = False
        for part in parts:
            if len(part) >= MIN_NODES:
                changed = _memoize(graph, part, names, self.name) or changed
        return PassResult(graph, changed)
