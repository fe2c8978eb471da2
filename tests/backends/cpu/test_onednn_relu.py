"""The CPU's Relu, recorded for a replay, raises no numpy warning on any run (numpy
deprecates ``np.maximum`` given ``out`` positionally, which the recorded step once did)."""

from __future__ import annotations

import warnings

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import anychip
from tests.wild._compare import ort_run


def test_relu_replayed_without_warnings() -> None:
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [w],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = anychip.load(model, devices=["cpu"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for seed in range(6):  # recorded, then replayed
            x = np.random.default_rng(seed).standard_normal((4, 8)).astype(np.float32)
            (got,) = sess.run(None, {"x": x})
            np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
