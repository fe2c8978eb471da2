"""Light models (``anychip.zoo``, seeded random weights) with the CPU's fusions on: the passes
fire, and the outputs equal the unfused run and onnxruntime's."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import anychip
from tests.backends.cpu._fusion_models import force_fuse_conv
from tests.models import light


@pytest.mark.parametrize(
    "name, fired",
    [
        ("squeezenet", "fuse_conv"),
        ("shufflenet", "fuse_conv"),
        ("inception_v2", "fold_conv_affine"),  # its Caffe Scale layers: Mul, Add
    ],
)
def test_light_model_fused_equals_unfused_and_onnxruntime(name, fired, monkeypatch):
    force_fuse_conv(monkeypatch)
    data = light(name).SerializeToString()
    fused = anychip.load(data, "cpu")
    plain = anychip.load(data, "cpu", device_options={"cpu": {"fusion": False}})
    inp = fused.inputs[0]
    x = np.random.default_rng(1).standard_normal(inp.shape).astype(np.float32)
    got, base = fused.run(None, {inp.name: x})[0], plain.run(None, {inp.name: x})[0]
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {inp.name: x})[
        0
    ]
    assert fused.partitions[0].info["fusions"][fired] > 0
    assert len(fused.partitions[0].graph.nodes) < len(plain.partitions[0].graph.nodes)
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(got, base, rtol=0, atol=1e-5 * scale)
