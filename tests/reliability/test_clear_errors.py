"""Errors instead of raw exceptions, and no silent acceptance (issue 47): a huge sparse
initializer is counted by ``max_load_bytes``, ``replan()`` after ``close()``, an opset from the
future, and a node with 50,000 inputs (linear, not quadratic, in its fan-in)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.ir import verifier

F = TensorProto.FLOAT


def _graph_model(nodes: list, inputs: list, opset: int = 13, **kw: object) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", F, None)])
    for sp in kw.get("sparse", []):  # type: ignore[attr-defined]
        graph.sparse_initializer.append(sp)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _huge_sparse() -> onnx.ModelProto:
    values = numpy_helper.from_array(np.array([1.5], np.float32), "w")
    index = numpy_helper.from_array(np.array([5], np.int64), "w_index")
    sparse = helper.make_sparse_tensor(values, index, [200_000, 200_000])  # 160 GB dense
    x = helper.make_tensor_value_info("x", F, [200_000, 200_000])
    return _graph_model([helper.make_node("Add", ["x", "w"], ["y"])], [x], sparse=[sparse])


def test_a_huge_sparse_initializer_counts_against_max_load_bytes() -> None:
    with pytest.raises(anychip.ModelError, match=r"'w \(sparse, dense\)' 160000000000 B"):
        anychip.load(_huge_sparse(), devices=["cpu"], max_load_bytes=1 << 30)


def test_a_sparse_initializer_too_large_to_make_dense_is_a_model_error() -> None:
    with pytest.raises(anychip.ModelError, match="sparse tensor 'w'.*cannot be made dense"):
        anychip.load(_huge_sparse(), devices=["cpu"])


def test_a_small_sparse_initializer_still_loads_within_the_ceiling() -> None:
    values = numpy_helper.from_array(np.array([1.5, -2.0], np.float32), "w")
    index = numpy_helper.from_array(np.array([1, 6], np.int64), "w_index")
    sparse = helper.make_sparse_tensor(values, index, [2, 4])
    x = helper.make_tensor_value_info("x", F, [2, 4])
    model = _graph_model([helper.make_node("Add", ["x", "w"], ["y"])], [x], sparse=[sparse])
    sess = anychip.load(model, devices=["cpu"], max_load_bytes=64)
    x0 = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    dense = np.zeros(8, np.float32)
    dense[[1, 6]] = [1.5, -2.0]
    np.testing.assert_allclose(sess.run(None, {"x": x0})[0], x0 + dense.reshape(2, 4))


def test_replan_after_close_says_the_session_is_closed() -> None:
    x = helper.make_tensor_value_info("x", F, [4])
    sess = anychip.load(_graph_model([helper.make_node("Relu", ["x"], ["y"])], [x]), "xpu,cpu")
    sess.close()
    with pytest.raises(anychip.AnychipError, match="this session is closed"):
        sess.replan()


def test_an_opset_from_the_future_is_not_accepted_silently() -> None:
    x = helper.make_tensor_value_info("x", F, [2])
    model = _graph_model([helper.make_node("Relu", ["x"], ["y"])], [x], opset=999)
    with pytest.warns(UserWarning, match=r"ai.onnx opset 999, newer than the newest"):
        sess = anychip.load(model, devices=["cpu"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])


class _CountingUses(list):
    """A value's uses that count membership scans (each one walks the list)."""

    scans = 0

    def __contains__(self, item: object) -> bool:
        _CountingUses.scans += 1
        return super().__contains__(item)


def test_a_node_with_50000_inputs_loads_and_its_check_is_linear() -> None:
    n = 50_000
    x = helper.make_tensor_value_info("x", F, [3])
    model = _graph_model([helper.make_node("Sum", ["x"] * n, ["y"])], [x])
    sess = anychip.load(model, devices=["cpu"])
    x0 = np.random.default_rng(1).integers(-3, 4, 3).astype(np.float32)  # exact sums
    np.testing.assert_array_equal(sess.run(None, {"x": x0})[0], x0 * n)
    # The verifier looks each of the node's inputs up among the value's uses: in a set made
    # once, not by scanning the 50,000-long list for each (quadratic: 30 s before).
    graph = sess.model.graph
    v = graph.inputs[0]
    v.uses = _CountingUses(v.uses)
    _CountingUses.scans = 0
    verifier.verify_graph(graph)
    assert _CountingUses.scans == 0
