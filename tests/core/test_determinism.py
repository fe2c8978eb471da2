"""The same model on the same machine gets the same placement every time (issue 45): a
calibration is complete and fixed, so ``anychip partition`` says the same before and after
other models were priced and run, and in a fresh cache folder (measured again there)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import anychip
from anychip.cli.main import main
from bench.models import HELD_OUT
from tests.models import transformer_layer


def _partition(path, capsys) -> dict[str, str]:
    assert main(["partition", str(path), "--devices", "xpu,cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    return {n["name"]: n["device"] for n in report["nodes"]}


@pytest.mark.slow
def test_the_same_partition_before_after_other_models_and_in_a_fresh_cache(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setenv("ANYCHIP_CALIBRATION", "auto")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "a"))
    model = tmp_path / "layer.onnx"
    model.write_bytes(transformer_layer(seq=64, hidden=128, heads=4, ffn=512).SerializeToString())
    first = _partition(model, capsys)  # measures the CPU and the XPU first
    files = sorted((tmp_path / "a" / "calibration").glob("*.json"))
    assert len(files) == 2
    before = [f.read_bytes() for f in files]
    # Other models priced (their own op mixes, attention shapes) and run 100 times.
    for name in ("gpt_like", "mlp"):
        sess = anychip.load(HELD_OUT[name][0](), devices=["xpu", "cpu"], calibration="auto")
        rng = np.random.default_rng(0)
        feeds = {
            i.name: rng.standard_normal([d if isinstance(d, int) else 1 for d in i.shape]).astype(
                np.float32
            )
            for i in sess.inputs
        }
        for _ in range(50):
            sess.run(None, feeds)
    assert [f.read_bytes() for f in files] == before  # never grown by pricing
    assert _partition(model, capsys) == first
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "b"))  # a fresh cache folder
    assert _partition(model, capsys) == first
