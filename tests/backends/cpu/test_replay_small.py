"""A small MLP (the CPU fuses it into two FusedGemm and a Softmax) is replayed whole: the lean
FusedGemm and the C Softmax note their calls and seal, so every node of the trace is a noted
call; every run equals onnxruntime on new inputs."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from anychip.backends.cpu.replay import run as replay


@pytest.fixture(autouse=True)
def _no_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay's timing rules off: a busy machine's timings would decide the test."""
    monkeypatch.setattr(replay, "SLOW_NODE", float("inf"))
    monkeypatch.setattr(replay, "GAIN", float("inf"))


def _mlp(opset: int, rng: np.random.Generator) -> onnx.ModelProto:
    w = {
        "W1": rng.standard_normal((16, 32)),
        "b1": rng.standard_normal(32),
        "W2": rng.standard_normal((32, 4)),
        "b2": rng.standard_normal(4),
    }
    nodes = [
        h.make_node("MatMul", ["x", "W1"], ["a"]),
        h.make_node("Add", ["a", "b1"], ["b"]),
        h.make_node("Relu", ["b"], ["c"]),
        h.make_node("MatMul", ["c", "W2"], ["d"]),
        h.make_node("Add", ["d", "b2"], ["e"]),
        h.make_node("Softmax", ["e"], ["y"], axis=-1 if opset >= 13 else 1),
    ]
    g = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 16])],
        [h.make_tensor_value_info("y", T.FLOAT, [3, 4])],
        [nh.from_array(v.astype(np.float32), k) for k, v in w.items()],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [11, 17])
def test_small_mlp_is_replayed_whole(opset) -> None:
    rng = np.random.default_rng(opset)
    model = _mlp(opset, rng)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = anychip.load(model, devices=["cpu"], device_options={"cpu": {"thread_choice": False}})
    (pm,) = sess.compiled.part_memory.values()
    r = pm.around.__self__
    ops = sorted(n.op_type for n in sess.compiled.partitions[0].graph.nodes)
    assert ops == ["FusedGemm", "FusedGemm", "Softmax"], ops
    replayed = 0
    for _ in range(replay.REPLAY_FROM + 6):
        x = rng.standard_normal((3, 16)).astype(np.float32)
        replayed += bool(r.traces)
        (got,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(got, ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert replayed >= 6, r.info
    (trace,) = r.traces.values()
    assert trace.sealed == trace.total == 3, r.info
