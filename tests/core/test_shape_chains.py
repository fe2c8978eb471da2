"""Shape computations stay on the host: Shape -> Slice -> Concat feeding a Reshape."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()), reason="no XPU here"
)


def _model() -> bytes:
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"], name="shape"),
        n("Slice", ["s", "zero", "two"], ["s2"], name="shape/slice"),
        n("Concat", ["s2", "minus1"], ["target"], axis=0, name="shape/concat"),
        n("Relu", ["x"], ["r"], name="relu"),
        n("Reshape", ["r", "target"], ["y"], name="reshape"),
    ]
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 20])
    g = helper.make_graph(nodes, "shape_chain", [x], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(m).SerializeToString()


def test_shape_computations_stay_on_the_host():
    sess = anychip.load(_model(), devices=["xpu", "cpu"], calibration="off")
    where = {n.name: (n.device, n.reason) for n in sess.placement().nodes}
    for name in ("shape/slice", "shape/concat"):
        assert where[name] == ("cpu", "shape computation: stays on the host"), where
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0).reshape(2, 3, 20))


def test_without_the_cost_model_every_node_goes_as_far_forward_as_it_can():
    sess = anychip.load(_model(), devices=["xpu", "cpu"], cost_model=False)
    where = {n.name: n.device for n in sess.placement().nodes}
    assert where["shape/concat"] == "xpu"
