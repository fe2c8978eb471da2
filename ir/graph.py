"""``Graph``: an ordered list of nodes with named inputs, outputs and initializers.

Ownership and invariants:
    * ``nodes`` is kept in topological order: a node appears after the producers of all its
      inputs. Transforms that break the order call ``sort()``; ``verify()`` checks it.
    * ``initializers`` maps names to constant values (``value.const`` is set). An initializer
      may also be listed in ``inputs`` (old ONNX models do this: a feed then overrides it).
    * A nested graph (If branch, Loop/Scan body) has ``parent`` set to the owning node and may
      read values of enclosing graphs directly; those captured values are not in its inputs.
    * Value names are unique within a graph and its nested graphs, as in ONNX.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from anychip.ir.node import Node
from anychip.ir.value import Value

if TYPE_CHECKING:
    pass

__all__ = ["Graph", "Model"]


class Graph:
    """A dataflow graph of ``Node`` objects."""

    __slots__ = ("name", "inputs", "outputs", "nodes", "initializers", "parent", "meta", "doc")

    def __init__(
        self,
        name: str = "main",
        inputs: list[Value] | None = None,
        outputs: list[Value] | None = None,
        nodes: list[Node] | None = None,
        initializers: dict[str, Value] | None = None,
    ) -> None:
        self.name = name
        self.inputs: list[Value] = list(inputs or [])
        self.outputs: list[Value] = list(outputs or [])
        self.nodes: list[Node] = []
        self.initializers: dict[str, Value] = dict(initializers or {})
        self.parent: Node | None = None
        self.meta: dict[str, Any] = {}
        self.doc = ""
        for n in nodes or []:
            self.append(n)

    # -- editing -------------------------------------------------------------------------
    def append(self, node: Node) -> Node:
        node.graph = self
        self.nodes.append(node)
        return node

    def insert(self, index: int, node: Node) -> Node:
        node.graph = self
        self.nodes.insert(index, node)
        return node

    def remove(self, node: Node) -> None:
        """Remove ``node``; its outputs must have no remaining uses."""
        node.detach()
        self.nodes.remove(node)
        node.graph = None

    def add_initializer(self, value: Value) -> Value:
        self.initializers[value.name] = value
        return value

    # -- queries -------------------------------------------------------------------------
    def values(self) -> Iterator[Value]:
        """Every value defined in this graph (inputs, initializers, node outputs)."""
        seen: set[int] = set()
        for v in self.inputs:
            seen.add(id(v))
            yield v
        for v in self.initializers.values():
            if id(v) not in seen:
                yield v
        for n in self.nodes:
            for v in n.outputs:
                if v is not None:
                    yield v

    def walk(self) -> Iterator[Node]:
        """Every node of this graph and of its nested graphs, parents first."""
        for n in self.nodes:
            yield n
            for g in n.subgraphs():
                yield from g.walk()

    def subgraph_depth(self) -> int:
        depth, g = 0, self
        while g.parent is not None and g.parent.graph is not None:
            depth += 1
            g = g.parent.graph
        return depth

    # -- order ---------------------------------------------------------------------------
    def sort(self) -> None:
        """Order ``nodes`` topologically (stable: keeps the current order where it can)."""
        position = {id(n): i for i, n in enumerate(self.nodes)}
        mine = set(position)
        indeg: dict[int, int] = {}
        users: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            deps = {id(p) for p in _local_producers(n, mine)}
            indeg[id(n)] = len(deps)
            for d in deps:
                users[d].append(n)
        import heapq

        ready = [(position[id(n)], n) for n in self.nodes if indeg[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, n = heapq.heappop(ready)
            order.append(n)
            for u in users[id(n)]:
                indeg[id(u)] -= 1
                if indeg[id(u)] == 0:
                    heapq.heappush(ready, (position[id(u)], u))
        if len(order) != len(self.nodes):
            from anychip.errors import GraphError

            stuck = [n for n in self.nodes if indeg[id(n)] > 0][:3]
            raise GraphError(f"graph {self.name!r} has a cycle through {stuck}")
        self.nodes = order

    def verify(self) -> None:
        """Check the invariants above; raises ``GraphError`` naming the first broken one."""
        from anychip.ir.verifier import verify_graph

        verify_graph(self)

    def __str__(self) -> str:
        from anychip.ir.printer import format_graph

        return format_graph(self)

    def __repr__(self) -> str:
        return f"Graph({self.name!r}, {len(self.nodes)} nodes)"


def _local_producers(node: Node, mine: set[int]) -> Iterator[Node]:
    """Producers in this graph of everything ``node`` reads, including via nested graphs."""
    for v in node.inputs:
        if v is not None and v.producer is not None and id(v.producer) in mine:
            yield v.producer
    for g in node.subgraphs():
        for inner in g.walk():
            for v in inner.inputs:
                if v is not None and v.producer is not None and id(v.producer) in mine:
                    yield v.producer


class Model:
    """A graph with the operator-set imports and metadata of the file it came from."""

    __slots__ = (
        "graph",
        "opset_imports",
        "ir_version",
        "producer_name",
        "producer_version",
        "domain",
        "model_version",
        "doc",
        "metadata",
        "meta",
        "path",
    )

    def __init__(
        self, graph: Graph, opset_imports: dict[str, int] | None = None, *, ir_version: int = 10
    ) -> None:
        self.graph = graph
        self.opset_imports: dict[str, int] = dict(opset_imports or {"": 21})
        self.ir_version = ir_version
        self.producer_name = "anychip"
        self.producer_version = ""
        self.domain = ""
        self.model_version = 0
        self.doc = ""
        self.metadata: dict[str, str] = {}
        self.meta: dict[str, Any] = {}
        self.path: str | None = None

    def __str__(self) -> str:
        opsets = ", ".join(f"{d or 'ai.onnx'}={v}" for d, v in self.opset_imports.items())
        return f"# opsets: {opsets}\n{self.graph}"
