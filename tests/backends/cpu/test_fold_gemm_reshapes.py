"""``FoldGemmReshapesPass``: Reshape -> Gemm -> Reshape, as exporters flatten a linear layer,
becomes one N-D MatMul (MatMulAdd with a bias); equal to the unfused graph and onnxruntime on
seeded random inputs and weights, at two sequence lengths of a symbolic dimension; left alone
where the fold would not be exact."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node
K, W = 16, 24


def _linear(x_shape, flat, back, bias=None, gemm_attrs=None, extra_output=None):
    """x -> Reshape(flat) -> Gemm(B[, C]) -> Reshape(back) -> Relu."""
    nodes = [
        N("Reshape", ["x", "flat"], ["a"]),
        N("Gemm", ["a", "B"] + (["C"] if bias is not None else []), ["y2"], **(gemm_attrs or {})),
        N("Reshape", ["y2", "back"], ["y3"]),
        N("Relu", ["y3"], ["y"]),
    ]
    trans_b = (gemm_attrs or {}).get("transB", 0)
    inits = [
        ("flat", np.array(flat, np.int64)),
        ("back", np.array(back, np.int64)),
        ("B", rand(1, W, K) if trans_b else rand(1, K, W)),
    ]
    if bias is not None:
        inits.append(("C", rand(2, *bias)))
    rows = int(np.prod(x_shape)) // K
    known = int(np.prod([d for d in back if d != -1]))
    out_shape = [d if d != -1 else rows * W // known for d in back]
    outputs = [("y", out_shape)] + ([(extra_output, [rows, K])] if extra_output else [])
    return model(nodes, [("x", list(x_shape))], outputs, inits)


@pytest.mark.parametrize("bias", [None, (W,), (1, W)])
def test_flattened_linear_layer_is_one_matmul(bias):
    m = _linear((1, 6, K), [-1, K], [1, -1, W], bias)
    assert check(m) == {"fold_gemm_reshapes": 1}
    assert ops(m, disabled_passes=["fuse_elementwise"]) == [
        "MatMul" if bias is None else "MatMulAdd",
        "Relu",
    ]


@pytest.mark.parametrize(
    "x_shape, back",
    [((1, 6, 2, 8), [1, -1, W]), ((1, 6, K), [2, 3, W]), ((2, 3, 2, 8), [3, 2, W])],
)
def test_other_shapes_keep_one_reshape(x_shape, back):
    """Merged heads [1, 6, 2, 8] flattened to [-1, 16], or rows given other leading
    dimensions: one Reshape to y's leading dimensions and K stays."""
    m = _linear(x_shape, [-1, K], back)
    assert check(m) == {"fold_gemm_reshapes": 1}
    assert ops(m, disabled_passes=["fuse_elementwise"]) == ["Reshape", "MatMul", "Relu"]


@pytest.mark.parametrize(
    "x_shape, back, attrs, extra",
    [
        ((1, 6, K), [1, -1, W], {"transB": 1}, None),
        ((1, 6, K), [1, -1, W], {"alpha": 0.5}, None),
        ((1, 6, K), [1, -1, W], None, "a"),  # the flat input is also an output
    ],
)
def test_not_folded(x_shape, back, attrs, extra):
    m = _linear(x_shape, [-1, K], back, None, attrs, extra)
    assert "fold_gemm_reshapes" not in check(m)


def test_symbolic_sequence_length():
    """x [1, S, K] with S symbolic: folded once, right at two lengths."""
    g = helper.make_graph(
        [
            N("Reshape", ["x", "flat"], ["a"]),
            N("Gemm", ["a", "B", "C"], ["y2"]),
            N("Reshape", ["y2", "back"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "S", K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "S", W])],
        [
            numpy_helper.from_array(np.array([-1, K], np.int64), "flat"),
            numpy_helper.from_array(np.array([1, -1, W], np.int64), "back"),
            numpy_helper.from_array(rand(4, K, W), "B"),
            numpy_helper.from_array(rand(5, W), "C"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(m, full_check=True)
    data = m.SerializeToString()
    sess = anychip.load(data, "cpu")
    assert sess.partitions[0].info["fusions"] == {"fold_gemm_reshapes": 1}
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for s in (5, 9, 5):
        feeds = {"x": rand(10 + s, 1, s, K)}
        np.testing.assert_allclose(
            sess.run(None, feeds)[0], ref.run(None, feeds)[0], rtol=1e-5, atol=1e-5
        )
