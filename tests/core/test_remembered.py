"""Measured placements remembered across sessions (``core/api/remembered.py``): the decision
of one session's feedback is where the next session of the same model starts, with nothing
explored; another model, other devices or a new calibration start afresh."""

from __future__ import annotations

import json

import numpy as np
import pytest

import anychip
from anychip.core.api import remembered
from tests.models import transformer_layer

INF = float("inf")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ANYCHIP_REMEMBER_PLACEMENT", "1")
    from anychip.core.run import feedback

    # every trial a clear loss: paired timings on a busy machine may leave one undecided,
    # which is not recorded (test_an_undecided_trial_is_not_remembered)
    monkeypatch.setattr(feedback, "_verdict", lambda t, p: ("lose", 2.0, 1.5, 2.5))
    return tmp_path


def _feeds(sess) -> dict:
    rng = np.random.default_rng(0)
    return {
        i.name: rng.standard_normal([d if isinstance(d, int) else 2 for d in i.shape]).astype(
            np.float32
        )
        for i in sess.inputs
    }


def _until_decided(sess, feeds) -> None:
    for _ in range(400):
        sess.run(None, feeds)
        if sess.feedback.done:
            return
    raise AssertionError(f"no decision after 400 runs: {sess.feedback.decision}")


@pytest.mark.parametrize("verdict", ["lose", "win"])
def test_the_next_session_starts_on_the_measured_placement(cache, monkeypatch, verdict) -> None:
    """Every trial lost: the cost model's placement is remembered as kept; every trial won:
    the last one taken, compiled again by its recipe in the next session."""
    from anychip.core.run import feedback

    if verdict == "win":
        monkeypatch.setattr(feedback, "_verdict", lambda t, p: ("win", 0.5, 0.4, 0.6))
    model = transformer_layer()
    first = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    feeds = _feeds(first)
    want = first.run(None, feeds)
    _until_decided(first, feeds)
    decided = first.placement().by_device()
    records = list((cache / "placements").glob("*.json"))
    assert len(records) == 1
    saved = json.loads(records[0].read_text())
    assert saved["decision"] == first.feedback.decision
    assert (saved["recipe"] is None) == (verdict == "lose")

    again = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    assert again.feedback.done and again.placement().by_device() == decided
    assert "measured in an earlier session" in again.placement().decision
    runs_before = again.feedback.runs
    got = again.run(None, feeds)
    assert again.feedback.runs == runs_before  # nothing measured, nothing explored
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_another_device_set_or_option_starts_afresh(cache) -> None:
    model = transformer_layer()
    first = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    _until_decided(first, _feeds(first))
    other = anychip.load(model, devices=["npu", "cpu"], explore_budget=INF)
    assert not other.feedback.done  # another device set: measured afresh
    policy = anychip.load(model, devices=["xpu", "cpu"], placement_policy="min-copies")
    assert policy.feedback is None or not policy.feedback.done
    off = anychip.load(model, devices=["xpu", "cpu"], remember_placement=False)
    assert not off.feedback.done


def test_a_corrupt_or_foreign_record_is_ignored(cache) -> None:
    model = transformer_layer()
    first = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    key = remembered.placement_key(first.source_model, [], first.options)
    assert len(key) == 32
    _until_decided(first, _feeds(first))
    (record,) = (cache / "placements").glob("*.json")
    record.write_text("{not json")
    again = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    assert not again.feedback.done
    record.write_text(json.dumps({"format": 1, "decision": "x", "recipe": [{}, ["gone"], None]}))
    third = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    assert not third.feedback.done  # a recipe that no longer compiles: measured afresh


def test_anychip_calibrate_a_model_decides_and_remembers(
    cache, tmp_path, capsys, monkeypatch
) -> None:
    import onnx

    from anychip.cli.main import main

    path = tmp_path / "layer.onnx"
    onnx.save(transformer_layer(), str(path))
    assert main(["calibrate", str(path), "--devices", "xpu,cpu"]) == 0
    out = capsys.readouterr().out
    assert "decided in" in out and "remembered" in out
    sess = anychip.load(str(path), devices=["xpu", "cpu"])
    assert sess.feedback.done and "measured in an earlier session" in sess.placement().decision
    assert main(["calibrate", str(path), "--devices", "cpu"]) != 0
    assert "two devices or more" in capsys.readouterr().err


def test_an_undecided_trial_is_not_remembered(cache, monkeypatch) -> None:
    from anychip.core.run import feedback

    monkeypatch.setattr(feedback, "_verdict", lambda t, p: ("lose", 0.9, 0.5, 1.6))
    model = transformer_layer()
    first = anychip.load(model, devices=["xpu", "cpu"], explore_budget=INF)
    _until_decided(first, _feeds(first))
    assert first.feedback.undecided and not (cache / "placements").exists()
