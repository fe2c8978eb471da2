"""The fusion passes' shared graph helpers (``ir/passes/rewrite.py``): the one reader of a
value, a chain replaced by its fused node at the chain's place, and a reduction's kept axes."""

from __future__ import annotations

import numpy as np

from anychip.ir import Attr, AttrType, DType, Graph, Node, Value
from anychip.ir.passes.rewrite import kept_axes, producer, reader, replace_chain


def _graph() -> tuple[Graph, dict[str, Node], dict[str, Value]]:
    """x -> Relu -> a -> Neg -> b -> Exp -> y (an output), and Sigmoid(x) -> z (an output)
    between Neg and Exp in the node list; Tanh of b in a custom domain reads b too when
    ``custom`` is added by the test."""
    v = {n: Value(n, DType.FLOAT, (2, 3)) for n in "xabyz"}
    nodes = {
        "relu": Node("Relu", [v["x"]], [v["a"]]),
        "neg": Node("Neg", [v["a"]], [v["b"]]),
        "sig": Node("Sigmoid", [v["x"]], [v["z"]]),
        "exp": Node("Exp", [v["b"]], [v["y"]]),
    }
    g = Graph("g", [v["x"]], [v["y"], v["z"]], list(nodes.values()))
    g.verify()
    return g, nodes, v


def test_reader_is_the_one_default_domain_reader_of_the_op_asked() -> None:
    g, n, v = _graph()
    assert reader(v["a"], g) is n["neg"]
    assert reader(v["a"], g, "Neg") is n["neg"]
    assert reader(v["a"], g, "Exp") is None
    assert reader(v["x"], g) is None  # two readers
    assert reader(v["y"], g) is None  # a graph output
    assert reader(None, g) is None
    assert producer(v["b"], g, "Neg") is n["neg"]
    custom = Value("c", DType.FLOAT, (2, 3))
    n["exp"].replace_input(0, custom)
    g.insert(0, Node("Tanh", [v["b"]], [custom], domain="custom"))
    assert reader(v["b"], g) is None  # its one reader is not of the default domain


def test_replace_chain_puts_the_fused_node_where_the_last_was() -> None:
    g, n, v = _graph()
    fused = Node("FusedChain", [v["x"]], [v["y"]], domain="anychip")
    replace_chain(g, [n["relu"], n["neg"], n["exp"]], fused)
    assert g.nodes == [n["sig"], fused]
    assert all(node.graph is None for node in (n["relu"], n["neg"], n["exp"]))
    assert v["x"].uses.count((fused, 0)) == 1 and len(v["x"].uses) == 2
    g.verify()


def test_kept_axes_from_the_attribute_or_the_constant_input() -> None:
    x, y = Value("x", DType.FLOAT, (2, 3)), Value("y", DType.FLOAT, (2, 1))
    ints = {"axes": Attr("axes", AttrType.INTS, [1])}
    assert kept_axes(Node("ReduceMax", [x], [y], attributes=ints)) == [1]
    axes = Value("axes", DType.INT64, (1,), const=np.array([-1], np.int64))
    assert kept_axes(Node("ReduceSum", [x, axes], [y])) == [-1]
    assert kept_axes(Node("ReduceSum", [x, Value("ax", DType.INT64, (1,))], [y])) is None
    dropped = {"keepdims": Attr("keepdims", AttrType.INT, 0), **ints}
    assert kept_axes(Node("ReduceMax", [x], [y], attributes=dropped)) is None
