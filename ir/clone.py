"""Copying nodes into a new standalone graph (used to give each partition its own graph).

Invariants:
    * The original graph is never modified.
    * ``value_map`` maps original values to their copies; values read but not in the map are
      either constants (copied as initializers of the new root graph, sharing the array) or an
      error (the caller forgot a boundary input).
"""

from __future__ import annotations

from collections.abc import Iterable

from anychip.errors import GraphError
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.value import Value

__all__ = ["extract_graph", "copy_value", "copy_model"]


def copy_value(v: Value, name: str | None = None) -> Value:
    """A new value with the same name, type and constant data (shared, not copied)."""
    nv = Value(
        v.name if name is None else name, v.dtype, v.shape, const=v.const, type_proto=v.type_proto
    )
    nv.meta.update(v.meta)
    return nv


def extract_graph(
    name: str, nodes: Iterable[Node], inputs: Iterable[Value], outputs: Iterable[Value]
) -> tuple[Graph, dict[Value, Value]]:
    """A new graph holding copies of ``nodes`` with ``inputs`` as its formal inputs.

    Returns the graph and the map from original to copied values.
    """
    root = Graph(name)
    vmap: dict[Value, Value] = {}
    for v in inputs:
        nv = copy_value(v)
        nv.const = None
        vmap[v] = nv
        root.inputs.append(nv)
    for n in nodes:
        root.append(_copy_node(n, vmap, root))
    for v in outputs:
        if v not in vmap:
            _lookup(v, vmap, root)
        root.outputs.append(vmap[v])
    return root, vmap


def _lookup(v: Value, vmap: dict[Value, Value], root: Graph) -> Value:
    got = vmap.get(v)
    if got is not None:
        return got
    if v.const is not None:
        nv = copy_value(v)
        root.add_initializer(nv)
        vmap[v] = nv
        return nv
    raise GraphError(
        f"extracting graph {root.name!r}: %{v.name} is read but neither an input "
        "nor a constant of the extracted graph"
    )


def _copy_node(n: Node, vmap: dict[Value, Value], root: Graph) -> Node:
    ins = [None if v is None else _lookup(v, vmap, root) for v in n.inputs]
    outs = []
    for v in n.outputs:
        if v is None:
            outs.append(None)
        else:
            nv = copy_value(v)
            vmap[v] = nv
            outs.append(nv)
    attrs = {}
    for k, a in n.attributes.items():
        if a.type == AttrType.GRAPH:
            attrs[k] = Attr(k, a.type, _copy_subgraph(a.value, vmap, root))
        elif a.type == AttrType.GRAPHS:
            attrs[k] = Attr(k, a.type, [_copy_subgraph(g, vmap, root) for g in a.value])
        else:
            attrs[k] = Attr(k, a.type, a.value)
    new = Node(
        n.op_type, ins, outs, domain=n.domain, version=n.version, attributes=attrs, name=n.name
    )
    new.meta.update(n.meta)
    new.doc = n.doc
    return new


def _copy_subgraph(g: Graph, vmap: dict[Value, Value], root: Graph) -> Graph:
    ng = Graph(g.name)
    for v in g.inputs:
        nv = copy_value(v)
        nv.const = None
        vmap[v] = nv
        ng.inputs.append(nv)
    for k, v in g.initializers.items():
        nv = copy_value(v)
        vmap[v] = nv
        ng.initializers[k] = nv
    for n in g.nodes:
        ng.append(_copy_node(n, vmap, root))
    for v in g.outputs:
        ng.outputs.append(_lookup(v, vmap, root))
    ng.meta.update(g.meta)
    return ng


def copy_model(model: Model) -> Model:
    """A model whose graph, nodes and values are new objects; constant arrays are shared.

    Compilation rewrites graphs in place (folding, placement marks), so ``anychip.load``
    compiles a copy and the caller's model stays as it was. Inputs keep their default
    (an initializer listed among the inputs).
    """
    g = model.graph
    root = Graph(g.name)
    root.doc = g.doc
    root.meta.update(g.meta)
    vmap: dict[Value, Value] = {}
    for v in g.inputs:
        nv = copy_value(v)
        vmap[v] = nv
        root.inputs.append(nv)
        if v.const is not None and g.initializers.get(v.name) is v:
            root.initializers[v.name] = nv
    for v in g.initializers.values():
        if v not in vmap:
            _lookup(v, vmap, root)  # adds the copy to root's initializers
    for n in g.nodes:
        root.append(_copy_node(n, vmap, root))
    for v in g.outputs:
        root.outputs.append(_lookup(v, vmap, root))
    new = Model(root, model.opset_imports, ir_version=model.ir_version)
    for attr in ("producer_name", "producer_version", "domain", "model_version", "doc", "path"):
        setattr(new, attr, getattr(model, attr))
    new.metadata = dict(model.metadata)
    new.meta = dict(model.meta)
    return new
