"""A readable text form of graphs, one node per line.

Example::

    graph main (%x: f32[1,3]) -> (%y: f32[1,3]) {
      %y = Relu(%x)   # relu_0 @cpu
    }
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anychip.ir.node import Attr, AttrType

if TYPE_CHECKING:
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["format_graph", "format_node"]


def _attr_str(a: Attr, indent: str) -> str:
    if a.type in (AttrType.GRAPH, AttrType.GRAPHS):
        graphs = [a.value] if a.type == AttrType.GRAPH else a.value
        return "\n".join(format_graph(g, indent + "    ") for g in graphs).lstrip()
    v = a.value
    if isinstance(v, np.ndarray):
        if v.size <= 4:
            return f"tensor({v.dtype}{list(v.shape)}: {v.ravel().tolist()})"
        return f"tensor({v.dtype}{list(v.shape)})"
    return repr(v)


def format_node(node: Node, indent: str = "") -> str:
    outs = ", ".join("%" + v.name if v is not None else "_" for v in node.outputs)
    ins = ", ".join("%" + v.name if v is not None else "_" for v in node.inputs)
    attrs = ""
    if node.attributes:
        attrs = (
            " {"
            + ", ".join(f"{k}={_attr_str(a, indent)}" for k, a in sorted(node.attributes.items()))
            + "}"
        )
    where = ""
    if node.name:
        where += " " + node.name
    if "device" in node.meta:
        where += " @" + str(node.meta["device"])
    comment = f"   #{where}" if where else ""
    return f"{indent}{outs} = {node.qualified_op}({ins}){attrs}{comment}"


def format_graph(graph: Graph, indent: str = "") -> str:
    ins = ", ".join(f"%{v.name}: {v.type_str()}" for v in graph.inputs)
    outs = ", ".join(f"%{v.name}: {v.type_str()}" for v in graph.outputs)
    lines = [f"{indent}graph {graph.name} ({ins}) -> ({outs}) {{"]
    for name, v in graph.initializers.items():
        lines.append(f"{indent}  %{name}: {v.type_str()} = initializer")
    for n in graph.nodes:
        lines.append(format_node(n, indent + "  "))
    lines.append(indent + "}")
    return "\n".join(lines)
