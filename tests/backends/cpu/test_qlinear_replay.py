"""The quantized ops' C calls replayed (``backends/cpu/replay``): a quantized MLP or BERT
replays its noted calls, and every replayed answer equals the kernels' answer on new inputs
(the dynamic models' scales and zero points change with each input)."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.cpu.native import qlinear
from bench._wild_cases import _quantize_dynamic, _quantize_static
from bench._wild_models import bert_encoder, bert_feeds, mlp, small_cnn

pytestmark = pytest.mark.skipif(not qlinear.available(), reason="no C compiler here")


def _replay_info(sess) -> str:
    return " ".join(str(p.info.get("replay")) for p in sess.placement().partitions)


@pytest.mark.parametrize(
    "make",
    [
        lambda: _quantize_static(mlp(), "qoperator", "u8", False),
        lambda: _quantize_static(mlp(), "qdq", "s8", True),
        lambda: _quantize_dynamic(mlp(), "s8", False),
        lambda: _quantize_dynamic(mlp(), "u8", True),
    ],
    ids=["qoperator", "qdq", "dynamic", "dynamic-u8-per-channel"],
)
def test_replayed_quantized_mlp_equals_its_kernels(make) -> None:
    model = make()
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    rng = np.random.default_rng(29)
    for i in range(14):
        x = (rng.standard_normal((16, 32)) * (0.5 + i % 4)).astype(np.float32)
        (got,) = sess.run(None, {"x": x})
        (want,) = plain.run(None, {"x": x})
        np.testing.assert_array_equal(got, want)
    assert "replayed" in _replay_info(sess), _replay_info(sess)


def test_small_quantized_cnn_with_the_replay_on_equals_its_kernels() -> None:
    """A QOperator CNN: its trace fails the replay's own check today (decision 053; the
    kernels answer then), so whatever the replay keeps, the answers are the kernels'."""
    model = _quantize_static(small_cnn(), "qoperator", "u8", False)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    rng = np.random.default_rng(5)
    for _ in range(12):
        x = rng.standard_normal((2, 3, 16, 16)).astype(np.float32)
        for g, w in zip(sess.run(None, {"x": x}), plain.run(None, {"x": x}), strict=True):
            np.testing.assert_array_equal(g, w)


def test_replayed_dynamic_bert_equals_its_kernels() -> None:
    model = _quantize_dynamic(bert_encoder(), "s8", False)
    sess = anychip.load(model, ["cpu"])
    plain = anychip.load(model, ["cpu"], device_options={"cpu": {"replay": False}})
    base = bert_feeds()
    rng = np.random.default_rng(3)
    for _ in range(14):
        feeds = dict(base)
        ids = next(k for k, v in base.items() if v.dtype.kind == "i" and v.max() > 2)
        feeds[ids] = rng.integers(0, int(base[ids].max()) + 1, base[ids].shape).astype(
            base[ids].dtype
        )
        for g, w in zip(sess.run(None, feeds), plain.run(None, feeds), strict=True):
            np.testing.assert_array_equal(g, w)
    assert "replayed" in _replay_info(sess), _replay_info(sess)
