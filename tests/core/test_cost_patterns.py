"""Attention chains priced as the fused kernel (``core/plan/cost_patterns.py``), head-split
Transposes by the ``data_rows`` class, and the moves searched from both ends
(``core/plan/cost_moves.py``): with measured figures under which the split is cheaper, the demo
block (``bench/mixed_model.py``) is split, attention on the XPU and the rest on the CPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import anychip
from anychip.core.compile.pipeline import resolve_schemas
from anychip.core.plan import calibration as C
from anychip.core.plan.calibration_probes import OP_PROBES
from anychip.core.plan.cost_patterns import attention_chains
from anychip.core.plan.cost_search import Costs
from anychip.core.plugin.host import get_registry
from anychip.ir.onnx import import_model
from bench.mixed_model import attention_mix

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()),
    reason="the XPU driver could not be built here (no C compiler)",
)

ATTENTION = ("MatMul_10", "Mul_11", "Softmax_12", "MatMul_13")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _graph(model: bytes):
    m = import_model(model)
    resolve_schemas(m, get_registry().schemas)
    return m.graph


def _cal(name: str, per_unit: dict[str, float], link=None) -> C.Calibration:
    """A calibration of ``name``: seconds per unit of work by class or op (default 1e-10)."""
    backend = get_registry().backends[name]
    keys = [*C._CLASSES, *(f"op:{op}" for op in OP_PROBES)]
    points = {}
    for k in keys:
        s = per_unit.get(k, 1e-10)
        points[k] = [(1e3, 1e-6 + 1e3 * s), (1e9, 1e-6 + 1e9 * s)]
    return C.Calibration(
        name, C.cache_key(backend), points, link, spread=dict.fromkeys(points, 0.0)
    )


def _save_machine_like_figures() -> None:
    """Cached calibrations shaped like this machine's: the XPU 1.6x faster at the fused
    attention and the head transposes, 2x at LayerNormalization, 10% slower at the weight
    products and 3x at the element-wise ops, over a 40 GB/s link; the CPU at the prior."""
    base = 1e-10
    xpu = {"attention": base / 1.6, "data_rows": base / 1.6, "op:LayerNormalization": base / 2}
    xpu |= {"linear": base * 1.1} | {f"op:{op}": base * 3 for op in ("Add", "Mul", "Pow", "Tanh")}
    reg = get_registry()
    C._save(reg.backends["xpu"], _cal("xpu", xpu, (1e-5, 4e10)))
    C._save(reg.backends["cpu"], _cal("cpu", {}))


def test_the_attention_chain_is_found_with_its_work():
    g = _graph(attention_mix(batch=2, seq=16, d=32, heads=4))
    chains = attention_chains(g)
    names = sorted(n.name for n in chains)
    assert names == sorted(ATTENTION)
    chain, work = next(iter(chains.values()))
    assert [n.name for n in chain] == list(ATTENTION)
    assert work == 2.0 * (2 * 4 * 16 * 16) * (8 + 8)  # scores elements x (head + head)


def test_no_chain_when_the_scores_have_another_reader():
    proto = onnx.load_from_string(attention_mix(batch=1, seq=8, d=16, heads=2))
    extra = onnx.helper.make_node("Relu", ["scores"], ["scores_relu"])
    proto.graph.node.append(extra)
    proto.graph.output.append(onnx.helper.make_tensor_value_info("scores_relu", 1, None))
    assert attention_chains(_graph(proto.SerializeToString())) == {}


def test_each_node_of_a_chain_gets_an_equal_share_of_the_measured_chain():
    g = _graph(attention_mix(batch=2, seq=16, d=32, heads=4))
    reg = get_registry()
    backends = [reg.backends["xpu"], reg.backends["cpu"]]
    cal = _cal("xpu", {"attention": 4e-11})
    costs = Costs(backends, {"xpu": cal})
    chain, work = next(iter(attention_chains(g).values()))
    for n in chain:
        assert costs.node(n, "xpu") == pytest.approx(cal.time("attention", work) / 4)
    # Without measured attention points the nodes are priced one by one.
    del cal.points["attention"]
    plain = Costs(backends, {"xpu": cal})
    assert plain.node(chain[0], "xpu") == pytest.approx(cal.time("matmul", 2 * 8 * 16 * 16 * 8))


def test_head_split_transposes_are_priced_as_row_copies():
    g = _graph(attention_mix(batch=2, seq=16, d=32, heads=4))
    reg = get_registry()
    cal = _cal("cpu", {"data": 1e-8, "data_rows": 1e-10})
    costs = Costs([reg.backends["cpu"]], {"cpu": cal})
    t = {n.name: costs.node(n, "cpu") for n in g.nodes if n.op_type == "Transpose"}
    elements = 2 * 16 * 32
    assert t["Transpose_5"] == pytest.approx(cal.time("data_rows", elements))  # perm 0,2,1,3
    assert t["Transpose_7"] == pytest.approx(cal.time("data", elements))  # perm 0,2,3,1
    from anychip.core.plan.cost import node_time

    concat = onnx.helper.make_node("Concat", ["a", "b"], ["c"], axis=1)
    a, b = (onnx.helper.make_tensor_value_info(x, 1, [64, 32]) for x in "ab")
    c = onnx.helper.make_tensor_value_info("c", 1, [64, 64])
    proto = onnx.helper.make_model(
        onnx.helper.make_graph([concat], "cat", [a, b], [c]),
        opset_imports=[onnx.helper.make_opsetid("", 17)],
    )
    node = _graph(proto.SerializeToString()).nodes[0]
    got = node_time(node, reg.backends["cpu"].device, cal)
    assert got == pytest.approx(cal.time("data_rows", 64 * 64))  # blocks, not a transpose


def test_the_block_is_split_when_measured_costs_make_the_split_cheaper(cache):
    """Figures shaped like this machine's: the XPU runs the fused attention and the head
    transposes 1.6x faster and LayerNormalization 2x, the weight products 10% slower and the
    element-wise ops 3x slower, over a 40 GB/s link. The attention (with its transposes) goes
    to the XPU, the weight products and the GELU to the CPU, no single device is preferred,
    and the result matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    _save_machine_like_figures()
    model = attention_mix(batch=1, seq=1024, d=128, heads=4)  # bench/placement.py's attention_1k
    sess = anychip.load(model, devices=["xpu", "cpu"], calibration="cached")
    rep = sess.placement()
    device = {n.name: n.device for n in rep.nodes}
    assert all(device[n] == "xpu" for n in ATTENTION), str(rep)
    assert device["Transpose_5"] == "xpu"
    weight_products = ("MatMul_1", "MatMul_2", "MatMul_3", "MatMul_16", "MatMul_19", "MatMul_29")
    assert all(device[n] == "cpu" for n in weight_products), str(rep)
    assert device["Tanh_25"] == "cpu" and device["Pow_21"] == "cpu"
    assert "estimated" in rep.decision and "single" not in rep.decision
    x = np.random.default_rng(0).standard_normal((1, 1024, 128)).astype(np.float32)
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want[0], rtol=1e-4, atol=1e-4)


