"""``core/plan/placement.py``: capability answers, priority, pins, strict mode, the cost model."""

from __future__ import annotations

import re

import numpy as np
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.core.compile.pipeline import resolve_schemas
from anychip.core.plan.placement import PlacementOptions, place
from anychip.core.plugin.host import get_registry
from anychip.errors import PlacementError
from anychip.ir.onnx import import_model


def three_nodes(op2: str = "Sin", shape: tuple[int, ...] = (4, 8)) -> bytes:
    """Relu -> ``op2`` -> Softmax: the XPU runs Relu and Softmax, not Sin."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node(op2, ["a"], ["b"], name="middle"),
        helper.make_node("Softmax", ["b"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "three",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _placed(model: bytes, devices: list[str], **opts) -> dict[str, tuple[str, str]]:
    """node name -> (device, reason), placing with ``place`` itself."""
    registry = get_registry()
    ir_model = import_model(model)
    resolve_schemas(ir_model, registry.schemas)
    backends = [registry.backends[d] for d in devices]
    tables = {b.name: registry.kernel_table(b.name) for b in backends}
    place(ir_model.graph, backends, tables, PlacementOptions(**opts))
    return {n.name: (n.meta["device"], n.meta["placement_reason"]) for n in ir_model.graph.nodes}


def test_priority_then_fallback_with_the_reason() -> None:
    got = _placed(three_nodes(), ["xpu", "cpu"], cost_model=False)
    assert got["relu"] == ("xpu", "chosen")
    assert got["softmax"] == ("xpu", "chosen")
    device, reason = got["middle"]
    assert device == "cpu"
    assert reason == "fallback: xpu: no kernel for Sin"


def test_pins_by_name_op_type_and_glob() -> None:
    assert _placed(three_nodes(), ["xpu", "cpu"], pins={"relu": "cpu"})["relu"][0] == "cpu"
    by_op = _placed(three_nodes(), ["xpu", "cpu"], pins={"Softmax": "cpu"}, cost_model=False)
    assert by_op["softmax"] == ("cpu", "pinned")
    by_glob = _placed(three_nodes(), ["xpu", "cpu"], pins={"s*": "cpu"}, cost_model=False)
    assert by_glob["softmax"] == ("cpu", "pinned") and by_glob["relu"][0] == "xpu"


def test_pin_to_a_device_that_cannot_run_the_node_is_an_error() -> None:
    with pytest.raises(PlacementError, match="pinned to xpu.*no kernel for Sin"):
        _placed(three_nodes(), ["xpu", "cpu"], pins={"middle": "xpu"})


def test_strict_refuses_a_fallback() -> None:
    with pytest.raises(
        PlacementError, match=r"strict placement: 1 node\(s\) would fall back from xpu:\n  middle"
    ):
        _placed(three_nodes(), ["xpu", "cpu"], strict=True)


def test_cost_model_keeps_a_tiny_island_on_the_cpu() -> None:
    # Two tiny XPU nodes separated by a CPU node: each copy costs more than the XPU saves.
    got = _placed(three_nodes(shape=(2, 2)), ["xpu", "cpu"])
    assert got["relu"][0] == "cpu" and got["relu"][1].startswith("cost:")
    without = _placed(three_nodes(shape=(2, 2)), ["xpu", "cpu"], cost_model=False)
    assert without["relu"][0] == "xpu"


def test_an_island_slower_on_the_device_says_so_in_words() -> None:
    # declared figures: the XPU's launch makes each tiny node slower there than on the CPU
    got = _placed(three_nodes(shape=(2, 2)), ["xpu", "cpu"], calibration="off")
    reason = got["relu"][1]
    assert re.fullmatch(
        r"cost: island of 1 node\(s\) would take [\d.]+ us longer on xpu than on cpu, and "
        r"its 2 copies [\d.]+ us more",
        reason,
    ), reason  # not "saves -8.0 us"


def test_results_match_the_cpu_wherever_nodes_run() -> None:
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    model = three_nodes()
    (want,) = anychip.load(model, devices=["cpu"]).run(None, {"x": x})
    for devices in (["xpu", "cpu"], ["npu", "cpu"]):
        (got,) = anychip.load(model, devices=devices, cost_model=False).run(None, {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
