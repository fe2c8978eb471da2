"""What the CPU's fusion passes share: the fired-count record and small graph checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import PassResult
from anychip.ir.passes.rewrite import FLOATS, new_node, scalar_const, single_use
from anychip.ir.value import Value

__all__ = [
    "record",
    "producer",
    "reader",
    "replace_chain",
    "kept_axes",
    "scalar_const",
    "fused_node",
    "fast_kernel",
    "FLOATS",
]


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
    """``rewrite.new_node`` without the kernel placement resolved for ``like`` (the executor
    looks the new op's kernel up)."""
    node = new_node(like, op_type, inputs, outputs, attributes, **kw)
    node.meta.pop("kernel", None)
    return node


def fast_kernel(domain: str, op_type: str, numpy_fn: Any) -> bool:
    """Whether the CPU's float32 kernel of ``domain::op_type`` is fast: its function says so
    with an attribute ``fast`` (a bool, or a callable answering at compile time, e.g. "oneDNN
    loaded"), else whether it is another function than ``numpy_fn``."""
    from anychip.core.plugin.host import get_registry

    found = get_registry(["cpu"]).kernel_table("cpu").lookup(domain, op_type, 1, DType.FLOAT)
    if found.kernel is None:
        return False
    fast = getattr(found.kernel.fn, "fast", None)
    if fast is not None:
        return bool(fast() if callable(fast) else fast)
    return found.kernel.fn is not numpy_fn
