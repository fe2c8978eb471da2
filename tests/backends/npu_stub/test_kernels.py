"""Each NPU kernel against onnx's reference evaluator, compiled as it is and after the NPU
passes (which turn convolutions and pools into NHWC ``anychip`` ops), fp32 and fp16."""

from __future__ import annotations

import numpy as np
import pytest
from onnx.reference import ReferenceEvaluator

from anychip.backends.npu_stub.passes import npu_passes
from tests.backends.npu_stub.conftest import ir_graph, run_on_npu, single_op

R = np.random.default_rng(7)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


X = f32(2, 4, 9, 9)
W = f32(6, 4, 3, 3)
WG = f32(6, 2, 3, 3)
WD = f32(4, 1, 3, 3)
B6 = f32(6)

CASES = {
    "conv": ("Conv", [X, W, B6], {1: W, 2: B6}, {"pads": [1, 1, 1, 1]}),
    "conv_stride_dil": ("Conv", [X, W], {1: W}, {"strides": [2, 1], "dilations": [2, 1]}),
    "conv_asym_pads": ("Conv", [X, W], {1: W}, {"pads": [0, 1, 2, 1], "strides": [2, 2]}),
    "conv_same_upper": ("Conv", [X, W], {1: W}, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    "conv_valid": ("Conv", [X, W], {1: W}, {"auto_pad": "VALID"}),
    "conv_group": ("Conv", [X, WG], {1: WG}, {"group": 2, "pads": [1, 1, 1, 1]}),
    "conv_depthwise": ("Conv", [X, WD], {1: WD}, {"group": 4}),
    "conv_1x1": ("Conv", [X, f32(5, 4, 1, 1)], {}, {}),
    "conv_runtime_w": ("Conv", [X, W, B6], {}, {}),
    "maxpool": ("MaxPool", [X], {}, {"kernel_shape": [3, 3], "strides": [2, 2]}),
    "maxpool_pads_ceil": (
        "MaxPool",
        [X],
        {},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 0, 1, 0], "ceil_mode": 1},
    ),
    "maxpool_dil": ("MaxPool", [X], {}, {"kernel_shape": [2, 2], "dilations": [2, 2]}),
    "avgpool": ("AveragePool", [X], {}, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    "avgpool_incl": (
        "AveragePool",
        [X],
        {},
        {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1, "strides": [2, 2]},
    ),
    "gap": ("GlobalAveragePool", [X], {}, {}),
    "relu": ("Relu", [X], {}, {}),
    "sigmoid": ("Sigmoid", [X * 30], {}, {}),
    "hardswish": ("HardSwish", [X * 4], {}, {}),
    "clip": (
        "Clip",
        [X, np.float32(-0.5), np.float32(0.7)],
        {1: np.float32(-0.5), 2: np.float32(0.7)},
        {},
    ),
    "clip_v6": ("Clip", [X], {}, {"min": -0.2, "max": 0.4, "_opset": 6}),
    "add_bcast": ("Add", [X, f32(4, 1, 1)], {}, {}),
    "mul_const": ("Mul", [X, f32(9)], {1: f32(9)}, {}),
    "sum3": ("Sum", [X, f32(1, 4, 1, 9), f32(9)], {}, {}),
    "batchnorm": (
        "BatchNormalization",
        [X, f32(4), f32(4), f32(4), np.abs(f32(4)) + 0.5],
        {},
        {"epsilon": 1e-3},
    ),
    "matmul": ("MatMul", [f32(2, 3, 5, 7), f32(7, 4)], {}, {}),
    "matmul_const": ("MatMul", [f32(5, 7), f32(7, 4)], {1: f32(7, 4)}, {}),
    "gemm": (
        "Gemm",
        [f32(7, 5), f32(6, 7), f32(6)],
        {1: f32(6, 7), 2: f32(6)},
        {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
    ),
    "gemm_runtime": ("Gemm", [f32(3, 5), f32(5, 6), f32(3, 6)], {}, {}),
    "softmax": ("Softmax", [f32(2, 3, 5)], {}, {"axis": 1}),
    "concat": ("Concat", [X, f32(2, 3, 9, 9)], {}, {"axis": 1}),
    "reshape": (
        "Reshape",
        [X, np.array([2, -1, 9], np.int64)],
        {1: np.array([2, -1, 9], np.int64)},
        {},
    ),
    "flatten": ("Flatten", [X], {}, {"axis": 2}),
    "transpose": ("Transpose", [X], {}, {"perm": [3, 1, 0, 2]}),
    "sub_bcast": ("Sub", [X, f32(9)], {}, {}),
    "div_const": ("Div", [X, np.abs(f32(9)) + 0.5], {1: np.abs(f32(9)) + 0.5}, {}),
    "sqrt": ("Sqrt", [np.abs(X)], {}, {}),
    "tanh": ("Tanh", [X * 3], {}, {}),
    "erf": ("Erf", [X * 2], {}, {}),
    "gelu": ("Gelu", [X * 3], {}, {"_opset": 20}),
    "gelu_tanh": ("Gelu", [X * 3], {}, {"approximate": "tanh", "_opset": 20}),
    "layernorm": (
        "LayerNormalization",
        [f32(2, 5, 16) * 3 + 1, f32(16), f32(16)],
        {1: f32(16), 2: f32(16)},
        {"epsilon": 1e-5},
    ),
    "layernorm_2axes_nobias": (
        "LayerNormalization",
        [f32(2, 5, 16), f32(5, 16)],
        {},
        {"axis": 1},
    ),
}


def _case(name):
    op, inputs, consts, attributes = CASES[name]
    attributes = dict(attributes)
    opset = attributes.pop("_opset", 17)
    consts = {i: np.asarray(c) for i, c in consts.items()}
    inputs = [np.asarray(a) for a in inputs]
    return single_op(op, inputs, consts=consts, opset=opset, **attributes)


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("passes", [False, True], ids=["as_is", "after_passes"])
def test_kernel_matches_reference(name, passes):
    model, feeds = _case(name)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    graph = ir_graph(model)
    if passes:
        for p in npu_passes():
            p(graph)
            graph.verify()
    (got,) = run_on_npu(graph, feeds)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["conv", "conv_group", "matmul", "gemm"])
