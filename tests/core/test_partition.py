"""``core/plan/partition.py``: partitions per device run, one copy per tensor per destination, no
cycles when devices alternate; results equal the cpu-only run."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import anychip
from tests.core.test_placement import three_nodes


def _fan_out() -> bytes:
    """x -> Relu (xpu) -> {Sin (cpu), Exp (cpu), Softmax (xpu)} -> Sum: one tensor read by two
    cpu nodes is copied once."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Sin", ["a"], ["s"], name="sin"),
        helper.make_node("Cos", ["a"], ["c"], name="cos"),
        helper.make_node("Softmax", ["a"], ["m"], name="softmax", axis=-1),
        helper.make_node("Sum", ["s", "c", "m"], ["y"], name="sum"),
    ]
    graph = helper.make_graph(
        nodes,
        "fan",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)


def test_alternating_devices_make_ordered_partitions_and_copies() -> None:
    sess = anychip.load(three_nodes(), devices=["xpu", "cpu"], cost_model=False)
    rep = sess.placement()
    assert [p.device for p in rep.partitions] == ["xpu", "cpu", "xpu"]
    # in to xpu, a to cpu, b back to xpu, y out to the host.
    assert [(c.src, c.dst) for c in rep.copies] == [
        ("cpu", "xpu"),
        ("xpu", "cpu"),
        ("cpu", "xpu"),
        ("xpu", "cpu"),
    ]
    assert all(c.bytes == 4 * 8 * 4 for c in rep.copies)
    (want,) = anychip.load(three_nodes(), devices=["cpu"]).run(None, {"x": _x()})
    (got,) = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_one_copy_per_tensor_per_destination_and_branches_merge() -> None:
    sess = anychip.load(_fan_out(), devices=["xpu", "cpu"], cost_model=False)
    rep = sess.placement()
    copied = [(c.tensor, c.dst) for c in rep.copies]
    assert len(copied) == len(set(copied))
    assert copied.count(("a", "cpu")) == 1  # read by Sin and Cos, copied once
    # Relu and Softmax are independent of the cpu branch: one xpu partition holds both.
    xpu_parts = [p for p in rep.partitions if p.device == "xpu"]
    assert len(xpu_parts) == 1 and {"relu", "softmax"} <= set(xpu_parts[0].nodes)
    (want,) = anychip.load(_fan_out(), devices=["cpu"]).run(None, {"x": _x()})
    (got,) = sess.run(None, {"x": _x()})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_partitions_are_standalone_graphs_the_original_keeps_every_node() -> None:
    sess = anychip.load(three_nodes(), devices=["npu", "cpu"], cost_model=False)
    total = sum(len(p.graph.nodes) for p in sess.partitions)
    assert len(sess.model.graph.nodes) == 3
    assert total >= 3
    for p in sess.partitions:
        p.graph.verify()
        assert all(n.graph is p.graph for n in p.graph.nodes)
