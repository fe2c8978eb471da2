"""Why every node stayed on one device, in words from what placement priced
(core/report/why_one_device.py), and the demo saying it (issue 44)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.report.why_one_device import _ms, why_one_device


def _conv_relu_conv() -> onnx.ModelProto:
    """Conv -> Relu -> Conv on a small image: the XPU has no Conv, so its Relu would be an
    island of one node between two copies."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((4, 4, 3, 3)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1", pads=[1, 1, 1, 1]),
            helper.make_node("Relu", ["a"], ["b"], name="relu"),
            helper.make_node("Conv", ["b", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
        ],
        "crc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_an_island_not_worth_its_copies_is_said_with_its_prices() -> None:
    sess = anychip.load(_conv_relu_conv(), devices=["xpu", "cpu"], calibration="off")
    rep = sess.placement()
    assert rep.by_device() == {"cpu": 3}
    relu = next(n for n in rep.nodes if n.name == "relu")
    p = relu.priced
    assert p is not None and p["rule"] == "island" and p["device"] == "xpu", relu
    assert p["copies"] == 2 and p["saves_s"] < p["copy_s"]
    (sentence,) = why_one_device(rep)
    assert sentence.startswith("xpu: 2 node(s) cannot run there (Conv x2); moving the 1 node(s)")
    assert "(Relu x1) to xpu would" in sentence
    assert f"{_ms(p['copy_s'])} of copies (2 per run)" in sentence, sentence
    money = _ms(p["saves_s"]) if p["saves_s"] > 0 else _ms(-p["saves_s"])
    assert money in sentence, sentence
    data = rep.to_dict()
    assert data["why_one_device"] == [sentence]
    assert [n["priced"] for n in data["nodes"] if n["name"] == "relu"] == [p]


def test_a_session_of_one_device_needs_no_why() -> None:
    sess = anychip.load(_conv_relu_conv(), devices=["cpu"], calibration="off")
    assert why_one_device(sess.placement()) == []  # one device in the session


class _Node:
    def __init__(self, op_type: str, device: str, reason: str, priced: dict | None) -> None:
        self.name, self.op_type, self.device = op_type.lower(), op_type, device
        self.reason, self.priced = reason, priced


class _Report:
    def __init__(self, nodes: list[_Node], devices: list[str]) -> None:
        self.nodes, self.devices = nodes, devices


def test_the_whole_graph_rule_says_the_gain_and_its_uncertainty() -> None:
    whole = {
        "rule": "whole",
        "device": "cpu",
        "devices": {"npu": 3, "cpu": 1},
        "alone_s": 0.0100,
        "mixed_s": 0.0095,
        "mixed_copies": 2,
        "uncertainty_s": 0.0012,
    }
    nodes = [_Node("MatMul", "cpu", "cost: ...", whole) for _ in range(3)]
    nodes.append(_Node("TopK", "cpu", "fallback: npu: no kernel for TopK", None))
    (sentence,) = why_one_device(_Report(nodes, ["npu", "cpu"]))
    assert sentence == (
        "npu: 1 node(s) cannot run there (TopK x1); the placement with 3 node(s) on npu "
        "(2 copies per run) was estimated 9.50 ms against 10.00 ms on cpu alone: its gain of "
        "0.50 ms is within the estimate's uncertainty (+-1.20 ms)"
    )
    whole["mixed_s"] = 0.0125  # slower, kept by the margin
    (sentence,) = why_one_device(_Report(nodes, ["npu", "cpu"]))
    assert sentence.endswith("was estimated 12.50 ms, 2.50 ms slower than cpu alone")


def test_without_a_priced_rule_the_most_common_reason() -> None:
    nodes = [_Node("Add", "cpu", "cost: a lone Add (1.0 us on cpu) is not worth a device", None)]
    assert why_one_device(_Report(nodes, ["xpu", "cpu"])) == [
        "xpu: 1 node(s): cost: a lone Add (1.0 us on cpu) is not worth a device"
    ]


def test_the_demo_says_why_no_split_pays(monkeypatch, capsys) -> None:
    from anychip.cli.main import main

    monkeypatch.setattr("anychip.zoo.light_model", lambda name, seed=0: _conv_relu_conv())
    assert main(["demo", "--devices", "xpu"]) == 0
    out = capsys.readouterr().out
    assert "nodes={'cpu': 3}" in out
    line = next(x for x in out.splitlines() if "not on xpu:" in x)
    assert "cannot run there (Conv x2); moving the 1 node(s) it can run (Relu x1)" in line
