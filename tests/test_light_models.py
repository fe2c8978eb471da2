"""The nine light CNNs bundled with onnx: against their expected ``*_output_0.pb`` files,
against onnxruntime with seeded random weights (``anychip.zoo``). (Their IR round trip through
onnxruntime is in tests/ir/test_onnx_export.py; on ``xpu,cpu`` and ``npu,cpu`` they run again
in tests/test_onnx_backend.py.)

Why logits: the shipped models fill every weight with 0.02, so every class's score is the same
number in exact arithmetic (about 1e10 on SqueezeNet) and the expected output is a uniform
Softmax. In float32 one rounding step inside a Conv decides which class wins, so no summation
order can match the expected probabilities bit for bit. Models ending in Softmax are therefore
compared on their pre-Softmax logits, with a tolerance relative to the logits' magnitude.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import anychip
from anychip.zoo import LIGHT_MODELS, light_model_path
from tests.models import light

#: Logits are compared to 1e-5 of their largest magnitude: float32 accumulations over
#: thousands of terms in another order differ by a few ulps of the sum's magnitude.
LOGIT_RTOL = 1e-5


def test_all_nine_are_bundled():
    assert len(LIGHT_MODELS) == 9
    for name in LIGHT_MODELS:
        onnx.load(light_model_path(name), load_external_data=False)


@functools.cache
def _logits_info(name: str) -> onnx.ValueInfoProto | None:
    """The type of the input of ``name``'s final Softmax (None: it ends otherwise), inferred on
    the shipped model, whose weights are computed at run time and cost nothing to infer."""
    shipped = onnx.load(light_model_path(name))
    last = shipped.graph.node[-1]
    if last.op_type != "Softmax":
        return None
    inferred = onnx.shape_inference.infer_shapes(shipped, data_prop=True)
    return next(v for v in inferred.graph.value_info if v.name == last.input[0])


def _with_logits(model: onnx.ModelProto, name: str) -> tuple[onnx.ModelProto, bool]:
    """The model with its final Softmax's input added as a second output, and whether it has
    one."""
    info = _logits_info(name)
    if info is None:
        return model, False
    model.graph.output.append(info)
    return model, True


def _feed(sess: anychip.Session, seed: int = 0) -> dict[str, np.ndarray]:
    info = next(i for i in sess.inputs if not i.optional)
    rng = np.random.default_rng(seed)
    return {info.name: rng.random(info.shape, dtype=np.float32)}


#: Their fully connected layers hold 240-550 MB of weights: with random weights each takes
#: 6-20 s to make, load and run twice, and 0.4-1.5 s CPU loaded as shipped (their weights
#: folded from constant fills at load), so they run in the full suite (``-m slow``); the
#: other six cover every op kind of theirs.
_BIG = {"bvlc_alexnet", "vgg19", "zfnet512"}


def _slow_if_big(names: list[str]) -> list:
    return [pytest.param(n, marks=pytest.mark.slow) if n in _BIG else n for n in names]


def _assert_logits_close(got: np.ndarray, want: np.ndarray) -> None:
    scale = float(np.max(np.abs(want)))
    assert scale > 0
    np.testing.assert_allclose(got, want, rtol=0, atol=LOGIT_RTOL * scale)


@pytest.mark.parametrize("name", _slow_if_big(LIGHT_MODELS))
def test_light_model_matches_expected_output(name):
    path = light_model_path(name)
    model, has_logits = _with_logits(onnx.load(path), name)
    sess = anychip.load(model, devices=["cpu"])
    got = sess.run(None, _feed(sess))
    want = numpy_helper.to_array(onnx.load_tensor(path[: -len(".onnx")] + "_output_0.pb"))
    if not has_logits:
        np.testing.assert_allclose(got[0], want, rtol=1e-3, atol=1e-5)
        return
    # Softmax(logits) == want means logits - max(logits) == log(want) - max(log(want)).
    logits = got[1].reshape(want.shape)
    log_p = np.log(want.astype(np.float64))
    scale = float(np.max(np.abs(logits)))
    np.testing.assert_allclose(
        logits - logits.max(), log_p - log_p.max(), rtol=0, atol=LOGIT_RTOL * scale + 1e-6
    )


@pytest.mark.parametrize("name", _slow_if_big(LIGHT_MODELS))
def test_light_model_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    model, has_logits = _with_logits(light(name, seed=1), name)
    data = model.SerializeToString()
    sess = anychip.load(data, devices=["cpu"])
    feeds = _feed(sess, seed=2)
    got = sess.run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-3, atol=1e-5)
    if has_logits:
        _assert_logits_close(got[1], want[1])
    # Random weights make the classes differ: a runtime that got them wrong cannot agree.
    assert np.ptp(want[-1]) > 1e-3