def test_the_moves_start_from_both_ends_and_the_lower_estimate_wins(cache, monkeypatch):
    """``move_faster_groups`` searches from the priority placement and from the host-only
    one and applies the result estimated faster (each start's own search, unchanged)."""
    from anychip.core.plan import cost_moves, cost_search

    reg = get_registry()
    C._save(reg.backends["xpu"], _cal("xpu", {"attention": 1e-11}, (1e-5, 4e10)))
    C._save(reg.backends["cpu"], _cal("cpu", {}))
    starts, results = [], []
    search, estimate = cost_moves._search, cost_search.estimate

    def recording_search(graph, backends, capable, costs, device_of):
        starts.append(set(device_of.values()))
        return search(graph, backends, capable, costs, device_of)

    def recording_estimate(graph, device_of, costs, host):
        e = estimate(graph, device_of, costs, host)
        results.append((e.seconds, dict(device_of)))
        return e

    monkeypatch.setattr(cost_moves, "_search", recording_search)
    monkeypatch.setattr(cost_search, "estimate", recording_estimate)
    # The rules after the moves (lone cheap ops, the uncertainty of the gain) are
    # tests/core/test_uncertainty.py's: here the moves alone.
    from anychip.core.plan import placement

    monkeypatch.setattr(placement, "no_lone_cheap_ops", lambda *a: [])
    monkeypatch.setattr(placement, "prefer_safe_device", lambda *a: None)
    model = attention_mix(batch=2, seq=64, d=64, heads=4)
    sess = anychip.load(model, devices=["xpu", "cpu"], calibration="cached")
    assert {"cpu"} in starts and len(starts) == 2
    searched = results[:2]  # the two searches' results, estimated before anything else
    best = min(searched, key=lambda r: r[0])[1]
    placed = {n.name: n.device for n in sess.placement().nodes}
    assert {n.name: d for n, d in best.items()} == placed


def test_the_placement_bench_refuses_a_device_set_it_cannot_run(capsys):
    from bench import placement

    with pytest.raises(SystemExit):
        placement.main(["--models", "mlp", "--sets", "cpu;nosuchchip,cpu"])
    assert "--sets names nosuchchip, not an available device" in capsys.readouterr().err


def test_a_masked_chain_is_priced_from_the_masked_class():
    """A masked chain may run unfused (GPT-like's on the XPU, 16x the unmasked class): it is
    read from ``attention_mask``, measured up front like every class, never on first use."""
    from tests.models import transformer_layer

    graph = _graph(transformer_layer(seq=32, hidden=64, heads=4, ffn=128, causal=True))
    chains = {chain for chain, _ in attention_chains(graph).values()}
    (chain,) = chains
    assert len(chain) == 5 and chain[2].op_type == "Add"  # the mask
    cal = _cal("xpu", {"attention_mask": 3e-10})
    costs = Costs([get_registry().backends["xpu"]], {"xpu": cal})
    masked = sum(costs.node(n, "xpu") for n in chain)
    work = attention_chains(graph)[chain[0]][1]
    assert masked == pytest.approx(cal.time("attention_mask", work))
    assert masked > 2 * cal.time("attention", work)


def test_the_masked_probe_computes_what_onnxruntime_does():
    """The ``attention_mask`` class's probe: a chain with its mask, the same result as
    onnxruntime on the same model (FLOPs as ``attention_work`` counts them)."""
    from anychip.core.plan.calibration_probes import PROBES

    model, work = PROBES["attention_mask"][0]()
    assert work == 2.0 * 8 * 64 * 64 * (32 + 32)
    ort = pytest.importorskip("onnxruntime")
    rng = np.random.default_rng(9)
    sess = anychip.load(model, devices=["cpu"])
    feeds = {i.name: rng.standard_normal(i.shape).astype(np.float32) for i in sess.inputs}
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(sess.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-5)