def test_fp16_rounds_operands_and_accumulates_in_fp32(name):
    model, feeds = _case(name)
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    (got,) = run_on_npu(ir_graph(model), feeds, precision="fp16")
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
    assert not np.array_equal(got, want)
    # The same computation by hand: operands rounded to fp16, products summed in fp32.
    rounded = {k: v.astype(np.float16).astype(np.float32) for k, v in feeds.items()}
    by_hand = ReferenceEvaluator(_rounded_consts(model)).run(None, rounded)[0]
    np.testing.assert_allclose(got, by_hand, rtol=1e-4, atol=1e-4)


def _rounded_consts(model):
    from onnx import numpy_helper as nh

    m = model.__class__()
    m.CopyFrom(model)
    for init in m.graph.initializer:
        arr = nh.to_array(init)
        if arr.dtype == np.float32 and arr.ndim >= 2:  # weights, not biases
            init.CopyFrom(nh.from_array(arr.astype(np.float16).astype(np.float32), init.name))
    return m


def test_softmax_before_opset_13_normalises_the_flattened_tail():
    # onnx's reference evaluator only knows the opset-13 meaning; the spec of Softmax-11 says
    # the input is coerced to 2-D at ``axis`` and normalised over the second dimension.
    a = f32(2, 3, 5)
    model, feeds = single_op("Softmax", [a], opset=11, axis=1)
    (got,) = run_on_npu(ir_graph(model), feeds)
    flat = a.reshape(2, 15)
    want = np.exp(flat) / np.exp(flat).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want.reshape(2, 3, 5), rtol=1e-5)
