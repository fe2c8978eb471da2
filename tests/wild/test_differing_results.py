"""Results that differed from onnxruntime: DynamicQuantizeLinear's float32 scale, bool ->
string Cast, and a wrong declared output shape (planned from inference, not the declaration)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from tests.wild._compare import anychip_run, assert_same, ort_run


def _dql_model() -> onnx.ModelProto:
    outs = [
        h.make_tensor_value_info("y", T.UINT8, [None]),
        h.make_tensor_value_info("s", T.FLOAT, []),
        h.make_tensor_value_info("z", T.UINT8, []),
    ]
    node = h.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [None])], outs)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def test_dynamic_quantize_linear_scale_in_float32() -> None:
    # In float64 about a quarter of these inputs got a scale or elements one step apart.
    model = _dql_model()
    ref = ReferenceEvaluator(model)
    for seed in range(40):
        rng = np.random.default_rng(seed)
        x = (rng.standard_normal(500) * rng.uniform(0.01, 100)).astype(np.float32)
        got, _ = anychip_run(model, {"x": x})
        assert_same(got, ort_run(model, {"x": x}), rtol=0, atol=0)
        assert_same(got, ref.run(None, {"x": x}), rtol=0, atol=0)


def test_bool_to_string_cast_is_0_1_and_round_trips() -> None:
    # onnxruntime writes '1'/'0' (onnx's reference evaluator 'True'/'False', which no Cast
    # reads back): anychip matches onnxruntime, so bool -> string -> float holds.
    nodes = [
        h.make_node("Cast", ["b"], ["s"], to=T.STRING),
        h.make_node("Cast", ["s"], ["f"], to=T.FLOAT),
    ]
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("b", T.BOOL, [6])],
        [h.make_tensor_value_info("s", T.STRING, [6]), h.make_tensor_value_info("f", T.FLOAT, [6])],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    b = np.random.default_rng(1).random(6) > 0.5
    got, _ = anychip_run(model, {"b": b})
    want = ort_run(model, {"b": b})
    assert_same(got, want)
    assert got[0].tolist() == ["1" if v else "0" for v in b]
    np.testing.assert_array_equal(got[1], b.astype(np.float32))


@pytest.mark.parametrize("declared", [[100000, 100000, 64], [7, 3]])
def test_a_wrong_declared_output_shape_is_not_planned(declared) -> None:
    # Planned from the declaration, [100000, 100000, 64] "needed" 5 TB at load.
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["t"]), h.make_node("Abs", ["t"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", T.FLOAT, declared)],
        value_info=[h.make_tensor_value_info("t", T.FLOAT, declared)],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 13)])
    x = np.random.default_rng(2).standard_normal((2, 3)).astype(np.float32)
    got, warnings = anychip_run(model, {"x": x})
    assert_same(got, ort_run(model, {"x": x}))
    assert any("'y' declared" in w and "inferred [2,3]" in w for w in warnings), warnings
