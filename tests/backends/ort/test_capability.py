"""What ``ort:`` devices claim and how they are listed: onnxruntime's kernel registry read
with its version rule, the deviations declared with reasons, the providers this build lacks."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto
from onnx import helper as h

import anychip
from anychip.backends.ort import capability
from anychip.cli.main import main
from anychip.core.plugin.claims import claims_of
from anychip.core.plugin.host import get_registry
from anychip.ir.dtypes import DType

CPU = "CPUExecutionProvider"


def _node(op: str, opset: int, out=TensorProto.FLOAT, **attrs):
    """The imported node of a one-node model ``op(x: float) -> y: out`` at ``opset``."""
    graph = h.make_graph(
        [h.make_node(op, ["x"], ["y"], name="n", **attrs)],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", out, [2, 3])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    from anychip.ir.onnx import import_model

    (node,) = import_model(model).graph.nodes
    return node


def test_a_kernel_registered_open_ended_serves_its_own_schema_version_only() -> None:
    reg = capability.registry(CPU)
    relu = reg.kernels[("", "Relu")]
    assert max(k.newest for k in relu) == 14  # Relu's last schema change
    assert capability.check_node(CPU, _node("Relu", 21)) is None  # opset 21 resolves to 14
    # QuantizeLinear's schema 28 has no kernel in onnxruntime 1.32 (its newest is 25): the
    # claims end before the first schema version no kernel serves
    newest = max(k.newest for k in reg.kernels[("", "QuantizeLinear")])
    schemas = reg.schemas[("", "QuantizeLinear")]
    later = [s.since_version for s in schemas if s.since_version > newest]
    claims = [c for c in claims_of_cpu() if c.op == "QuantizeLinear"]
    assert claims and all(c.until is not None and c.until < min(later, default=99) for c in claims)


def claims_of_cpu():
    return claims_of(get_registry(["ort:cpu"]).backends["ort:cpu"])


def test_claims_are_onnxruntime_s_kernels_with_declared_constraints() -> None:
    claims = claims_of_cpu()
    ops = {c.op for c in claims}
    assert {"Conv", "MatMul", "Attention", "LayerNormalization", "QuantizeLinear"} <= ops
    # left out: nested graphs, sequences and optionals, and DFT/STFT (deviations.UNCLAIMED)
    assert not ops & {"If", "Loop", "Scan", "SequenceAt", "OptionalHasElement", "DFT", "STFT"}
    relu = [c for c in claims if c.op == "Relu" and c.since <= 17 <= (c.until or 99)]
    (claim,) = relu
    assert DType.INT64 not in claim.dtypes and DType.FLOAT in claim.dtypes
    reasons = [c.reason for c in claim.constraints]
    assert any("type combinations" in r for r in reasons), reasons
    rnn = next(c for c in claims if c.op == "LSTM")
    assert any("layout 0 only" in c.reason for c in rnn.constraints)


def test_a_declared_deviation_refuses_with_its_reason() -> None:
    node = _node("Dropout", 13)
    assert capability.check_node(CPU, node) is None  # no training_mode input: inference
    backend = get_registry(["ort:cpu"]).backends["ort:cpu"]
    to_int4 = _node("Cast", 21, out=TensorProto.INT4, to=TensorProto.INT4)
    assert backend.supports(to_int4) == (
        "declared constraint: not to a 4- or 2-bit integer (onnxruntime wraps what ONNX saturates)"
    )
    assert "rounding" in capability.check_node(CPU, _dft())


def _dft():
    graph = h.make_graph(
        [h.make_node("DFT", ["x"], ["y"], name="n")],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 1])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 2])],
    )
    from anychip.ir.onnx import import_model

    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return import_model(model).graph.nodes[0]


def test_devices_lists_every_well_known_provider(capsys) -> None:
    import onnxruntime

    rows = {d.name: d for d in anychip.devices()}
    for key in ("cpu", "cuda", "tensorrt", "dml", "coreml", "qnn", "openvino", "migraphx", "cann"):
        assert f"ort:{key}" in rows
    assert rows["ort:cpu"].available
    assert rows["ort:cpu"].about.startswith(f"onnxruntime {onnxruntime.__version__} CPU")
    offered = set(onnxruntime.get_available_providers())
    if "CUDAExecutionProvider" not in offered:
        cuda = rows["ort:cuda"]
        assert not cuda.available
        assert "has no CUDAExecutionProvider" in cuda.reason and "onnxruntime-gpu" in cuda.reason
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert f"onnxruntime {onnxruntime.__version__} CPUExecutionProvider" in out
    assert main(["devices", "--ops", "ort:cpu"]) == 0
    assert "ai.onnx::Conv" in capsys.readouterr().out


def test_naming_an_absent_provider_says_why() -> None:
    import onnxruntime

    if "CUDAExecutionProvider" in onnxruntime.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    x = np.zeros((2, 3), np.float32)
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["y"])],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    with pytest.raises(anychip.DeviceError, match="has no CUDAExecutionProvider"):
        anychip.load(model, devices=["ort:cuda", "cpu"]).run(None, {"x": x})
