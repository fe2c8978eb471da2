"""Small graph-editing helpers shared by rewriting passes (fusions, folds, layout changes).

``Names`` makes fresh value names, ``single_use`` says whether a value may vanish,
``new_node`` builds a replacement that keeps the old node's annotations, ``constant`` adds an
initializer and ``attrs`` builds attributes from Python values. Dead nodes and initializers
left behind are removed with ``EliminateDeadCodePass``.

What fusion passes share (the patterns of ``ir/passes/patterns/`` and the backends' own):
``producer`` and ``reader`` walk one edge, ``kept_axes`` reads a reduction's axes,
``fused_node`` builds the fused node, ``replace_chain`` puts it where its chain was,
``fuse_each`` is a fusion's walk and ``record`` counts its firings in
``graph.meta["fusions"]`` (the placement report shows them per partition).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.passes.base import PassResult
from anychip.ir.value import Value

__all__ = [
    "Names",
    "single_use",
    "scalar_const",
    "new_node",
    "attrs",
    "constant",
    "FLOATS",
    "record",
    "fuse_each",
    "producer",
    "reader",
    "replace_chain",
    "kept_axes",
    "fused_node",
]

#: The element types the fused kernels compute (ONNX FLOAT, DOUBLE).
FLOATS = (1, 11)


class Names:
    """Fresh value names that do not clash with any name already in ``graph``."""

    def __init__(self, graph: Graph) -> None:
        self.used = {v.name for v in graph.values()}

    def fresh(self, stem: str) -> str:
        name, n = stem, 0
        while name in self.used:
            n += 1
            name = f"{stem}_{n}"
        self.used.add(name)
        return name


def single_use(v: Value, graph: Graph) -> bool:
    """True when ``v`` has one reader and is not an output of ``graph`` (so it may vanish)."""
    return len(v.uses) == 1 and v not in graph.outputs


def scalar_const(v: Value | None) -> float | None:
    """The float value of a one-element constant, else None."""
    if v is None or v.const is None or v.const.size != 1 or v.const.dtype.kind != "f":
        return None
    return float(v.const.reshape(-1)[0])


def attrs(**values: Any) -> dict[str, Attr]:
    """Attributes from Python values (ints, floats, strings and lists of ints or floats)."""
    out = {}
    for k, v in values.items():
        if isinstance(v, str):
            out[k] = Attr(k, AttrType.STRING, v)
        elif isinstance(v, float):
            out[k] = Attr(k, AttrType.FLOAT, v)
        elif isinstance(v, int):
            out[k] = Attr(k, AttrType.INT, v)
        elif v and all(isinstance(x, float) for x in v):
            out[k] = Attr(k, AttrType.FLOATS, [float(x) for x in v])
        else:
            out[k] = Attr(k, AttrType.INTS, [int(x) for x in v])
    return out


def new_node(
    like: Node,
    op_type: str,
    inputs: list[Value | None],
    outputs: list[Value],
    attributes: dict[str, Attr],
    *,
    domain: str = "",
    version: int | None = None,
    name: str = "",
) -> Node:
    """A node that inherits ``like``'s name stem and annotations (device, placement)."""
    node = Node(
        op_type,
        inputs,
        outputs,
        domain=domain,
        version=version if version is not None else like.version,
        attributes=attributes,
        name=name or like.name,
    )
    node.meta.update({k: v for k, v in like.meta.items() if k != "since"})
    node.meta["since"] = version if version is not None else like.meta.get("since", like.version)
    return node


def constant(graph: Graph, names: Names, stem: str, array: np.ndarray) -> Value:
    """A new initializer of ``graph`` holding ``array``."""
    return graph.add_initializer(Value(names.fresh(stem), const=np.require(array, None, "C")))


# -- what fusion passes share --------------------------------------------------------------


def record(graph: Graph, name: str, count: int) -> None:
    """Add ``count`` firings of pass ``name`` to ``graph.meta["fusions"]`` (the partition's
    report shows it)."""
    if count:
        fusions = graph.meta.setdefault("fusions", {})
        fusions[name] = fusions.get(name, 0) + count


def fuse_each(
    graph: Graph, op_type: str, fuse: Callable[[Node, Graph], int], name: str
) -> PassResult:
    """A fusion pass's walk: ``fuse(node, graph)`` (how many fusions it made) on each
    default-domain ``op_type`` node of ``graph`` still in it (over a snapshot: fusing removes
    nodes), the firings recorded under ``name``."""
    fired = 0
    for node in list(graph.nodes):
        if node.graph is graph and node.op_type == op_type and not node.domain:
            fired += fuse(node, graph)
    record(graph, name, fired)
    return PassResult(graph, fired > 0)


def producer(v: Value | None, graph: Graph, op_type: str | None = None) -> Node | None:
    """The default-domain node of ``graph`` producing ``v`` (of ``op_type`` when given)."""
    if v is None or v.producer is None or v.producer.graph is not graph:
        return None
    node = v.producer
    if node.domain or (op_type is not None and node.op_type != op_type):
        return None
    return node


def reader(v: Value | None, graph: Graph, op_type: str | None = None) -> Node | None:
    """The default-domain node of ``graph`` that is the one reader of ``v`` (of ``op_type``
    when given); None when ``v`` has other readers or is a graph output."""
    if v is None or not single_use(v, graph):
        return None
    node = v.uses[0][0]
    if node.graph is not graph or node.domain:
        return None
    return node if op_type is None or node.op_type == op_type else None


def replace_chain(graph: Graph, chain: list[Node], fused: Node) -> None:
    """Remove ``chain``'s nodes from ``graph`` and put ``fused`` where the last of them was
    (``chain[-1]`` comes after the others in ``graph``: it reads what they compute)."""
    index = graph.nodes.index(chain[-1])
    for n in reversed(chain):
        graph.remove(n)
    graph.insert(index - len(chain) + 1, fused)


def kept_axes(node: Node) -> list[int] | None:
    """A reduction's axes (its ``axes`` attribute, or its constant second input as from
    opset 18) when it keeps its dimensions (``keepdims=1``), else None."""
    if node.attr("keepdims", 1) != 1:
        return None
    axes = node.attr("axes", None)
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        c = node.inputs[1].const
        axes = None if c is None else [int(a) for a in c.reshape(-1)]
    return None if axes is None else list(axes)


def fused_node(
    like: Node, op_type: str, inputs: list, outputs: list, attributes: dict, **kw: Any
) -> Node:
    """``new_node`` without the kernel placement resolved for ``like`` (the executor looks the
    new op's kernel up)."""
    node = new_node(like, op_type, inputs, outputs, attributes, **kw)
    node.meta.pop("kernel", None)
    return node
