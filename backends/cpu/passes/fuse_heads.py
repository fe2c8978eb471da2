"""``FuseHeadsPass``: the multi-head split and merge around an ``anychip::FusedAttention``
become one ``anychip::HeadsAttention``, and the three projections that feed it one product::

    q = Transpose(Reshape(Q, sq), [0, 2, 1, 3])     # Transpose or anychip::TransposeView
    kt = Transpose(Reshape(K, sk), [0, 2, 3, 1])
    v = Transpose(Reshape(V, sv), [0, 2, 1, 3])
    Y = Reshape(Transpose(FusedAttention(q, kt, v[, mask]), [0, 2, 1, 3]), so)
      -> Y = HeadsAttention(Q, K, V, sq, sk, sv, so[, mask])

The shapes stay inputs (the exporters compute them from the input's shape at run time), so
the kernel (``kernels/op_heads_attention.py``) runs the same Reshapes and permutations, as
views, and no graph rewrite rests on a shape inferred at compile time. Nine nodes become one;
each was a dispatch of 1-3 us and two were copies (the tiny BERT: 18 nodes of 44 go).

When ``Q``, ``K`` and ``V`` are each the one output of ``anychip::MatMulAdd`` (or ``MatMul``)
of the same input by constant 2-D weights (and biases) read nowhere else, the three become
one product by the weights side by side and a ``Split`` of its last axis, as onnxruntime's
attention fusion packs them: one sgemm of width 3N for three of width N (the tiny BERT's
32-wide projections: three of 8-12 us each became one of 13-16, ``bench/node_gaps.py``).
GPT-2 exports already have one product and a Split.

Fires where every intermediate has one reader and is not a graph output.
"""

from __future__ import annotations

import numpy as np

from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph
from anychip.ir.node import Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    Names,
    attrs,
    constant,
    fused_node,
    new_node,
    reader,
    record,
    single_use,
)
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseHeadsPass"]

_HEADS = [0, 2, 1, 3]
_KEYS = [0, 2, 3, 1]


class FuseHeadsPass(Pass):
    """Fold the heads' Reshapes and Transposes into ``anychip::HeadsAttention``."""

    name = "fuse_heads"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        fired, names = 0, None
        for node in list(graph.nodes):
            if node.graph is not graph or node.op_type != "FusedAttention":
                continue
            if node.domain != ANYCHIP_DOMAIN:
                continue
            heads = _fuse(node, graph)
            if heads is None:
                continue
            fired += 1
            names = names or Names(graph)
            _pack(heads, graph, names)
            _absorb_split(heads, graph)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)


def _fuse(fa: Node, graph: Graph) -> Node | None:
    """``fa`` and the nodes around it as one HeadsAttention (in the graph), else None."""
    splits = []
    for i, perm in ((0, _HEADS), (1, _KEYS), (2, _HEADS)):
        found = _split_heads(fa.inputs[i], graph, perm)
        if found is None:
            return None
        splits.append(found)
    y = fa.outputs[0]
    merge = reader(y, graph, "Transpose")
    if merge is None or not _is_transpose(merge, _HEADS):
        return None
    flat = reader(merge.outputs[0], graph)
    if flat is None or not _is_reshape(flat):
        return None
    mask = fa.inputs[3] if len(fa.inputs) > 3 else None
    inputs = [r.inputs[0] for r, _ in splits] + [r.inputs[1] for r, _ in splits]
    inputs += [flat.inputs[1]] + ([mask] if mask is not None else [])
    zeros = [int(r.attr("allowzero", 0)) for r, _ in splits] + [int(flat.attr("allowzero", 0))]
    a = attrs(scale=float(fa.attr("scale")), divide=int(fa.attr("divide", 1)), allowzero=zeros)
    heads = fused_node(
        fa, "HeadsAttention", inputs, [flat.outputs[0]], a, domain=ANYCHIP_DOMAIN, version=1
    )
    index = graph.nodes.index(flat)
    chain = [n for pair in splits for n in pair] + [fa, merge, flat]
    for n in chain:
        graph.remove(n)
    graph.insert(index - len(chain) + 1, heads)
    return heads


def _split_heads(v: Value | None, graph: Graph, perm: list[int]) -> tuple[Node, Node] | None:
    """(Reshape, Transpose) making ``v`` from one tensor by ``perm``, each read once."""
    t = _made_once(v, graph)
    if t is None or not _is_transpose(t, perm):
        return None
    r = _made_once(t.inputs[0], graph)
    if r is None or not _is_reshape(r):
        return None
    return r, t


def _made_once(v: Value | None, graph: Graph) -> Node | None:
    """The node of ``graph`` making ``v`` when ``v`` has one reader and is not an output."""
    if v is None or v.producer is None or v.producer.graph is not graph:
        return None
    return v.producer if single_use(v, graph) else None


