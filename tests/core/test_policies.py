"""Placement policies, strict placement listing every refused node, the fallback summary that
tells "cannot run" from "kept off by the cost model", and claims as data."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

import anychip
from anychip.cli.main import main
from tests.models import transformer_layer

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()), reason="no XPU here"
)


def _layer_with_means() -> bytes:
    """The encoder layer, its two LayerNormalizations also giving their Mean (which the XPU's
    kernel does not: they cannot run there)."""
    return transformer_layer(seq=16, hidden=64, heads=2, ffn=128, ln_mean=True).SerializeToString()


@pytest.fixture(scope="module")
def model():
    return _layer_with_means()


def test_prefer_first_puts_every_node_it_can_on_the_first_device(model):
    sess = anychip.load(model, devices=["xpu", "cpu"], placement_policy="prefer-first")
    summary = sess.placement().summary()
    assert summary["cost"] == 0 and summary["fallback"] == 2  # the two LayerNormalizations
    assert sess.placement().by_device()["xpu"] == len(sess.placement().nodes) - 2


def test_min_copies_takes_the_placement_with_the_fewest_copies(model):
    sess = anychip.load(
        model, devices=["xpu", "cpu"], placement_policy="min-copies", calibration="off"
    )
    report = sess.placement()
    assert report.copy_count == 0 and report.by_device() == {"cpu": len(report.nodes)}
    assert any(n.reason.startswith("fewest copies:") for n in report.nodes)
    x = np.random.default_rng(0).standard_normal((1, 16, 64)).astype(np.float32)
    ref = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-5)


def test_an_unknown_policy_is_refused(model):
    with pytest.raises(anychip.PlacementError, match="placement_policy 'fastest'"):
        anychip.load(model, devices=["xpu", "cpu"], placement_policy="fastest")


def test_strict_lists_every_node_that_would_fall_back(model):
    with pytest.raises(anychip.PlacementError) as info:
        anychip.load(model, devices=["xpu", "cpu"], strict=True)
    text = str(info.value)
    assert "2 node(s) would fall back from xpu" in text
    assert text.count("(LayerNormalization) -> cpu") == 2 and "ln1" in text and "ln2" in text


def test_the_summary_line_tells_cannot_run_from_kept_by_cost(model, caplog):
    with caplog.at_level(logging.WARNING, logger="anychip"):
        anychip.load(model, devices=["xpu", "cpu"], calibration="off")
    line = next(r.getMessage() for r in caplog.records if "could not run" in r.getMessage())
    assert "2 node(s) could not run on xpu (LayerNormalization x2)" in line
    assert "kept off xpu by the cost model" in line


def test_run_strict_and_policy_from_the_command_line(tmp_path, capsys):
    path = tmp_path / "m.onnx"
    path.write_bytes(_layer_with_means())
    assert main(["run", str(path), "--devices", "xpu,cpu", "--strict"]) == 2
    assert "would fall back" in capsys.readouterr().err
    assert (
        main(
            [
                "run",
                str(path),
                "--devices",
                "xpu,cpu",
                "--placement-policy",
                "prefer-first",
                "--placement",
                "--repeat",
                "1",
            ]
        )
        == 0
    )
    assert "xpu=" in capsys.readouterr().out


@pytest.mark.parametrize("device", ["xpu", "npu"])
def test_devices_ops_lists_the_claims_as_data(device, capsys):
    assert main(["devices", "--ops", device, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    ops = {r["op"] for r in rows}
    assert {"MatMul", "Softmax"} <= ops and all(r["dtypes"] for r in rows)
    assert main(["devices", "--ops", "tpu"]) == 2
