"""Sibling tree ensembles reading the same ``X`` become one ``anychip::TreeEnsembleGroup``
node (skl2onnx's AdaBoost: twenty one-tree ensembles of ``X``, each paying the session's
dispatch and its kernel's own fixed cost for a walk of a few microseconds).

Fires on two or more ``ai.onnx.ml`` TreeEnsembleRegressor or TreeEnsembleClassifier nodes of
one graph whose first input is the same float value (after ``fuse_tree_stack``, which takes the
Bagging form whole). The ensembles move, unchanged, into the fused node's ``body``; the outputs
that something reads (or the graph returns) become the fused node's outputs, in order, so a
classifier's unread labels are never made. The kernel (``kernels/op_tree_ensemble_stack.py``)
walks them in one C call, each summed in its own order and finished by its own kernel's code.
"""

from __future__ import annotations

from anychip.ir.graph import Graph
from anychip.ir.node import Attr, AttrType, Node
from anychip.ir.passes import Pass, PassResult
from anychip.ir.passes.rewrite import FLOATS, Names, fused_node, record
from anychip.ir.value import Value
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["FuseTreeGroupPass"]

_ENSEMBLES = ("TreeEnsembleRegressor", "TreeEnsembleClassifier")


class FuseTreeGroupPass(Pass):
    """Tree ensembles sharing their input become one node."""

    name = "fuse_tree_group"

    def call(self, graph: Graph) -> PassResult:
        """Rewrite ``graph`` in place."""
        by_input: dict[int, list[Node]] = {}
        for n in graph.nodes:
            if n.domain == "ai.onnx.ml" and n.op_type in _ENSEMBLES and n.inputs:
                if n.inputs[0] is not None:
                    by_input.setdefault(id(n.inputs[0]), []).append(n)
        names = Names(graph)
        fired = sum(self._fuse(g, graph, names) for g in by_input.values() if len(g) >= 2)
        record(graph, self.name, fired)
        return PassResult(graph, fired > 0)

    def _fuse(self, ensembles: list[Node], graph: Graph, names: Names) -> int:
        x = ensembles[0].inputs[0]
        if x.dtype not in FLOATS:
            return 0  # the fused op takes float32 and float64 rows
        outer: list[Value] = []
        inner: list[Value] = []
        for t in ensembles:
            for i, v in enumerate(t.outputs):
                if v is None or not (v.uses or v in graph.outputs):
                    continue  # unread: stays inside the body, and is never made
                w = Value(names.fresh(f"{v.name}_grouped"), v.dtype, v.shape)
                t.outputs[i], w.producer, w.index = w, t, i
                outer.append(v)
                inner.append(w)
        if not outer:
            return 0
        formal = Value(names.fresh(f"{x.name}_grouped"), x.dtype, x.shape)
        at = graph.nodes.index(ensembles[0])
        for t in ensembles:
            graph.nodes.remove(t)
            t.replace_input(0, formal)
        body = Graph(f"{ensembles[0].name or 'trees'}_group", [formal], inner, ensembles)
        node = fused_node(
            ensembles[0],
            "TreeEnsembleGroup",
            [x],
            outer,
            {"body": Attr("body", AttrType.GRAPH, body)},
            domain=ANYCHIP_DOMAIN,
            version=1,
            name=f"{ensembles[0].name}+group{len(ensembles)}" if ensembles[0].name else "",
        )
        graph.insert(at, node)
        return 1
