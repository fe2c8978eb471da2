"""Whole models on ``opencl`` alone (strict) against onnxruntime: the light ResNet-50 with
seeded random weights, and the BERT-like and GPT-like encoder layers; then ``opencl,cpu``."""

from __future__ import annotations

import gc

import numpy as np
import onnxruntime as ort
import pytest

import anychip
from tests.models import light, transformer_layer

pytestmark = pytest.mark.usefixtures("cl_device")


def _feeds(model, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for inp in model.graph.input:
        if any(i.name == inp.name for i in model.graph.initializer):
            continue
        shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
        out[inp.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def _compare(model, devices, rtol: float, atol: float) -> anychip.Session:
    feeds = _feeds(model)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    sess = anychip.load(model, devices=devices, strict=True)
    got = sess.run(None, feeds)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
    return sess


def test_light_resnet50_strict(cl_device):
    model = light("resnet50")
    # The model ends in Softmax: compare its logits too (the probabilities hide errors).
    from tests.test_light_models import _with_logits

    model, _ = _with_logits(model, "resnet50")
    gc.collect()  # an earlier test's session may still hold device memory until collected
    before = cl_device.pool.stats().in_use
    sess = _compare(model, ["opencl"], rtol=1e-4, atol=1e-4)
    by = sess.placement().by_device()
    assert set(by) == {"opencl"} and by["opencl"] > 100
    del sess
    gc.collect()
    assert cl_device.pool.stats().in_use == before  # weights and activations all released


@pytest.mark.parametrize("causal", [False, True], ids=["bert_like", "gpt_like"])
def test_transformer_layer_strict(causal):
    sess = _compare(transformer_layer(causal=causal), ["opencl"], rtol=1e-4, atol=1e-4)
    assert sess.placement().by_device() == {"opencl": 28 if causal else 27}


def test_heterogeneous_with_cpu():
    """``opencl,cpu`` with the cost model: whatever it places where, the answer is right."""
    model = transformer_layer(seq=16, hidden=64, heads=2, ffn=128, seed=3)
    feeds = _feeds(model, seed=1)
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    sess = anychip.load(model, devices=["opencl", "cpu"])
    np.testing.assert_allclose(sess.run(None, feeds)[0], ref[0], rtol=1e-4, atol=1e-4)
    forced = anychip.load(model, devices=["opencl", "cpu"], cost_model=False)
    np.testing.assert_allclose(forced.run(None, feeds)[0], ref[0], rtol=1e-4, atol=1e-4)
    assert forced.placement().by_device().get("opencl", 0) == 27


def test_two_threads_share_one_session():
    """One session run from two threads at once (one queue, one pool, one program cache)."""
    import threading

    model = transformer_layer(seq=8, hidden=32, heads=2, ffn=64, seed=5)
    sess = anychip.load(model, devices=["opencl"], strict=True)
    rng = np.random.default_rng(7)
    xs = [rng.standard_normal((1, 8, 32)).astype(np.float32) for _ in range(2)]
    ref = ort.InferenceSession(model.SerializeToString())
    want = [ref.run(None, {"x": x})[0] for x in xs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(5):
                np.testing.assert_allclose(
                    sess.run(None, {"x": xs[i]})[0], want[i], rtol=1e-4, atol=1e-4
                )
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
