"""``bench/wild_ortdata.py``: models read from a git tree, classed by domain, fed from their
declared inputs, each run in a subprocess and scored by the corpus' rules."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import onnx
from onnx import TensorProto, helper

from bench import wild_ortdata


def _model(op: str = "Relu", domain: str = "", x_shape: list | None = None) -> onnx.ModelProto:
    x_shape = ["batch", 3] if x_shape is None else x_shape
    graph = helper.make_graph(
        [helper.make_node(op, ["x"], ["y"], domain=domain)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    opsets = [helper.make_opsetid("", 17)]
    if domain:
        opsets.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def test_classes_by_every_nodes_domain() -> None:
    assert wild_ortdata.classify(_model()) == "standard"
    assert wild_ortdata.classify(_model("Gelu", "com.microsoft")) == "contrib"


def test_feeds_from_declared_inputs() -> None:
    feeds = wild_ortdata.make_feeds(_model(x_shape=["batch", -1, 4]), seed=1)
    assert feeds["x"].shape == (2, 2, 4) and feeds["x"].dtype == np.float32
    again = wild_ortdata.make_feeds(_model(x_shape=["batch", -1, 4]), seed=1)
    np.testing.assert_array_equal(feeds["x"], again["x"])
    seq = helper.make_tensor_sequence_value_info("s", TensorProto.INT64, [3])
    model = _model()
    model.graph.input.append(seq)
    feeds = wild_ortdata.make_feeds(model, symbolic=1, high=1)
    assert len(feeds["s"]) == 2 and not feeds["s"][0].any()


def test_quantization_step_allowed_in_one_percent_only() -> None:
    want = [np.zeros(1000, np.float32)]
    one_off = [want[0].copy()]
    one_off[0][:5] = 0.5  # five elements one step of 0.5 apart
    notes: list[str] = []
    assert wild_ortdata._compare(one_off, want, step=0.5, notes=notes) == ""
    assert "5 of 1000" in notes[0]
    assert wild_ortdata._compare(one_off, want) != ""  # not a quantized model
    many = [np.full(1000, 0.5, np.float32)]
    assert wild_ortdata._compare(many, want, step=0.5) != ""


def test_corpus_from_a_git_tree(tmp_path) -> None:
    repo = tmp_path / "repo"
    data = repo / wild_ortdata.TESTDATA
    os.makedirs(data / "sub")
    onnx.save(_model(), str(data / "relu.onnx"))
    onnx.save(_model("Gelu", "com.microsoft"), str(data / "sub" / "gelu.onnx"))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "m"], check=True)
    rows_file = tmp_path / "rows.json"
    scratch = tmp_path / "scratch"
    args = [str(repo / ".git"), "--scratch", str(scratch), "--json", str(rows_file)]
    assert wild_ortdata.main(args) == 0
    rows = {r["model"]: r for r in json.loads(rows_file.read_text())}
    assert rows["relu.onnx"]["status"] == "pass" and rows["relu.onnx"]["class"] == "standard"
    assert rows["sub/gelu.onnx"]["status"] == "pass"
    assert rows["sub/gelu.onnx"]["class"] == "contrib"

    contrib_only = tmp_path / "contrib.json"
    args = [str(repo / ".git"), "--scratch", str(scratch), "--json", str(contrib_only)]
    assert wild_ortdata.main([*args, "--class", "contrib"]) == 0
    assert [r["model"] for r in json.loads(contrib_only.read_text())] == ["sub/gelu.onnx"]


def test_speed_phases_and_summary(tmp_path) -> None:
    from bench import ortdata_speed

    path = tmp_path / "relu.onnx"
    onnx.save(_model(), str(path))
    row = ortdata_speed.time_one(str(path), repeat=2)
    assert set(row["phases"]) == {"load", "first", "2-10", "steady", "reload"}
    assert all(a > 0 and b > 0 for a, b in row["phases"].values())
    text = ortdata_speed.summary([{"model": "relu.onnx", **row}, {"model": "x", "error": "e"}])
    assert "1 models timed" in text and "| reload |" in text and "relu.onnx" in text


def test_random_ops_found_in_subgraphs() -> None:
    """A model with a random op (here inside an If branch) is run more times before it is
    called deterministic: two runs of a small Dropout mask agree by luck."""
    branch = helper.make_graph(
        [helper.make_node("Dropout", ["x"], ["y"])],
        "b",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = _model()
    model.graph.node.append(
        helper.make_node("If", ["c"], ["z"], then_branch=branch, else_branch=branch)
    )
    ops = wild_ortdata._op_types(model)
    assert {"Relu", "If", "Dropout"} <= ops and ops & wild_ortdata.RANDOM_OPS
    assert not wild_ortdata._op_types(_model()) & wild_ortdata.RANDOM_OPS
