"""IR basics: ``Graph.verify`` catches broken graphs, ``sort`` orders nodes, the printer's text."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.errors import GraphError
from anychip.ir import Attr, AttrType, DType, Graph, Node, Value


def _chain() -> tuple[Graph, Value, Node, Node]:
    """x -> Relu -> a -> Neg -> y."""
    x = Value("x", DType.FLOAT, [2, "n"])
    a = Value("a")
    y = Value("y", DType.FLOAT, [2, "n"])
    relu = Node("Relu", [x], [a], name="relu_0")
    neg = Node("Neg", [a], [y], name="neg_0")
    return Graph("main", [x], [y], [relu, neg]), x, relu, neg


def test_valid_graph_verifies() -> None:
    g, *_ = _chain()
    g.verify()


def test_dangling_input_is_caught() -> None:
    g, _, _, neg = _chain()
    stranger = Value("stranger", DType.FLOAT, [2])
    neg.replace_input(0, stranger)
    with pytest.raises(GraphError, match="stranger"):
        g.verify()


def test_wrong_order_is_caught_and_sort_fixes_it() -> None:
    g, _, relu, neg = _chain()
    g.nodes = [neg, relu]
    with pytest.raises(GraphError, match="topological"):
        g.verify()
    g.sort()
    assert g.nodes == [relu, neg]
    g.verify()


def test_sort_is_stable_for_independent_nodes() -> None:
    x = Value("x", DType.FLOAT, [1])
    outs = [Value(f"o{i}") for i in range(4)]
    nodes = [Node("Relu", [x], [o], name=f"n{i}") for i, o in enumerate(outs)]
    g = Graph("main", [x], outs, nodes)
    g.sort()
    assert [n.name for n in g.nodes] == ["n0", "n1", "n2", "n3"]


def test_sort_raises_on_cycle() -> None:
    x = Value("x", DType.FLOAT, [1])
    a, b = Value("a"), Value("b")
    n1 = Node("Add", [x, None], [a], name="n1")
    n2 = Node("Neg", [a], [b], name="n2")
    n1.replace_input(1, b)  # a depends on b depends on a
    g = Graph("main", [x], [b], [n1, n2])
    with pytest.raises(GraphError, match="cycle"):
        g.sort()


def test_bad_use_list_is_caught() -> None:
    g, x, relu, _ = _chain()
    x.uses.clear()  # edited behind Node's back
    with pytest.raises(GraphError, match="uses"):
        g.verify()


def test_stale_use_is_caught() -> None:
    g, x, relu, _ = _chain()
    x.uses.append((relu, 5))
    with pytest.raises(GraphError, match="stale"):
        g.verify()


def test_duplicate_names_are_caught() -> None:
    g, _, _, neg = _chain()
    neg.outputs[0].name = "a"  # same name as Relu's output
    g.outputs[0].name = "a"
    with pytest.raises(GraphError, match="defined twice"):
        g.verify()


def test_undefined_graph_output_is_caught() -> None:
    g, *_ = _chain()
    g.outputs.append(Value("ghost", DType.FLOAT, [1]))
    with pytest.raises(GraphError, match="ghost"):
        g.verify()


def test_initializer_without_data_is_caught() -> None:
    g, *_ = _chain()
    g.initializers["w"] = Value("w", DType.FLOAT, [1])
    with pytest.raises(GraphError, match="no data"):
        g.verify()


def test_subgraph_may_capture_outer_values_defined_before_its_node() -> None:
    x = Value("x", DType.FLOAT, [2])
    c = Value("c", DType.BOOL, [])
    t_out, e_out, y = Value("t"), Value("e"), Value("y")
    then = Graph("then", [], [t_out], [Node("Relu", [x], [t_out])])
    other = Graph("else", [], [e_out], [Node("Neg", [x], [e_out])])
    node = Node(
        "If",
        [c],
        [y],
        attributes={
            "then_branch": Attr("then_branch", AttrType.GRAPH, then),
            "else_branch": Attr("else_branch", AttrType.GRAPH, other),
        },
    )
    g = Graph("main", [c, x], [y], [node])
    g.verify()
    assert then.parent is node and (then.nodes[0], 0) in x.uses
    # A subgraph reading a value nobody defines is dangling.
    then.nodes[0].replace_input(0, Value("nowhere", DType.FLOAT, [2]))
    with pytest.raises(GraphError, match="nowhere"):
        g.verify()


def test_printer_text() -> None:
    g, *_ = _chain()
    w = Value("w", const=np.ones((2, 2), np.float32))
    g.add_initializer(w)
    g.nodes[0].meta["device"] = "cpu"
    g.nodes[1].attributes["alpha"] = Attr("alpha", AttrType.FLOAT, 0.5)
    text = str(g)
    assert text.splitlines() == [
        "graph main (%x: f32[2,n]) -> (%y: f32[2,n]) {",
        "  %w: f32[2,2] = initializer",
        "  %a = Relu(%x)   # relu_0 @cpu",
        "  %y = Neg(%a) {alpha=0.5}   # neg_0",
        "}",
    ]


def test_a_pass_is_verified_when_it_changes_the_graph_or_its_node_count() -> None:
    """A pass that reports a change is verified; one that reports none but changed the node
    count is verified too; one that did nothing is not verified again."""
    from anychip.ir.passes import Pass, PassResult

    class Breaks(Pass):
        def __init__(self, report: bool, add: bool) -> None:
            self.report, self.add = report, add

        def call(self, graph: Graph) -> PassResult:
            neg = graph.nodes[1]
            neg.replace_input(0, Value("stranger", DType.FLOAT, [2]))
            if self.add:
                graph.append(Node("Relu", [graph.inputs[0]], [Value("extra")], name="extra"))
            return PassResult(graph, self.report)

    for report, add in [(True, False), (False, True)]:
        g, *_ = _chain()
        with pytest.raises(GraphError, match="stranger"):
            Breaks(report, add)(g)
    g, *_ = _chain()
    Breaks(False, False)(g)  # lied about changing nothing: its own contract, not re-checked
    with pytest.raises(GraphError, match="stranger"):
        g.verify()
