"""The scikit-learn models' fixed costs cut, each against onnxruntime and the path it
replaces: oneDNN's MatMul and Gemm wrappers declining a small product before switching the
OpenMP team; the tree kernels' C walk bound once per node."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import anychip
from anychip.backends.cpu.onednn import kernels as onednn_kernels
from bench._wild_sklearn import sklearn_cases
from tests.wild._compare import anychip_run, assert_same, ort_run


def _projection(op: str, rng: np.random.Generator) -> tuple:
    """``X @ W`` (MatMul) or ``X @ W.T + b`` (Gemm) with a seeded constant 12x4 weight."""
    w = rng.standard_normal((4, 12) if op == "Gemm" else (12, 4)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "W")]
    if op == "Gemm":
        inits.append(numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "B"))
        node = h.make_node("Gemm", ["X", "W", "B"], ["Y"], transB=1)
    else:
        node = h.make_node("MatMul", ["X", "W"], ["Y"])
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("X", T.FLOAT, ["N", 12])],
        [h.make_tensor_value_info("Y", T.FLOAT, ["N", 4])],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
def test_small_products_skip_the_openmp_team(op, monkeypatch) -> None:
    rng = np.random.default_rng(19)
    model = _projection(op, rng)
    feeds = {"X": rng.standard_normal((300, 12)).astype(np.float32)}

    def no_team(work: float):  # noqa: ANN202 - a small product must not get here
        raise AssertionError(f"team_for({work}) entered for a product under MIN_MACS")

    monkeypatch.setattr(onednn_kernels, "team_for", no_team)
    before = onednn_kernels.RUNS[op, "numpy"]
    got, _ = anychip_run(model, feeds)
    assert onednn_kernels.RUNS[op, "numpy"] == before + 1
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)


_TREES = ("DecisionTreeRegressor (regression)", "ExtraTreeClassifier (binary)")


@pytest.mark.parametrize("name", _TREES)
def test_tree_kernels_bound_call_matches_onnxruntime_and_numpy(name, monkeypatch) -> None:
    """The C walk bound once per node and table, fed C- and Fortran-ordered rows, twice (the
    settings parsed on the first call), against onnxruntime and the numpy walk."""
    build = {n: b for n, b, _ in sklearn_cases(False)}[name]
    model, feeds = build()
    sess = anychip.load(model, devices=["cpu"])
    x = feeds["X"]
    want = ort_run(model, feeds)
    for feed in (x, np.asfortranarray(x), x):
        assert_same(sess.run(None, {"X": feed}), want, rtol=1e-6, atol=1e-6)
    monkeypatch.setenv("ANYCHIP_NATIVE", "0")
    walked, _ = anychip_run(model, feeds)
    assert_same(sess.run(None, feeds), walked, rtol=0, atol=0)
