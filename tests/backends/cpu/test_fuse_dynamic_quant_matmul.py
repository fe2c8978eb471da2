"""``quantize_dynamic`` layers fused into one kernel (``passes/fuse_dynamic_quant_matmul.py``,
``kernels/op_dynamic_quant_matmul.py``): the same bits as the ops one by one, onnxruntime's
results within float32 rounding."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import anychip
from anychip.backends.cpu.kernels import op_dynamic_quant_matmul as fused_kernel
from anychip.backends.cpu.native import qlinear
from bench._wild_cases import _quantize_dynamic
from bench._wild_models import bert_encoder, bert_feeds, mlp

pytestmark = pytest.mark.skipif(not qlinear.available(), reason="no C compiler here")
_PASS = "fuse_dynamic_quant_matmul"


def _fusions(sess) -> dict:
    out: dict = {}
    for p in sess.placement().partitions:
        out.update(p.info.get("fusions") or {})
    return out


def _unfused(model):
    return anychip.load(model, ["cpu"], device_options={"cpu": {"disabled_passes": [_PASS]}})


def _ort(model) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("weight", ["s8", "u8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_mlp_layers_fuse(weight, per_channel, monkeypatch) -> None:
    model = _quantize_dynamic(mlp(), weight, per_channel)
    x = (np.random.default_rng(7).standard_normal((16, 32)) * 2).astype(np.float32)
    sess = anychip.load(model, ["cpu"])
    (got,) = sess.run(None, {"x": x})
    assert _fusions(sess).get(_PASS) == 3, _fusions(sess)
    (one_by_one,) = _unfused(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, one_by_one)
    (want,) = _ort(model).run(None, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(fused_kernel, "run_product", lambda *a, **k: None)
    (fallback,) = sess.run(None, {"x": x})  # the replaced ops' kernels
    np.testing.assert_array_equal(fallback, got)


def test_dynamic_bert_fuses_its_projections() -> None:
    """Two layers of six products each; the q, k and v projections read one quantized input
    (the ``DynamicQuantizeLinear`` stays, the fused node reads its outputs)."""
    model = _quantize_dynamic(bert_encoder(), "s8", False)
    feeds = bert_feeds()
    sess = anychip.load(model, ["cpu"])
    got = sess.run(None, feeds)
    assert _fusions(sess).get(_PASS, 0) == 12, _fusions(sess)
    for g, w in zip(got, _unfused(model).run(None, feeds), strict=True):
        np.testing.assert_array_equal(g, w)
    for g, w in zip(got, _ort(model).run(None, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-3)
