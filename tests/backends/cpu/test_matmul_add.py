"""``anychip::MatMulAdd``: an N-D activation times a constant 2-D weight plus a last-axis bias
(``fuse_gemm``), equal to the unfused nodes and onnxruntime on the numpy and oneDNN paths;
left unfused where the bias is not one value per output column."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from anychip.backends.cpu.onednn import kernels as onednn_kernels
from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node


def _linear(a_shape, k, n, bias, bias_first=False, relu=False):
    add = N("Add", ["b", "m"] if bias_first else ["m", "b"], ["a" if relu else "y"])
    nodes = [N("MatMul", ["x", "w"], ["m"]), add] + ([N("Relu", ["a"], ["y"])] if relu else [])
    y_shape = list(np.broadcast_shapes(tuple(a_shape[:-1]) + (n,), bias.shape))
    inits = [("w", rand(1, k, n) * 0.2), ("b", bias)]
    return model(nodes, [("x", list(a_shape))], [("y", y_shape)], inits)


@pytest.mark.parametrize(
    "a_shape, bias_shape, bias_first",
    [((1, 128, 32), (32,), False), ((2, 5, 7, 32), (1, 32), True), ((3, 9, 32), (1, 1, 32), False)],
)
def test_small_linear_layers_fused(a_shape, bias_shape, bias_first):
    m = _linear(a_shape, 32, 32, rand(2, *bias_shape), bias_first)
    assert ops(m) == ["MatMulAdd"]
    assert check(m) == {"fuse_gemm": 1}


def test_large_linear_layer_through_onednn_then_relu():
    before = onednn_kernels.RUNS["MatMulAdd", "onednn"]
    m = _linear((2, 64, 128), 128, 256, rand(3, 256), relu=True)  # 4.2M multiply-adds
    assert ops(m)[0] == "MatMulAdd"
    assert check(m)["fuse_gemm"] == 1
    from anychip.backends.cpu.onednn import _lib

    if _lib.available():
        assert onednn_kernels.RUNS["MatMulAdd", "onednn"] > before


@pytest.mark.parametrize("bias_shape", [(128, 32), (1, 128, 1), (2, 1, 128, 32)])
def test_bias_not_along_the_last_axis_left_alone(bias_shape):
    m = _linear((1, 128, 32), 32, 32, rand(4, *bias_shape))
    assert "MatMulAdd" not in ops(m)
    check(m)


def test_activations_times_activations_left_alone():
    nodes = [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["y"])]
    m = model(nodes, [("x", [1, 8, 16]), ("w", [16, 4])], [("y", [1, 8, 4])], [("b", rand(5, 4))])
    assert "MatMulAdd" not in ops(m)
    check(m)


def test_float64_linear_layer():
    from onnx import TensorProto

    import anychip

    w, b = rand(6, 16, 8).astype(np.float64), rand(7, 8).astype(np.float64)
    g = helper.make_graph(
        [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["y"])],
        "f64",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [2, 3, 16])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [2, 3, 8])],
        [helper.make_tensor("w", TensorProto.DOUBLE, w.shape, w.ravel()),
         helper.make_tensor("b", TensorProto.DOUBLE, b.shape, b.ravel())],
    )  # fmt: skip
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rand(8, 2, 3, 16).astype(np.float64)
    s = anychip.load(m.SerializeToString(), "cpu")
    assert [n.op_type for n in s.partitions[0].graph.nodes] == ["MatMulAdd"]
    np.testing.assert_allclose(s.run(None, {"x": x})[0], x @ w + b, rtol=1e-12)


def test_a_small_layer_remembers_its_c_call_across_runs_and_shapes():
    """The node's bound C call (``cpu/native/linear.Bound``) serves the second run on; a new
    sequence length, and a bias array not the bound one, go back through ``linear``."""
    import onnxruntime as ort
    from onnx import TensorProto

    import anychip
    from anychip.backends.cpu.native import linear as linear_mod

    graph = helper.make_graph(
        [N("MatMul", ["x", "w"], ["m"]), N("Add", ["m", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", 24])],
        [
            helper.make_tensor("w", TensorProto.FLOAT, [32, 24], rand(1, 32, 24).ravel()),
            helper.make_tensor("b", TensorProto.FLOAT, [24], rand(2, 24)),
        ],
    )
    data = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    data.ir_version = 8
    data = data.SerializeToString()
    sess = anychip.load(data, "cpu")
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    (node,) = sess.partitions[0].graph.nodes
    assert node.op_type == "MatMulAdd"
    for seed, seq in enumerate((16, 16, 16, 9, 16)):
        x = {"x": rand(seed + 10, 1, seq, 32)}
        np.testing.assert_allclose(sess.run(None, x)[0], ref.run(None, x)[0], rtol=1e-5, atol=1e-5)
    bound = node.meta["matmul_add"][1]["linear"]
    assert isinstance(bound, linear_mod.Bound)
    a = rand(3, 1, 16, 32)
    w, b = bound.b, bound.bias
    np.testing.assert_array_equal(bound(a, w, b, None), linear_mod.linear(a, w, b))
    assert bound(a, w, b.copy(), None) is None  # not the bound bias: the caller's linear
    assert bound(rand(4, 1, 9, 32), w, b, None) is None


def test_a_small_matmul_remembers_its_c_call_and_equals_numpy():
    """A MatMul by a constant weight under MIN_MACS: its second run on goes through the bound
    C call (no bias), numpy's own sgemm: the same bits as np.matmul, over new inputs."""
    import anychip
    from anychip.backends.cpu.native import linear as linear_mod

    w = rand(1, 32, 48)
    m = model([N("MatMul", ["x", "w"], ["y"])], [("x", [1, 16, 32])], [("y", [1, 16, 48])],
              [("w", w)])  # fmt: skip
    sess = anychip.load(m.SerializeToString(), "cpu")
    (node,) = sess.partitions[0].graph.nodes
    for seed in range(4):
        x = rand(seed + 20, 1, 16, 32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.matmul(x, w))
    bound = node.meta["matmul"][1]["linear"]
    assert isinstance(bound, linear_mod.Bound) and bound.bias is None
