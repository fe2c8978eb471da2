"""The CPU fusion passes' shared graph helpers (``backends/cpu/passes/_common.py``): the one
reader of a value, and a chain replaced by its fused node at the chain's place."""

from __future__ import annotations

from anychip.backends.cpu.passes._common import producer, reader, replace_chain
from anychip.ir import DType, Graph, Node, Value


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
