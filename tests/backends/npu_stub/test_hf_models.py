"""Hugging Face BERT and GPT-2 exports (tiny, seeded; made by bench/hf_exports.py, committed
under tests/data) on ``npu,cpu``: at three sequence lengths, >= 90% of the nodes on the NPU,
onnxruntime's results, one compile per length and hits after; a second process loads the
executables from the disk cache without compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

import anychip

DATA = Path(__file__).resolve().parents[2] / "data"
MODELS = {"bert": DATA / "hf_bert_tiny.onnx", "gpt2": DATA / "hf_gpt2_tiny.onnx"}
LENGTHS = (5, 8, 16)


def feeds(name: str, s: int, batch: int = 1) -> dict[str, np.ndarray]:
    """Seeded token ids; BERT's attention mask leaves out the last two tokens of a row."""
    rng = np.random.default_rng(s)
    out = {"input_ids": rng.integers(0, 128, (batch, s)).astype(np.int64)}
    if name == "bert":
        mask = np.ones((batch, s), np.int64)
        mask[0, -2:] = 0
        out["attention_mask"] = mask
    return out


# Counts compiles and telemetry of executables made in memory: the artifact cache off (an
# artifact another test stored would be loaded instead; the disk cache's own tests:
# tests/core/test_compile_cache.py).
pytestmark = pytest.mark.usefixtures("no_compile_cache")


@pytest.mark.parametrize("name", sorted(MODELS))
def test_hf_export_runs_on_the_npu_once_compiled_per_length(name):
    path = str(MODELS[name])
    sess = anychip.load(path, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    placed = sess.placement()
    assert placed.by_device().get("npu", 0) >= 0.9 * len(placed.nodes), placed
    for _ in range(2):
        for s in LENGTHS:
            got = sess.run(None, feeds(name, s))[0]
            want = ref.run(None, feeds(name, s))[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    sps = list(sess.compiled.specialized.values())
    assert sps
    for sp in sps:
        t = sp.telemetry()
        assert (t["compiles"], t["hits"], t["host_runs"]) == (3, 3, 3), t


SCRIPT = r"""
import json, sys
sys.path.insert(0, sys.argv[2])
import anychip
from tests.backends.npu_stub.test_hf_models import LENGTHS, MODELS, feeds

name = sys.argv[1]
sess = anychip.load(str(MODELS[name]), devices=["npu", "cpu"], cost_model=False,
                    background_compile=False)
outs = [sess.run(None, feeds(name, s))[0].tolist() for s in LENGTHS * 2][len(LENGTHS):]
tel = [sp.telemetry() for sp in sess.compiled.specialized.values()]
print(json.dumps({"telemetry": tel, "outs": outs}))
"""


def _process(name: str, cache: Path) -> dict:
    env = {
        **os.environ,
        "ANYCHIP_CACHE_DIR": str(cache),
        "ANYCHIP_COMPILE_CACHE": "1",
        "ANYCHIP_CALIBRATION": "off",
    }
    root = str(Path(__file__).resolve().parents[3])
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, name, root],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_second_process_loads_the_hf_export_from_disk(name, tmp_path):
    first = _process(name, tmp_path / "cache")
    second = _process(name, tmp_path / "cache")
    assert [t["compiles"] for t in first["telemetry"]] == [3] * len(first["telemetry"])
    for t in second["telemetry"]:
        assert (t["compiles"], t["disk_hits"], t["host_runs"], t["hits"]) == (0, 3, 0, 3), t
    assert second["outs"] == first["outs"]  # the same executables (first: runs 4 to 6)


def test_bucketing_refuses_the_hf_export_and_says_why():
    """Its attention reads the sequence length (Shape) and normalizes over the keys: padding
    is not proven safe, so each length compiles on its own and the results stay exact."""
    path = str(MODELS["gpt2"])
    sess = anychip.load(
        path,
        devices=["npu", "cpu"],
        cost_model=False,
        background_compile=False,
        device_options={"npu": {"buckets": {"S": "pow2"}}},
    )
    ref = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for s in (5, 6):
        got = sess.run(None, feeds("gpt2", s))[0]
        np.testing.assert_allclose(got, ref.run(None, feeds("gpt2", s))[0], rtol=1e-4, atol=1e-5)
    (sp,) = sess.compiled.specialized.values()
    assert sp.info["bucketing"].startswith("refused: Shape node"), sp.info
    assert sp.telemetry()["compiles"] == 2 and sp.telemetry()["bucketed_runs"] == 0
