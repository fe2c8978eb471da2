"""``anychip inspect``: FLOPs against hand counts, parameters against the ONNX initializers,
and the per-device support against what placement does."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.viz.inspect import inspect_model
from tests.models import light, transformer_layer


def _small() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal((6, 10)).astype(np.float32), "b"),
        numpy_helper.from_array(np.array([1, 8 * 6 * 6], np.int64), "shape"),
        numpy_helper.from_array(rng.standard_normal((288, 6)).astype(np.float32), "m"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[0, 0, 0, 0]),  # 1x8x6x6
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Reshape", ["r", "shape"], ["f"]),  # 1x288
        helper.make_node("MatMul", ["f", "m"], ["g"]),  # 1x6
        helper.make_node("Gemm", ["g", "b"], ["y"]),  # 1x10
    ]
    graph = helper.make_graph(
        nodes,
        "small",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_flops_and_parameters_of_a_small_model() -> None:
    s = inspect_model(_small())
    assert s.flops_by_op == {
        "Conv": 2 * (8 * 6 * 6) * (3 * 3 * 3),
        "MatMul": 2 * 6 * 288,
        "Gemm": 2 * 10 * 6,
        "Relu": 8 * 6 * 6,
    }
    assert s.parameters == 8 * 27 + 60 + 2 + 288 * 6
    assert s.inputs == [("x", "f32", [1, 3, 8, 8])] and s.outputs == [("y", "f32", [1, 10])]
    assert s.opsets == {"ai.onnx": 17}
    assert s.ops == {"Conv": 1, "Relu": 1, "Reshape": 1, "MatMul": 1, "Gemm": 1}
    assert s.devices["xpu"]["Conv"][:2] == [0, 1] and "Conv" in s.devices["xpu"]["Conv"][2]
    assert s.to_dict()["nodes"] == 5


def test_resnet50_flops_are_the_known_four_gigamacs() -> None:
    model = light("resnet50", seed=0)
    s = inspect_model(model)
    conv = s.flops_by_op["Conv"] + s.flops_by_op["Gemm"]
    assert 2 * 4.0e9 < conv < 2 * 4.2e9  # ResNet-50 at 224x224: about 4.1 GMACs
    params = sum(int(np.prod(t.dims)) for t in model.graph.initializer)
    assert s.parameters == params
    assert all(row[0] == row[1] for row in s.devices["npu"].values())  # all of it on the npu


def test_support_agrees_with_placement() -> None:
    model = transformer_layer(seq=8, hidden=32, ffn=64, ln_mean=True)
    s = inspect_model(model, ["xpu", "cpu"])
    with anychip.load(model, devices=["xpu", "cpu"], cost_model=False) as sess:
        fell = {n.op_type for n in sess.placement().fallbacks()}
    cannot = {op for op, (can, total, _) in s.devices["xpu"].items() if can < total}
    assert cannot == fell == {"LayerNormalization"}
    assert "LayerNormalization" in str(s)


def test_symbolic_shapes_are_listed_not_guessed() -> None:
    s = inspect_model(transformer_layer(seq="n", hidden=32, ffn=64))
    assert s.inputs[0][2] == [1, "n", 32]
    assert "attn/q" in s.unknown_flops  # its output has the symbolic length
    assert "not counted (shapes unknown)" in str(s)