def _is_transpose(node: Node, perm: list[int]) -> bool:
    plain = node.op_type == "Transpose" and not node.domain
    view = node.op_type == "TransposeView" and node.domain == ANYCHIP_DOMAIN
    return (plain or view) and [int(p) for p in node.attr("perm", None) or ()] == perm


def _is_reshape(node: Node) -> bool:
    """An opset-5+ Reshape (its target shape an input)."""
    return (
        node.op_type == "Reshape"
        and not node.domain
        and len(node.inputs) == 2
        and node.inputs[1] is not None
    )


def _pack(heads: Node, graph: Graph, names: Names) -> None:
    """Q, K and V's three products by constant weights as one product, read by ``heads`` in
    three parts (its ``split`` and ``parts``: no Split node)."""
    projections = [_projection(heads.inputs[i], graph) for i in range(3)]
    if any(p is None for p in projections):
        return
    first = projections[0]
    x, kind = first.inputs[0], first.op_type
    if len({id(p) for p in projections}) != 3 or x is None or len(x.shape or ()) < 2:
        return
    weights = [p.inputs[1].const for p in projections]
    if any(p.op_type != kind or p.inputs[0] is not x for p in projections):
        return
    if len({(w.shape[0], w.dtype) for w in weights}) != 1:
        return
    if DType.from_numpy(weights[0].dtype) != x.dtype:
        return
    widths = [int(w.shape[1]) for w in weights]
    stem = first.name or "qkv"
    ins = [x, constant(graph, names, f"{stem}_qkv_weight", np.concatenate(weights, axis=1))]
    if kind == "MatMulAdd":
        biases = [p.inputs[2].const.reshape(-1) for p in projections]
        ins.append(constant(graph, names, f"{stem}_qkv_bias", np.concatenate(biases)))
    shape = None if x.shape is None else tuple(x.shape[:-1]) + (sum(widths),)
    packed = Value(names.fresh(f"{stem}_qkv"), projections[0].outputs[0].dtype, shape)
    product = new_node(first, kind, ins, [packed], {}, domain=first.domain, version=first.version)
    product.meta.pop("kernel", None)
    index = min(graph.nodes.index(p) for p in projections)
    for p in projections:
        graph.remove(p)
    graph.insert(index, product)
    _read_parts(heads, packed, widths, [0, 1, 2])


def _absorb_split(heads: Node, graph: Graph) -> None:
    """Q, K and V as the three parts of one Split of the last axis (a GPT-2 export's packed
    projection), read by ``heads`` itself: the Split goes."""
    split = _made_once(heads.inputs[0], graph)
    if split is None or split.op_type != "Split" or split.domain or len(split.outputs) != 3:
        return
    order = [next((j for j, o in enumerate(split.outputs) if o is v), -1) for v in heads.inputs[:3]]
    if sorted(order) != [0, 1, 2] or any(not single_use(o, graph) for o in split.outputs):
        return
    x = split.inputs[0]
    rank = len(x.shape) if x is not None and x.shape is not None else None
    axis = int(split.attr("axis", 0))
    if rank is None or axis not in (-1, rank - 1):
        return
    sizes = split.attr("split", None)
    if len(split.inputs) > 1 and split.inputs[1] is not None:
        if split.inputs[1].const is None:
            return
        sizes = split.inputs[1].const.reshape(-1).tolist()
    graph.remove(split)
    _read_parts(heads, x, [int(s) for s in sizes or ()], order)


def _read_parts(heads: Node, packed: Value, sizes: list[int], order: list[int]) -> None:
    """``heads`` reads Q, K and V as parts ``order`` of ``packed``'s last axis, cut as a
    Split by ``sizes`` (none: three equal parts) cuts them."""
    for i in range(3):
        heads.replace_input(i, packed)
    heads.attributes.update(attrs(split=sizes, parts=[3] + order))


def _projection(v: Value | None, graph: Graph) -> Node | None:
    """The MatMulAdd or MatMul by constant 2-D weights (a constant bias of their width)
    making ``v``, its one reader a HeadsAttention."""
    node = _made_once(v, graph)
    if node is None or len(node.outputs) != 1 or len(node.inputs) < 2:
        return None
    if node.inputs[1] is None or len(node.inputs[1].uses) != 1:  # weights read elsewhere
        return None
    if node.op_type == "MatMulAdd" and node.domain == ANYCHIP_DOMAIN:
        w, b = node.inputs[1], node.inputs[2]
        if b is None or b.const is None or w.const is None or w.const.ndim != 2:
            return None
        return node if b.const.size == w.const.shape[1] and b.const.dtype == w.const.dtype else None
    if node.op_type == "MatMul" and not node.domain:
        w = node.inputs[1]
        return node if w is not None and w.const is not None and w.const.ndim == 2 else None
    return None
