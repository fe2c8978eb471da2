"""A graph-mode device's launch (one partition call beyond the host's run of the same model),
measured by its calibration and charged once per call (decisions/046): IREE's calls cost tens
of microseconds to a millisecond, and a placement that split a small model into many IREE
partitions ran 15 times slower than the CPU alone."""

from __future__ import annotations

import pytest

import anychip
from anychip.core.plan import calibration as C
from anychip.core.plan.calibration_probes import OP_PROBES, measure_launch
from anychip.core.plan.cost_search import LAUNCH_FLOOR, Costs, estimate
from anychip.core.plugin.host import get_registry
from anychip.ir.onnx import import_model
from tests.models import transformer_layer


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    return tmp_path


def _cal(name: str, per_unit: float, link, launch: float | None = None) -> C.Calibration:
    """``per_unit`` seconds per unit of work in every class and op, plus 1 us a node."""
    backend = get_registry().backends[name]
    keys = [*C._CLASSES, *(f"op:{op}" for op in OP_PROBES)]
    points = {k: [(1e3, 1e-6 + 1e3 * per_unit), (1e9, 1e-6 + 1e9 * per_unit)] for k in keys}
    spread = dict.fromkeys(points, 0.0)
    return C.Calibration(name, C.cache_key(backend), points, link, spread=spread, launch=launch)


def _layer() -> bytes:
    return transformer_layer(seq=32, hidden=64, heads=4, ffn=128, causal=True).SerializeToString()


def test_launch_kept_in_the_file_and_checked(cache):
    cal = _cal("npu", 1e-10, (1e-6, 1e10), launch=3e-4)
    again = C.Calibration.from_json(cal.to_json())
    assert again.launch == 3e-4
    assert C.Calibration.from_json(_cal("cpu", 1e-10, None).to_json()).launch is None
    bad = cal.to_json()
    bad["launch"] = -1.0
    with pytest.raises(ValueError, match="launch"):
        C.Calibration.from_json(bad)


def test_nodes_lose_the_launch_and_each_call_pays_it(cache):
    registry = get_registry()
    npu, cpu = registry.backends["npu"], registry.backends["cpu"]
    graph = import_model(_layer()).graph
    launch = 2e-4
    cals = {"npu": _cal("npu", 1e-10, (1e-6, 1e10), launch), "cpu": _cal("cpu", 1e-10, None)}
    costs = Costs([npu, cpu], cals)
    plain = Costs([npu, cpu], {**cals, "npu": _cal("npu", 1e-10, (1e-6, 1e10))})
    node = graph.nodes[0]
    with_launch, without = costs.node(node, "npu"), plain.node(node, "npu")
    assert with_launch == pytest.approx(max(without - launch, without * LAUNCH_FLOOR))
    assert costs.launch("npu") == launch
    assert plain.launch("npu") == npu.device_model().launch_overhead
    assert costs.island_launches("npu", 5) == -launch
    assert costs.island_launches("cpu", 5) == 0.0
    # the layer in one call, against two calls with a node between them on the CPU
    nodes = list(graph.nodes)
    moved = nodes[len(nodes) // 2]
    whole = dict.fromkeys(nodes, "npu")
    split = {n: "cpu" if n is moved else "npu" for n in nodes}
    a, b = estimate(graph, whole, costs, "cpu"), estimate(graph, split, costs, "cpu")
    work = costs.node(moved, "cpu") - costs.node(moved, "npu")
    assert b.copies > a.copies
    assert b.seconds - a.seconds > launch + work  # one launch more, and the copies


@pytest.mark.parametrize("launch, where", [(0.0, "npu"), (0.05, "cpu")])
def test_a_costly_launch_keeps_the_model_on_the_host(cache, launch, where):
    """A device twice the CPU's speed takes the layer when its calls are free, and none of
    it when each call costs 50 ms: the placement says why."""
    C._save(get_registry().backends["npu"], _cal("npu", 0.5e-10, (1e-6, 1e10), launch))
    C._save(get_registry().backends["cpu"], _cal("cpu", 1e-10, None))
    sess = anychip.load(_layer(), devices=["npu", "cpu"], calibration="cached")
    rep = sess.placement()
    assert rep.by_device() == {where: len(rep.nodes)}, str(rep)
    sess.close()


def test_launch_measured_on_a_graph_mode_device(cache):
    npu = get_registry().backends["npu"]
    t = measure_launch(npu, 2)
    assert t is not None and 0.0 <= t < 1.0
