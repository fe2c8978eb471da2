"""Quantized rounding as onnxruntime does it: QuantizeLinear rounds half to even and saturates
(exact ties and values out of range, per tensor and per axis), equal to onnxruntime and to
onnx.reference; QLinearAdd follows the spec's formula, which onnxruntime's x86 kernels leave
by one step on a few elements (docs/decisions/033)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from tests.wild._compare import anychip_run, ort_run


def _quantize_model(qtype: int, zp: np.ndarray, scale: np.ndarray, axis: int) -> onnx.ModelProto:
    node = h.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], axis=axis)
    g = h.make_graph(
        [node],
        "q",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 200])],
        [h.make_tensor_value_info("y", qtype, [3, 200])],
        [nh.from_array(scale, "s"), nh.from_array(zp, "z")],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 19)])


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_ties_and_saturation(dtype, per_axis) -> None:
    rng = np.random.default_rng(21)
    ties = np.arange(-100, 100, dtype=np.float32) + 0.5  # every x.5: half to even
    x = np.stack([ties, ties * 3.0, rng.standard_normal(200).astype(np.float32) * 200])
    if per_axis:
        scale, zp = np.array([1.0, 2.0, 0.7], np.float32), np.array([3, 0, 1], dtype)
    else:
        scale, zp = np.array(1.0, np.float32), np.array(1, dtype)
    qtype = T.UINT8 if dtype == np.uint8 else T.INT8
    model = _quantize_model(qtype, zp, scale, axis=0)
    want = ort_run(model, {"x": x})[0]
    (got,), _ = anychip_run(model, {"x": x})
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got, ReferenceEvaluator(model).run(None, {"x": x})[0])
    info = np.iinfo(dtype)
    assert got.min() == info.min and got.max() == info.max  # saturated, not wrapped


def test_qlinear_add_is_the_spec_formula_within_one_step_of_onnxruntime() -> None:
    rng = np.random.default_rng(22)
    a = rng.integers(0, 256, (16, 64), dtype=np.uint8)
    b = rng.integers(0, 256, (16, 64), dtype=np.uint8)
    sa, sb, sc = np.float32(0.037), np.float32(0.021), np.float32(0.05)
    zp = np.array(128, np.uint8)
    consts = [
        nh.from_array(np.array(v), k)
        for k, v in (("sa", sa), ("za", zp), ("sb", sb), ("zb", zp), ("sc", sc), ("zc", zp))
    ]
    node = h.make_node(
        "QLinearAdd", ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["c"], domain="com.microsoft"
    )
    g = h.make_graph(
        [node],
        "qadd",
        [h.make_tensor_value_info(n, T.UINT8, [16, 64]) for n in ("a", "b")],
        [h.make_tensor_value_info("c", T.UINT8, None)],
        consts,
    )
    model = h.make_model(
        g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    )
    (got,), _ = anychip_run(model, {"a": a, "b": b})
    spec = ((a.astype(np.float32) - 128) * sa + (b.astype(np.float32) - 128) * sb) / sc
    spec = np.clip(np.rint(spec) + 128, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(got, spec)
    want = ort_run(model, {"a": a, "b": b})[0]
    steps = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert steps.max() <= 1 and np.count_nonzero(steps) <= 0.02 * steps.size


@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_then_dequantize_in_place_leaves_the_feed(per_axis) -> None:
    """The kernels compute in place on their own first array (one allocation each): the
    result equals onnxruntime's, and the caller's feed is not written."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((2, 4, 33)) * 40).astype(np.float32)
    if per_axis:
        s, z = (rng.random(4) + 0.2).astype(np.float32), rng.integers(0, 255, 4).astype(np.uint8)
    else:
        s, z = np.array(0.37, np.float32), np.array(131, np.uint8)
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
        h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1),
    ]
    g = h.make_graph(
        nodes,
        "qdq",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 4, 33])],
        [h.make_tensor_value_info("q", T.UINT8, [2, 4, 33]),
         h.make_tensor_value_info("y", T.FLOAT, [2, 4, 33])],
        [nh.from_array(s, "s"), nh.from_array(z, "z")],
    )  # fmt: skip
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    kept = x.copy()
    (got, _), want = anychip_run(m, {"x": x}), ort_run(m, {"x": x})
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(x, kept)
