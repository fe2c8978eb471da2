"""``bench/hf_zoo.py``: the Hugging Face zoo. Its table from recorded results (no torch), a run of
one tiny model through the run step's subprocess, and (slow tier, where torch, transformers and
onnxscript are importable) the whole script on three architectures."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from bench import hf_zoo

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_table_counts_architectures_that_pass_on_every_set() -> None:
    sets = ["npu,cpu", "cpu"]
    manifest = {
        "bert": {"torchscript": {"status": "ok"}, "dynamo": {"status": "ok"}},
        "gpt2": {
            "torchscript": {"status": "export failed", "reason": "ValueError: no"},
            "dynamo": {"status": "ok"},
        },
    }
    passed = {"status": "pass", "max_err": 1e-7}
    results = {
        "bert": {
            "torchscript": {"npu,cpu": passed, "cpu": passed},
            "dynamo": {"npu,cpu": {"status": "error", "reason": "DeviceError: a|b"}, "cpu": passed},
        },
        "gpt2": {"dynamo": {"npu,cpu": {"status": "mismatch", "max_err": 0.5}, "cpu": passed}},
    }
    text = hf_zoo.table(manifest, results, sets)
    assert "passing on every set with at least one export: 1." in text
    assert "`npu,cpu` 1/3, `cpu` 3/3" in text
    assert "**export failed**: ValueError: no" in text
    assert "**mismatch** max err 5.00e-01" in text
    assert "DeviceError: a\\|b" in text  # a pipe would break the row


def _tiny(path: str) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)


def test_the_run_step_compares_each_set_with_onnxruntime(tmp_path) -> None:
    path = str(tmp_path / "m.onnx")
    _tiny(path)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.savez(tmp_path / "m.npz", x=x, unused=x)  # an input the export dropped is left out
    for devices in ("npu,cpu", "cpu"):
        got = hf_zoo.run_one(path, str(tmp_path / "m.npz"), devices)
        assert got["status"] == "pass" and got["max_err"] == 0.0, got
    assert hf_zoo.run_one(path + ".missing", str(tmp_path / "m.npz"), "cpu")["status"] == (
        "ort failed"
    )
    # A constant reference output (all inputs negative: Relu gives zeros) proves nothing.
    np.savez(tmp_path / "neg.npz", x=-np.abs(x) - 1)
    flat = hf_zoo.run_one(path, str(tmp_path / "neg.npz"), "cpu")
    assert flat["status"] == "degenerate" and "constant" in flat["reason"], flat


def _has(*names: str) -> bool:
    return all(importlib.util.find_spec(n) is not None for n in names)


@pytest.mark.slow  # exports with torch and starts other processes
@pytest.mark.skipif(
    not _has("torch", "transformers", "onnxscript"),
    reason="needs torch, transformers and onnxscript (a venv of their own: docs/perf/hf-zoo.md)",
)
def test_the_zoo_passes_on_three_architectures(tmp_path) -> None:
    out = tmp_path / "zoo"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "bench", "hf_zoo.py"), "--out", str(out),
         "--only", "bert,gpt2,vit", "--jobs", "2"],
        capture_output=True, text=True, timeout=1200, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    for name in ("bert", "gpt2", "vit"):
        runs = results[name]
        assert runs, f"{name}: no export ran"
        for exporter, by_set in runs.items():
            for devices, r in by_set.items():
                assert r["status"] == "pass", (name, exporter, devices, r)
