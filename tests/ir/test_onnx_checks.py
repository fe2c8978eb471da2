"""The checker and shape inference of the import (``ir/onnx/_checks.py``): shape inference
runs without the large weights, and the model still gets every weight and every shape."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from anychip.ir.onnx import import_model
from anychip.ir.onnx._checks import infer_shapes


def _model(rng: np.random.Generator) -> onnx.ModelProto:
    w = rng.standard_normal((256, 512)).astype(np.float32)  # 512 KiB: lent out for inference
    shape = np.array([4, 128], np.int64)  # small: kept for data propagation
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["y"]),
        helper.make_node("Reshape", ["y", "shape"], ["z"]),
        helper.make_node("Relu", ["z"], ["out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 256])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["a", "b"])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(shape, "shape")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inference_keeps_the_callers_proto_and_propagates_small_constants() -> None:
    proto = _model(np.random.default_rng(0))
    before = proto.SerializeToString()
    inferred = infer_shapes(proto)
    assert proto.SerializeToString() == before
    shapes = {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.output]
    }
    assert shapes["y"] == [1, 512]
    assert shapes["z"] == [4, 128]  # needs the Reshape's shape values


def test_imported_weights_are_the_models_own() -> None:
    rng = np.random.default_rng(1)
    proto = _model(rng)
    model = import_model(proto)
    want = numpy_helper.to_array(proto.graph.initializer[0])
    got = model.graph.initializers["w"].const
    np.testing.assert_array_equal(got, want)
    assert list(model.graph.outputs[0].shape) == [4, 128]
