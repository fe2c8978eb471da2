"""NaN and Inf through every fusion pattern on every device (issue 47): fused activations,
Max/Min, reductions and ArgMax give what the unfused graph gives.

The reference is onnxruntime for the fusion patterns; for ReduceMax/ReduceMin and
ArgMax/ArgMin it is ONNX's reference evaluator, because onnxruntime skips NaN there (its
ReduceMax of [NaN, 1] is 1, its ArgMax points past a NaN) while the ONNX reference, numpy and
every anychip device propagate it; what is checked is that no device or fusion departs from
the unfused semantics.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

import anychip
from anychip.backends.cpu.replay import run as replay
from tests.reliability.nan_models import PATTERNS, nonfinite_input

DEVICE_SETS = ["cpu", "xpu,cpu", "opencl,cpu", "npu,cpu"]
_ORT_DIFFERS = ("reduce_max", "reduce_min", "argmax", "argmin")


def _reference(name: str, model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    if name in _ORT_DIFFERS:
        return ReferenceEvaluator(model).run(None, {"x": x})[0]
    ort = pytest.importorskip("onnxruntime")
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def _assert_same(y: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert y.shape == ref.shape, what
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref), err_msg=f"{what}: NaN positions")
    np.testing.assert_array_equal(np.isinf(y), np.isinf(ref), err_msg=f"{what}: Inf positions")
    finite = np.isfinite(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=1e-4, atol=1e-4, err_msg=what)


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize("optimize", [True, False], ids=["optimize", "plain"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_nonfinite_inputs_match_the_unfused_graph(name: str, optimize: bool, devices: str) -> None:
    rng = np.random.default_rng(47)
    model = PATTERNS[name](rng)
    x = nonfinite_input(model, rng)
    ref = _reference(name, model, x)
    sess = anychip.load(model, devices=devices.split(","), optimize=optimize, cost_model=False)
    _assert_same(sess.run(None, {"x": x})[0], ref, f"{name} on {devices}")


def test_conv_relu_keeps_nan_in_a_replayed_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's replay runs the recorded oneDNN calls without the kernel's Python: a NaN that
    first shows after the recording must still come out as NaN."""
    monkeypatch.setattr(replay, "SLOW_NODE", float("inf"))  # no timing rules (test_replay.py)
    monkeypatch.setattr(replay, "GAIN", float("inf"))
    rng = np.random.default_rng(3)
    model = PATTERNS["conv_clip"](rng)
    model.graph.node[-1].output[0] = "clipped"  # a second instruction: replay needs two
    model.graph.node.append(onnx.helper.make_node("Neg", ["clipped"], ["y"]))
    sess = anychip.load(model, devices=["cpu"])
    (pm,) = sess.compiled.part_memory.values()
    finite = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    for _ in range(replay.REPLAY_FROM):
        sess.run(None, {"x": finite})
    assert pm.around is not None and pm.around.__self__.traces, "the partition was not recorded"
    x = nonfinite_input(model, rng)
    _assert_same(sess.run(None, {"x": x})[0], _reference("conv_clip_neg", model, x), "replayed")
    assert np.isnan(x).any()
    _assert_same(
        sess.run(None, {"x": finite})[0], _reference("conv_clip_neg", model, finite), "after"
    )
