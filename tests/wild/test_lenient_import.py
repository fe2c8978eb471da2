"""Models onnxruntime runs although onnx.checker refuses them: anychip repairs each with a
warning naming the problem and gives onnxruntime's result; unsafe models stay errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from tests.wild._compare import anychip_run, assert_same, ort_run

_RNG = np.random.default_rng(19)
_X = _RNG.standard_normal((2, 3)).astype(np.float32)


def _io(name: str, shape: list) -> onnx.ValueInfoProto:
    return h.make_tensor_value_info(name, T.FLOAT, shape)


def _init_not_input() -> onnx.ModelProto:
    w = nh.from_array(_RNG.standard_normal((3, 3)).astype(np.float32), "W")
    g = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["y"])], "g", [_io("x", [2, 3])], [_io("y", [2, 3])], [w]
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 7)], ir_version=3)


def _untyped() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["t"]), h.make_node("Abs", ["t"], ["y"])],
        "g",
        [_io("x", [2, 3])],
        [],
    )
    for name, where in (("t", g.value_info), ("y", g.output)):
        vi = onnx.ValueInfoProto()
        vi.name = name
        where.append(vi)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _ai_onnx_domain() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"], domain="ai.onnx")],
        "g",
        [_io("x", [2, 3])],
        [_io("y", [2, 3])],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("ai.onnx", 13)])


def _empty_name() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "", [_io("x", [2, 3])], [_io("y", [2, 3])]
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _layer_norm_13() -> onnx.ModelProto:
    inits = [nh.from_array(_RNG.standard_normal(3).astype(np.float32), n) for n in ("s", "b")]
    node = h.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-3)
    g = h.make_graph([node], "g", [_io("x", [2, 3])], [_io("y", [2, 3])], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


def _negative_dim() -> onnx.ModelProto:
    g = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])], "g", [_io("x", [-1, 3])], [_io("y", [-1, 3])]
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 13)])


@pytest.mark.parametrize(
    "build, warned",
    [
        (_init_not_input, "not listed as graph inputs"),
        (_untyped, "without a type"),
        (_ai_onnx_domain, "ai.onnx"),
        (_empty_name, "empty graph name"),
        (_layer_norm_13, "LayerNormalization"),
        (_negative_dim, None),
    ],
)
def test_repaired_like_onnxruntime(build, warned) -> None:
    model = build()
    if warned is not None:
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(model)
    want = ort_run(model, {"x": _X})
    got, warnings = anychip_run(model, {"x": _X})
    assert_same(got, want)
    if warned is not None:
        assert any(warned in w for w in warnings), warnings


def test_repair_leaves_the_callers_proto_alone() -> None:
    model = _empty_name()
    anychip_run(model, {"x": _X})
    assert model.graph.name == ""


@pytest.mark.parametrize(
    "breaks, says",
    [
        (lambda g: g.input[0].ClearField("type"), "x"),  # an input of unknown type
        (lambda g: g.node[0].input.__setitem__(0, "nowhere"), "nowhere"),  # a missing producer
    ],
)
def test_unsafe_models_stay_errors(breaks, says) -> None:
    model = _negative_dim()
    breaks(model.graph)
    with pytest.raises(anychip.AnychipError, match=says):
        anychip.load(model, devices=["cpu"])
