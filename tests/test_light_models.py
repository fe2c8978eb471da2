"""The nine light CNNs bundled with onnx: outputs against the expected ``*_output_0.pb``
files, against onnxruntime on the same random input, and the IR round trip through onnxruntime.
"""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import anychip
from anychip.ir.onnx import export_model, import_model

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
MODELS = sorted(
    os.path.basename(p)[len("light_") : -len(".onnx")]
    for p in glob.glob(os.path.join(LIGHT, "light_*.onnx"))
)


def test_all_nine_are_bundled():
    assert len(MODELS) == 9, MODELS


def _feed(sess: anychip.Session) -> dict[str, np.ndarray]:
    info = next(i for i in sess.inputs if not i.optional)
    rng = np.random.default_rng(0)
    return {info.name: rng.random(info.shape, dtype=np.float32)}


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_expected_output(name):
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    sess = anychip.load(path, devices=["cpu"])
    (got,) = sess.run(None, _feed(sess))
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(LIGHT, f"light_{name}_output_0.pb")))
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_light_model_matches_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    sess = anychip.load(path, devices=["cpu"])
    feeds = _feed(sess)
    (got,) = sess.run(None, feeds)
    (want,) = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_round_trip_runs_in_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    path = os.path.join(LIGHT, f"light_{name}.onnx")
    exported = export_model(import_model(path))
    onnx.checker.check_model(exported)
    original = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    again = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"])
    info = original.get_inputs()[0]
    x = np.random.default_rng(1).random(info.shape, dtype=np.float32)
    np.testing.assert_allclose(
        again.run(None, {info.name: x})[0],
        original.run(None, {info.name: x})[0],
        rtol=1e-5,
        atol=1e-6,
    )
