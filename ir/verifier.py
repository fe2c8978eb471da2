"""``verify_graph``: checks the IR invariants stated in ``Value``, ``Node`` and ``Graph``.

Called by tests after every transform, and by the session after passes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anychip.errors import GraphError

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["verify_graph"]


def verify_graph(graph: Graph, outer: set[int] | None = None) -> None:
    """Raise ``GraphError`` naming the first broken invariant of ``graph`` (and its subgraphs).

    ``outer`` holds the ids of values visible from enclosing scopes.
    """
    visible: set[int] = set(outer or ())
    use_sets: dict[int, set[tuple[Node, int]]] = {}
    names: dict[str, Value] = {}

    def define(v: Value, what: str) -> None:
        prev = names.get(v.name)
        if prev is not None and prev is not v and v.name:
            raise GraphError(
                f"graph {graph.name!r}: value name {v.name!r} is defined twice ({what})"
            )
        names[v.name] = v
        visible.add(id(v))

    for v in graph.inputs:
        define(v, "graph input")
    for name, v in graph.initializers.items():
        if v.const is None:
            raise GraphError(f"graph {graph.name!r}: initializer {name!r} has no data")
        if name != v.name:
            raise GraphError(f"graph {graph.name!r}: initializer key {name!r} != {v.name!r}")
        define(v, "initializer")
    for node in graph.nodes:
        if node.graph is not graph:
            raise GraphError(
                f"node {node.name or node.op_type!r} does not point back at graph {graph.name!r}"
            )
        _check_inputs(graph, node, visible, use_sets)
        for sub in node.subgraphs():
            if sub.parent is not node:
                raise GraphError(f"subgraph {sub.name!r} does not point back at its node")
            verify_graph(sub, visible)
        for i, v in enumerate(node.outputs):
            if v is None:
                continue
            if v.producer is not node or v.index != i:
                raise GraphError(
                    f"%{v.name} does not name node {node.name or node.op_type!r} "
                    f"output {i} as its producer"
                )
            define(v, f"output of {node.name or node.op_type}")
    for v in graph.outputs:
        if id(v) not in visible:
            raise GraphError(f"graph {graph.name!r} output %{v.name} is never defined")
    for v in list(names.values()):
        for user, i in v.uses:
            if i >= len(user.inputs) or user.inputs[i] is not v:
                raise GraphError(f"%{v.name} lists a stale use by {user.op_type} input {i}")


def _check_inputs(
    graph: Graph, node: Node, visible: set[int], use_sets: dict[int, set[tuple[Node, int]]]
) -> None:
    """Each input of ``node`` is defined before it and lists the node among its uses (a
    value with many uses is looked up in a set, made once: a node reading one value 50,000
    times made the list scans quadratic, 30 s to load, issue 47)."""
    for i, v in enumerate(node.inputs):
        if v is None:
            continue
        if id(v) not in visible:
            raise GraphError(
                f"node {node.name or node.op_type!r} input {i} reads %{v.name} before it is "
                f"defined (graph {graph.name!r} is not in topological order, or the value "
                "is dangling)"
            )
        uses: Any = v.uses
        if len(uses) > 16:
            uses = use_sets.get(id(v))
            if uses is None:
                uses = use_sets[id(v)] = set(v.uses)
        if (node, i) not in uses:
            raise GraphError(
                f"%{v.name} does not list node {node.name or node.op_type!r} "
                f"input {i} among its uses"
            )
