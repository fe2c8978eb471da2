"""Sibling tree ensembles stacked by a Concat become one ``anychip::TreeEnsembleStack`` node
(skl2onnx's BaggingRegressor and BaggingClassifier: ten one-tree ensembles reading ``X``, each
score Reshaped to ``[1, rows, k]``, a Concat on axis 0 and a ReduceMean; 22 nodes, each paying
the session's dispatch).

Fires on a Concat whose every input is ``Reshape(S, const)`` with one constant shape (no 0:
``allowzero`` cannot matter), ``S`` the scores of an ``ai.onnx.ml`` TreeEnsembleRegressor
(output 0) or TreeEnsembleClassifier (output 1, its labels unread) of the same float ``X``, each
intermediate read once and not a graph output. The ensembles move, unchanged, into the fused
node's ``body`` graph, which the kernel (``kernels/op_tree_ensemble_stack.py``) runs with the
ensembles' own kernels, each summing its trees in its own order; the reshapes and the Concat
are the same numpy calls, so the result is the Concat's, bit for bit.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import (
    FLOATS,
    Names,
    attrs,
    fuse_each,
    fused_node,
    producer,
    single_use,
)
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseTreeStackPass"]

_SCORES = {"TreeEnsembleRegressor": 0, "TreeEnsembleClassifier": 1}


def _reshaped_scores(v: Value | None, graph: Graph) -> tuple[Node, Node, list[int]] | None:
    """``(reshape, ensemble, shape)`` when ``v`` is ``Reshape(scores, const)`` as the module
    docstring says, else None."""
    if v is None or not single_use(v, graph):
        return None
    r = producer(v, graph, "Reshape")
    if r is None or len(r.inputs) != 2 or r.inputs[1] is None or r.inputs[1].const is None:
        return None
    shape = r.inputs[1].const
    if shape.dtype.kind not in "iu" or shape.ndim != 1 or (shape == 0).any():
        return None
    s = r.inputs[0]
    t = s.producer if s is not None else None
    if t is None or t.graph is not graph or t.domain != "ai.onnx.ml" or not single_use(s, graph):
        return None
    if _SCORES.get(t.op_type) != s.index or not t.inputs or t.inputs[0] is None:
        return None
    if any(o is not None and (o.uses or o in graph.outputs) for o in t.outputs if o is not s):
        return None  # a classifier's labels are read: the ensemble stays
    return r, t, [int(d) for d in shape]


class FuseTreeStackPass(Pass):
    """A Concat of reshaped sibling tree-ensemble scores becomes one node."""

    name = "fuse_tree_stack"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        names = Names(graph)
        return fuse_each(graph, "Concat", lambda cat, g: self._fuse(cat, g, names), self.name)

    def _fuse(self, cat: Node, graph: Graph, names: Names) -> int:
        found = [_reshaped_scores(v, graph) for v in cat.inputs]
        if len(found) < 2 or any(f is None for f in found):
            return 0
        x, shape = found[0][1].inputs[0], found[0][2]
        if x.dtype not in FLOATS or any(t.inputs[0] is not x or s != shape for _, t, s in found):
            return 0
        formal = Value(names.fresh(f"{x.name}_stacked"), x.dtype, x.shape)
        index = graph.nodes.index(cat)
        after = graph.nodes[index + 1] if index + 1 < len(graph.nodes) else None
        graph.remove(cat)
        ensembles = []
        for r, t, _ in found:
            graph.remove(r)
            graph.nodes.remove(t)
            t.replace_input(0, formal)
            ensembles.append(t)
        scores = [t.outputs[_SCORES[t.op_type]] for t in ensembles]
        body = Graph(f"{cat.name or 'trees'}_stack", [formal], scores, ensembles)
        a = attrs(shape=shape, axis=int(cat.attr("axis", 0)))
        a["body"] = Attr("body", AttrType.GRAPH, body)
        node = fused_node(
            cat, "TreeEnsembleStack", [x], list(cat.outputs), a, domain=ANYCHIP_DOMAIN, version=1
        )
        graph.insert(graph.nodes.index(after) if after is not None else len(graph.nodes), node)
        return 1
