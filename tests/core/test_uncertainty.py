"""A first placement that is right or safe (decisions/032): a mixed placement is kept over the
best single device only when its estimated gain exceeds the estimate's own uncertainty; a
device with no measurements here is not trusted at all; lone cheap ops stay on the host."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.core.plan import calibration as C
from anychip.core.plugin.host import get_registry
from bench.mixed_model import attention_mix


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _save(
    name: str, fast: dict[str, float], link=None, spread: float = 0.0, rest: float = 1e-10
) -> None:
    """Figures of ``name``: seconds per unit of work by key (``rest`` elsewhere), every key
    with the sweeps' ``spread``."""
    backend = get_registry().backends[name]
    points = {}
    for k in C.keys():
        s = fast.get(k, rest)
        points[k] = [(1e3, 1e-6 + 1e3 * s), (1e9, 1e-6 + 1e9 * s)]
    cal = C.Calibration(name, C.cache_key(backend), points, link)
    cal.spread = dict.fromkeys(points, spread)
    C._save(backend, cal)


MODEL = attention_mix(batch=1, seq=512, d=64, heads=4)  # attention most of the work


def _check(sess: anychip.Session) -> None:
    ort = pytest.importorskip("onnxruntime")
    x = np.random.default_rng(3).standard_normal((1, 512, 64)).astype(np.float32)
    want = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_clear_gain_keeps_the_mixed_placement(cache):
    # attention 1000x faster on the XPU, the rest 3x slower
    _save("xpu", {"attention": 1e-13}, (1e-6, 4e10), rest=3e-10)
    _save("cpu", {})
    sess = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="cached")
    by_device = sess.placement().by_device()
    assert by_device.get("xpu", 0) >= 4 and by_device["cpu"] > 4, str(sess.placement())
    _check(sess)


def test_a_gain_within_the_uncertainty_starts_on_the_best_single_device(cache):
    """The same figures measured with sweeps 300% apart: the gain is not trusted, and the
    session starts on the CPU alone, the reason naming the uncertainty."""
    _save("xpu", {"attention": 1e-13}, (1e-6, 4e10), spread=3.0, rest=3e-10)
    _save("cpu", {}, spread=3.0)
    sess = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="cached")
    rep = sess.placement()
    assert rep.by_device() == {"cpu": len(rep.nodes)}, str(rep)
    reasons = {n.reason for n in rep.nodes}
    assert any("within the estimate's uncertainty" in r for r in reasons), reasons
    _check(sess)


def test_an_unmeasured_device_is_not_trusted_whatever_it_declares(cache):
    """No calibration of the XPU here (a new device): its declared figures decide nothing,
    the first placement is the CPU alone; with calibration ``off`` (declared figures chosen)
    the XPU is used as before."""
    _save("cpu", {})
    sess = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="cached")
    rep = sess.placement()
    assert rep.by_device() == {"cpu": len(rep.nodes)}, str(rep)
    assert "unmeasured figures" in rep.nodes[0].reason or "estimated" in rep.nodes[0].reason
    if "unmeasured figures" in rep.nodes[0].reason:  # and how to measure it now
        assert "anychip calibrate --device xpu" in rep.nodes[0].reason
    declared = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="off")
    assert declared.placement().by_device().get("xpu", 0) > 0
    _check(sess)


def test_a_lone_cheap_op_is_never_parked_on_an_accelerator(cache, monkeypatch):
    """Pow measured 1000x faster on the XPU behind a fast link, but alone there and cheap on
    the CPU (40 us): it stays (the XPU is 3x slower than the CPU at the rest, fast at
    attention). Without the rule the moves would have taken it there."""
    _save("xpu", {"attention": 1e-13, "op:Pow": 1e-13}, (1e-7, 1e12), rest=3e-10)
    _save("cpu", {"op:Pow": 3e-10})
    sess = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="cached")
    (pow_node,) = [n for n in sess.placement().nodes if n.op_type == "Pow"]
    assert pow_node.device == "cpu" and "a lone Pow" in pow_node.reason, pow_node.reason
    assert sess.placement().by_device().get("xpu", 0) >= 4
    _check(sess)
    from anychip.core.plan import placement

    monkeypatch.setattr(placement, "no_lone_cheap_ops", lambda *a: [])
    without = anychip.load(MODEL, devices=["xpu", "cpu"], calibration="cached")
    assert [n.device for n in without.placement().nodes if n.op_type == "Pow"] == ["xpu"]
