"""The OpenCL kernels, one node at a time on ``opencl`` alone (strict), against onnxruntime on
seeded random inputs: odd sizes (not multiples of the 8x8 GEMM tile), broadcasting, strides."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from tests.backends.opencl._util import check, check_op, rand

pytestmark = pytest.mark.usefixtures("cl_device")


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((64, 256), (256, 96)),
        ((5, 7), (7, 3)),
        ((2, 3, 17, 33), (2, 3, 33, 9)),
        ((4, 1, 9, 12), (3, 12, 10)),  # batch broadcast both ways
        ((13,), (13, 6)),  # 1-D operands
        ((2, 6, 13), (13,)),
        ((7, 19), (19, 24)),  # the 6x16 tile's second panel missing at the edge
        ((1, 40, 5), (3, 5, 17)),  # one A for every batch, read in place
        ((2, 1, 6, 8), (1, 3, 8, 16)),  # A broadcast over a batch axis: packed
    ],
)
def test_matmul(sa, sb):
    check_op("MatMul", {"a": rand(*sa), "b": rand(*sb)}, atol=1e-4)


def test_matmul_reads_a_in_place_unless_its_batches_broadcast():
    from anychip.backends.opencl.kernels.op_matmul import _mm_plan

    assert _mm_plan((256, 256), (256, 256))[-1] == (256, 0)
    assert _mm_plan((4, 9, 12), (12, 10))[-1] == (12, 108)
    assert _mm_plan((1, 40, 5), (3, 5, 17))[-1] == (5, 0)
    assert _mm_plan((2, 1, 6, 8), (1, 3, 8, 16))[-1] is None


@pytest.mark.parametrize(
    "trans_a, trans_b, c_shape", [(0, 0, (11,)), (1, 0, (9, 11)), (0, 1, (9, 1)), (1, 1, None)]
)
def test_gemm(trans_a, trans_b, c_shape):
    a = rand(*((20, 9) if trans_a else (9, 20)))
    b = rand(*((11, 20) if trans_b else (20, 11)))
    feeds = {"a": a, "b": b}
    if c_shape is not None:
        feeds["c"] = rand(*c_shape)
    check_op("Gemm", feeds, alpha=0.7, beta=1.3, transA=trans_a, transB=trans_b, atol=1e-4)


@pytest.mark.parametrize(
    "x_shape, w_shape, attrs",
    [
        ((2, 3, 13, 11), (8, 3, 3, 3), {"pads": [1, 1, 1, 1]}),
        ((1, 4, 12, 12), (6, 2, 3, 3), {"group": 2, "strides": [2, 2], "dilations": [2, 1]}),
        ((1, 3, 15, 15), (5, 3, 7, 7), {"strides": [2, 2], "pads": [3, 2, 1, 3]}),
        ((1, 16, 9, 9), (16, 1, 3, 3), {"group": 16, "auto_pad": "SAME_UPPER"}),
        ((2, 3, 20), (4, 3, 5), {"pads": [2, 1]}),  # 1-D
        ((1, 32, 7, 7), (64, 32, 1, 1), {}),
    ],
)
@pytest.mark.parametrize("bias", [True, False])
def test_conv(x_shape, w_shape, attrs, bias):
    feeds = {"x": rand(*x_shape), "w": rand(*w_shape)}
    if bias:
        feeds["b"] = rand(w_shape[0])
    check_op("Conv", feeds, atol=1e-4, **attrs)


@pytest.mark.parametrize(
    "op, attrs",
    [
        ("MaxPool", {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ("MaxPool", {"kernel_shape": [2, 2], "ceil_mode": 1, "dilations": [2, 2]}),
        ("AveragePool", {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
        ("AveragePool", {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
        ("GlobalAveragePool", {}),
        ("GlobalMaxPool", {}),
    ],
)
def test_pool(op, attrs):
    check_op(op, {"x": rand(2, 3, 11, 10)}, opset=19, **attrs)


def test_maxpool_indices():
    x = rand(1, 2, 6, 7)
    check_op("MaxPool", {"x": x}, outputs=2, kernel_shape=[2, 2], strides=[2, 2])


@pytest.mark.parametrize(
    "op", ["Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Abs", "Neg", "Softsign", "Softplus", "Sin"]
)
def test_unary(op):
    check_op(op, {"x": rand(3, 1000, 7)}, rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    check_op("Gelu", {"x": rand(33, 65)}, opset=20, approximate=approximate)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow", "Max", "Min"])
@pytest.mark.parametrize("sa, sb", [((4, 5, 6), (4, 5, 6)), ((4, 1, 6), (5, 1)), ((), (3, 2))])
def test_binary_broadcast(op, sa, sb):
    a, b = rand(*sa), rand(*sb)
    if op == "Pow":
        a = np.asarray(np.abs(a) + np.float32(0.5))
    check_op(op, {"a": a, "b": b})


def test_variadic_sum_and_double():
    feeds = {"a": rand(3, 4), "b": rand(4), "c": rand(1, 4)}
    check_op("Sum", feeds)
    check_op("Mean", feeds)
    check_op("Add", {"a": rand(5, 6, dtype=np.float64), "b": rand(6, dtype=np.float64)})


@pytest.mark.parametrize(
    "op", ["ReduceSum", "ReduceMean", "ReduceMax", "ReduceL2", "ReduceLogSumExp", "ReduceProd"]
)
@pytest.mark.parametrize("axes, keepdims", [([1], 1), ([0, 2], 0), ([], 1)])
def test_reduce(op, axes, keepdims):
    x = rand(4, 9, 5)
    consts = {"axes": np.array(axes, np.int64)}
    model = _init_model(op, x, consts, opset=18, keepdims=keepdims)
    check(model, {"x": x})


@pytest.mark.parametrize("opset, axis", [(11, 1), (13, 1), (13, -1), (13, 0)])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax(op, opset, axis):
    check_op(op, {"x": rand(3, 4, 5) * 4}, opset=opset, axis=axis)


@pytest.mark.parametrize("axis", [-1, 1])
def test_layer_normalization(axis):
    x = rand(2, 5, 12)
    shape = x.shape[axis:]
    feeds = {"x": x, "g": rand(*shape), "b": rand(*shape)}
    check_op("LayerNormalization", feeds, outputs=3, axis=axis, epsilon=1e-3)


def test_batch_normalization():
    c = 6
    feeds = {
        "x": rand(2, c, 5, 4),
        "s": rand(c),
        "b": rand(c),
        "m": rand(c),
        "v": np.abs(rand(c)) + np.float32(0.5),
    }
    check_op("BatchNormalization", feeds, opset=9, epsilon=1e-3)


def test_clip_and_leaky_relu():
    x = rand(7, 9)
    bounds = {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}
    check(_init_model("Clip", x, bounds, opset=13), {"x": x})
    check_op("LeakyRelu", {"x": x}, alpha=0.3)


def _init_model(op: str, x: np.ndarray, consts: dict, opset: int = 14, **attrs):
    """``op`` over input ``x`` and constant (initializer) inputs, as models have them."""
    vi = helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    node = helper.make_node(op, ["x", *consts], ["y"], **attrs)
    out = helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(x.dtype), None)
    graph = helper.make_graph([node], op, [vi], [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8])
def test_data_movement(dtype):
    x = (rand(2, 3, 4, 5) * 10).astype(dtype)
    i64 = np.int64
    cases = [
        ("Transpose", {}, {"perm": [0, 3, 1, 2]}),
        ("Reshape", {"s": np.array([6, -1], i64)}, {}),
        ("Flatten", {}, {"axis": 2}),
        ("Slice", {"st": np.array([1, -1], i64), "en": np.array([3, 0], i64),
                   "ax": np.array([2, 3], i64), "sp": np.array([1, -2], i64)}, {}),
        ("Expand", {"s": np.array([3, 2, 3, 4, 5], i64)}, {}),
        ("Tile", {"r": np.array([1, 2, 1, 3], i64)}, {}),
        ("Gather", {"i": np.array([[2, 0], [-1, 1]], i64)}, {"axis": 2}),
        ("Unsqueeze", {"a": np.array([0, 5], i64)}, {}),
        ("Squeeze", {}, {}),
        ("Identity", {}, {}),
    ]  # fmt: skip
    for op, consts, attrs in cases:
        check(_init_model(op, x, consts, **attrs), {"x": x})


def test_concat_and_split():
    feeds = {"a": rand(2, 3, 4), "b": rand(2, 5, 4), "c": rand(2, 1, 4)}
    check_op("Concat", feeds, axis=1)
    x = rand(3, 10)
    model = _init_model("Split", x, {"s": np.array([3, 7], np.int64)}, axis=1)
    model.graph.node[0].output[:] = ["y", "z"]
    model.graph.output.append(helper.make_tensor_value_info("z", 1, None))
    check(model, {"x": x})
