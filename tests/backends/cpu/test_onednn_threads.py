"""oneDNN's recurrences split by batch and MatMuls split by rows over the pool's threads
(``onednn/rnn.py``, ``onednn/matmul.py``, ``onednn/_parallel.py``): with two threads and the
thresholds at zero, every LSTM, GRU and RNN case oneDNN runs, the Gemm cases and a
transformer layer give what onnxruntime and the unsplit primitive give; without the C helper
the parts run in turn with the same results."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import pytest
from onnx import helper

import anychip
from anychip.backends.cpu.native import omp, pool
from anychip.backends.cpu.onednn import _lib, _parallel, matmul, rnn
from anychip.codegen import build
from tests.backends.cpu.test_onednn import (
    GEMM_CASES,
    RNN_CASES,
    _close,
    _model,
    _rand,
    _rnn_model,
    _run_both,
)


@contextlib.contextmanager
def two_threads(monkeypatch: pytest.MonkeyPatch, **limits: tuple[object, int]) -> Iterator[None]:
    """Two OpenMP threads, no pool backoff (a busy machine), and ``limits``
    (name -> (module, value)) set for the test; the thread count restored after."""
    assert _lib.available(), _lib.unavailable_reason()
    if not omp.available():
        pytest.skip("libgomp is not loadable")
    kept = omp.max_threads()
    omp.set_threads(2)
    for name, (module, value) in limits.items():
        monkeypatch.setattr(module, name, value)
    monkeypatch.setattr(pool, "try_parallel", lambda: True)
    try:
        yield
    finally:
        omp.set_threads(kept)


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
    with two_threads(monkeypatch, BATCH_SPLIT_WORK=(rnn, 0), MIN_PART_ROWS=(rnn, 1)):
        yield


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
    monkeypatch.setattr(_parallel, "_helper", lambda: None)  # no compiler
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


@pytest.fixture
def row_split(monkeypatch):
    """Two OpenMP threads and every oneDNN MatMul split by rows (parts of 8 rows or more),
    however small (every constant-weight product on oneDNN)."""
    limits = {"ROW_SPLIT_WORK": (matmul, 0), "ROWS_PER_PART": (matmul, 8), "MIN_MACS": (matmul, 0)}
    limits["COLUMN_SPLIT_MAX"] = (matmul, 0)  # the column split (test_matmul_columns) off
    with two_threads(monkeypatch, **limits):
        yield


@pytest.mark.parametrize(
    "case", [c for c in range(len(GEMM_CASES)) if GEMM_CASES[c][4] == "onednn"]
)
def test_row_split_gemm_equals_onnxruntime_and_unsplit(row_split, monkeypatch, case):
    a_shape, b_shape, attrs, c_shape, _ = GEMM_CASES[case]
    rng = np.random.default_rng(500 + case)
    a, b = _rand(rng, *a_shape), _rand(rng, *b_shape)
    weights = {"B": b} | ({"C": _rand(rng, *c_shape)} if c_shape else {})
    node = helper.make_node("Gemm", ["A", *weights], ["Y"], **attrs)
    model = _model([node], {"A": a}, weights, ["Y"])
    before = _parallel.RUNS["together"] + _parallel.RUNS["in turn"]
    got, want = _run_both(model, {"A": a})
    assert _parallel.RUNS["together"] + _parallel.RUNS["in turn"] == before + 1
    _close(got, want)
    with monkeypatch.context() as mp:
        mp.setattr(matmul, "ROW_SPLIT_WORK", 1 << 62)
        one = anychip.load(model, devices=["cpu"]).run(None, {"A": a})
    _close(got, [np.asarray(y) for y in one], tol=1e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_row_split_transformer_layer_equals_onnxruntime(row_split, causal):
    """The 3-D activations of a layer's linear layers (MatMulAdd, FusedGemm) split too."""
    from tests.backends.cpu._fusion_models import check
    from tests.models import transformer_layer

    before = _parallel.RUNS["together"] + _parallel.RUNS["in turn"]
    check(transformer_layer(seq=40, hidden=64, heads=2, ffn=128, causal=causal))
    assert _parallel.RUNS["together"] + _parallel.RUNS["in turn"] > before
