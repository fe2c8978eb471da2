"""oneDNN's recurrences split by batch over the OpenMP team (``onednn/rnn.py``,
``onednn/_parallel.py``): with two threads and the threshold at zero, every LSTM, GRU and RNN
case oneDNN runs gives what onnxruntime and the unsplit primitive give; without the C helper
the parts run in turn with the same results."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.cpu.onednn import _lib, _parallel, rnn
from anychip.codegen import build, omp
from tests.backends.cpu.test_onednn import RNN_CASES, _close, _rnn_model, _run_both

#: The cases oneDNN runs (the others are the numpy kernel's: nothing to split).
ONEDNN_CASES = [
    c
    for c in RNN_CASES
    if not ({"P"} & c[2] or "clip" in c[1])
    and not (c[0] != "RNN" and c[1].get("activations"))
    and not (c[0] == "RNN" and len(set(c[1].get("activations") or ["tanh"])) > 1)
]


@pytest.fixture
def split(monkeypatch):
    """Two OpenMP threads and every recurrence split (``BATCH_SPLIT_WORK`` at zero)."""
    assert _lib.available(), _lib.unavailable_reason()
    if not omp.available():
        pytest.skip("libgomp is not loadable")
    kept = omp.max_threads()
    omp.set_threads(2)
    monkeypatch.setattr(rnn, "BATCH_SPLIT_WORK", 0)
    monkeypatch.setattr(rnn, "MIN_PART_ROWS", 1)
    yield
    omp.set_threads(kept)


def _unsplit(model, feeds, monkeypatch) -> list[np.ndarray]:
    with monkeypatch.context() as mp:
        mp.setattr(rnn, "BATCH_SPLIT_WORK", 1 << 62)
        return [np.asarray(g) for g in anychip.load(model, devices=["cpu"]).run(None, feeds)]


@pytest.mark.parametrize("case", range(len(ONEDNN_CASES)))
@pytest.mark.parametrize("batch", [2, 5])
def test_split_recurrence_equals_onnxruntime_and_unsplit(split, monkeypatch, case, batch):
    op, attrs, extras = ONEDNN_CASES[case]
    model, feeds = _rnn_model(op, 6, batch, 5, 8, attrs, extras)
    before = _parallel.RUNS["together"] + _parallel.RUNS["in turn"]
    got = [np.asarray(g) for g in anychip.load(model, devices=["cpu"]).run(None, feeds)]
    assert _parallel.RUNS["together"] + _parallel.RUNS["in turn"] == before + 1
    _close(got, _unsplit(model, feeds, monkeypatch), tol=1e-5)
    if not attrs.get("layout"):  # onnxruntime has no layout=1 (test_onednn.py moves the axis)
        _close(*_run_both(model, feeds))


@pytest.mark.skipif(build.compiler() is None, reason="needs a C compiler (gcc)")
def test_split_parts_ran_together(split):
    model, feeds = _rnn_model("LSTM", 4, 4, 3, 8, {}, {"B"})
    before = _parallel.RUNS["together"]
    anychip.load(model, devices=["cpu"]).run(None, feeds)
    assert _parallel.RUNS["together"] == before + 1


def test_split_without_the_helper_runs_the_parts_in_turn(split, monkeypatch):
    monkeypatch.setattr(_parallel, "load", lambda *a, **k: None)  # no compiler
    model, feeds = _rnn_model("GRU", 5, 3, 4, 8, {"linear_before_reset": 1}, {"B", "h"})
    before = _parallel.RUNS["in turn"]
    got, want = _run_both(model, feeds)
    assert _parallel.RUNS["in turn"] == before + 1
    _close(got, want)


def test_small_batches_are_not_split(split, monkeypatch):
    monkeypatch.setattr(rnn, "MIN_PART_ROWS", 4)
    model, feeds = _rnn_model("LSTM", 4, 7, 3, 8, {}, {"B"})  # 7 rows: one part of 4 or more
    before = dict(_parallel.RUNS)
    _close(*_run_both(model, feeds))
    assert dict(_parallel.RUNS) == before


def test_one_thread_never_splits(monkeypatch):
    kept = omp.max_threads()
    omp.set_threads(1)
    monkeypatch.setattr(rnn, "BATCH_SPLIT_WORK", 0)
    try:
        model, feeds = _rnn_model("LSTM", 4, 4, 3, 8, {}, {"B"})
        before = dict(_parallel.RUNS)
        _close(*_run_both(model, feeds))
        assert dict(_parallel.RUNS) == before
    finally:
        omp.set_threads(kept)
