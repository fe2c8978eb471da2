"""Models onnxruntime runs although onnx.checker refuses them (bench/_wild_cases.py builds
them): anychip repairs each with a warning naming the problem and gives onnxruntime's
result; unsafe models stay errors."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import anychip
from bench._wild_cases import OLD_EXPORTER_MODELS
from tests.wild._compare import anychip_run, assert_same, ort_run

_X = np.random.default_rng(19).standard_normal((2, 3)).astype(np.float32)
_CHECKER_REFUSES = {
    "initializer not a graph input (IR 3)",
    "value_info and output without a type",
    "output type without a shape field",
    "domain spelled ai.onnx",
    "empty graph name",
    "LayerNormalization at opset 13",
}


@pytest.mark.parametrize("name", sorted(OLD_EXPORTER_MODELS))
def test_repaired_like_onnxruntime(name) -> None:
    build, warned = OLD_EXPORTER_MODELS[name]
    model = build()
    if name in _CHECKER_REFUSES:
        with pytest.raises(onnx.checker.ValidationError):
            onnx.checker.check_model(model)
    want = ort_run(model, {"x": _X})
    got, warnings = anychip_run(model, {"x": _X})
    assert_same(got, want)
    if warned is not None:
        assert any(warned in w for w in warnings), warnings


def test_repair_leaves_the_callers_proto_alone() -> None:
    model = OLD_EXPORTER_MODELS["empty graph name"][0]()
    anychip_run(model, {"x": _X})
    assert model.graph.name == ""


def _fields(node: onnx.NodeProto) -> dict:
    return {"op_type": node.op_type, "input": list(node.input), "output": list(node.output)}


@pytest.mark.parametrize(
    "breaks, says",
    [
        (lambda g: g.input[0].ClearField("type"), "x"),  # an input of unknown type
        (lambda g: g.node[0].input.__setitem__(0, "nowhere"), "nowhere"),  # no producer
        (lambda g: g.node.append(onnx.NodeProto(**_fields(g.node[0]))), "static"),  # 2 producers
    ],
)
def test_unsafe_models_stay_errors(breaks, says) -> None:
    model = OLD_EXPORTER_MODELS["dim_value -1"][0]()
    breaks(model.graph)
    with pytest.raises(anychip.AnychipError, match=says):
        anychip.load(model, devices=["cpu"])
