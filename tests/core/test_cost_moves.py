"""Each device takes the part it is faster at: the node-level moves of ``core/plan/cost_moves.py``
on the demo model (GPT-2's block, ``bench/mixed_model.py``) with fixed measured figures, and
the per-op calibration points (``op:<type>``) measured on first use."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.core.plan import calibration as C
from anychip.core.plan.calibration_probes import OP_PROBES
from anychip.core.plugin.host import get_registry
from bench.mixed_model import attention_mix

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()),
    reason="the XPU driver could not be built here (no C compiler)",
)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _line(per_unit: float) -> list[tuple[float, float]]:
    """Points of a device that takes ``per_unit`` seconds per unit of work (plus 1 us)."""
    return [(1e3, 1e-6 + 1e3 * per_unit), (1e9, 1e-6 + 1e9 * per_unit)]


def _save(name: str, fast: set[str], link: tuple[float, float] | None) -> None:
    """A calibration of ``name`` fast (1e-12 s per unit) at the classes and ops in ``fast``,
    slow (1e-9) at the others."""
    backend = get_registry().backends[name]
    keys = [*C._CLASSES, *(f"op:{op}" for op in OP_PROBES)]
    points = {k: _line(1e-12 if k in fast else 1e-9) for k in keys}
    C._save(
        backend,
        C.Calibration(name, C.cache_key(backend), points, link, spread=dict.fromkeys(points, 0.0)),
    )


def test_the_demo_block_is_split_where_each_device_is_faster(cache):
    """The XPU measured fast at attention (the fused chain), Pow and LayerNormalization, the
    CPU at the rest: the attention products go to the XPU, the projections and the other
    element-wise ops to the CPU, with no pins; Pow and the norms, faster on the XPU but alone
    there and cheap on the CPU, stay on the CPU; the result matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    _save("xpu", {"attention", "op:Pow", "op:LayerNormalization"}, (1e-7, 1e11))
    _save("cpu", {"linear", "elementwise", "data", "reduce", "op:Tanh", "op:Add", "op:Mul"}, None)
    model = attention_mix(batch=2, seq=64, d=64, heads=4)
    sess = anychip.load(model, devices=["xpu", "cpu"], calibration="cached")
    nodes = {n.name: n for n in sess.placement().nodes}
    on = {dev: {n.op_type for n in nodes.values() if n.device == dev} for dev in ("xpu", "cpu")}
    assert {"MatMul", "Softmax"} <= on["xpu"], str(sess.placement())
    assert {"Tanh", "MatMul", "Transpose", "Pow", "LayerNormalization"} <= on["cpu"]
    linear = [n for n in nodes.values() if n.op_type == "MatMul" and n.device == "cpu"]
    assert len(linear) == 6  # q, k, v, out, ffn1, ffn2: the weight products
    assert "a lone Pow" in nodes["Pow_21"].reason and "not worth a device" in nodes["Pow_21"].reason
    x = np.random.default_rng(0).standard_normal((2, 64, 64)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def test_no_move_when_the_copies_cost_more(cache):
    """Same figures, but a link so slow that any copy outweighs the savings: one device."""
    _save("xpu", {"matmul", "op:Pow", "op:LayerNormalization"}, (1.0, 1e3))
    _save("cpu", {"linear", "elementwise", "data", "reduce", "op:Tanh"}, None)
    sess = anychip.load(attention_mix(batch=1, seq=16, d=32, heads=2), devices=["xpu", "cpu"],
                        calibration="cached")  # fmt: skip
    assert len(sess.placement().by_device()) == 1


def test_pricing_never_measures_or_rewrites_the_calibration(cache, monkeypatch):
    """A calibration is complete and fixed: a placement in ``auto`` mode reads it, measures
    nothing (not an op missing from it either) and leaves the file byte for byte."""
    cpu = get_registry().backends["cpu"]
    _save("xpu", set(), (1e-7, 1e11))
    _save("cpu", set(), None)
    cal = C.load_calibration(cpu)
    del cal.points["op:Tanh"]
    C._save(cpu, cal)
    files = sorted((cache / "calibration").glob("*.json"))
    before = [f.read_bytes() for f in files]

    def boom(*a, **k):
        raise AssertionError("a placement measured")

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", boom)
    model = attention_mix(batch=1, seq=16, d=32, heads=2)
    for mode in ("cached", "auto"):
        anychip.load(model, devices=["xpu", "cpu"], calibration=mode)
    assert [f.read_bytes() for f in sorted((cache / "calibration").glob("*.json"))] == before


def test_unknown_op_points_make_a_calibration_file_invalid():
    data = {"format": C.FORMAT, "device": "cpu", "key": "k", "link": None, "seconds": 1.0}
    C.Calibration.from_json({**data, "points": {"op:Tanh": [[1.0, 1.0]]}})
    with pytest.raises(ValueError, match="op:Foo"):
        C.Calibration.from_json({**data, "points": {"op:Foo": [[1.0, 1.0]]}})
