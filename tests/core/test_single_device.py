"""The whole-graph check of ``cost_search.prefer_single_device`` also runs when priority put
every node on one device: a faster device alone wins over it (GPT-like's layer sat whole on
the NPU, estimated 3.87 ms against the CPU's 3.24, and nothing compared the two)."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.core.plan import calibration as C
from anychip.core.plan.calibration_probes import OP_PROBES
from anychip.core.plugin.host import get_registry
from tests.models import transformer_layer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _save(name: str, per_unit: float, link: tuple[float, float] | None) -> None:
    """A calibration of ``name`` taking ``per_unit`` seconds per unit of work in every class
    and op (plus 1 us a node)."""
    backend = get_registry().backends[name]
    keys = [*C._CLASSES, *(f"op:{op}" for op in OP_PROBES)]
    points = {k: [(1e3, 1e-6 + 1e3 * per_unit), (1e9, 1e-6 + 1e9 * per_unit)] for k in keys}
    C._save(
        backend,
        C.Calibration(name, C.cache_key(backend), points, link, spread=dict.fromkeys(points, 0.0)),
    )


def _layer() -> bytes:
    return transformer_layer(seq=32, hidden=64, heads=4, ffn=128, causal=True).SerializeToString()


def _feeds(sess: anychip.Session) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(12)
    return {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.inputs}


def test_a_faster_device_alone_replaces_a_placement_on_one_device(cache):
    ort = pytest.importorskip("onnxruntime")
    _save("npu", 2e-10, (1e-6, 1e10))  # slower than the CPU at everything
    _save("cpu", 1e-10, None)
    model = _layer()
    sess = anychip.load(model, devices=["npu", "cpu"], calibration="cached")
    rep = sess.placement()
    assert rep.by_device() == {"cpu": len(rep.nodes)}, str(rep)
    reason = rep.nodes[0].reason
    assert "the whole graph on cpu is estimated" in reason and "on npu" in reason, reason
    feeds = _feeds(sess)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-4, atol=1e-4)


def test_a_placement_on_one_device_stays_when_it_is_estimated_faster(cache):
    _save("npu", 0.5e-10, (1e-6, 1e10))  # twice the CPU's speed, copies cheap
    _save("cpu", 1e-10, None)
    sess = anychip.load(_layer(), devices=["npu", "cpu"], calibration="cached")
    rep = sess.placement()
    assert rep.by_device() == {"npu": len(rep.nodes)}, str(rep)
