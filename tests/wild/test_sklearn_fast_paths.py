"""The scikit-learn speed paths against onnxruntime and against the paths they replace: Scan
run for all iterations at once (KNeighbors' cdist body), TopK's partial sort for a small k,
the per-run feed check's fast path, and oneDNN's MatMul declining small products."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import anychip
from anychip.backends.cpu.kernels import _scan_vector, op_scan, op_topk
from bench._wild_sklearn import sklearn_cases
from tests.wild._compare import anychip_run, assert_same, ort_run

_KNN = ("KNeighborsClassifier (multi)", "KNeighborsRegressor (regression)")


@functools.cache
def _cases() -> dict:
    """The KNeighbors builders (scikit-learn imported when a test runs, not at collection)."""
    return {name: build for name, build, _ in sklearn_cases(False) if name in _KNN}


@pytest.mark.parametrize("name", _KNN)
def test_kneighbors_batched_scan_matches_onnxruntime_and_the_loop(name, monkeypatch) -> None:
    model, feeds = _cases()[name]()
    calls = []
    real = _scan_vector._run_block
    monkeypatch.setattr(_scan_vector, "_run_block", lambda *a: calls.append(1) or real(*a))
    got, _ = anychip_run(model, feeds)
    assert calls
    assert_same(got, ort_run(model, feeds), rtol=1e-4, atol=1e-4)
    monkeypatch.setattr(op_scan, "run_batched", lambda *a: None)  # the loop
    looped, _ = anychip_run(model, feeds)
    assert_same(got, looped, rtol=1e-5, atol=1e-5)


def _scan_model(body_nodes: list) -> onnx.ModelProto:
    body = h.make_graph(
        body_nodes,
        "body",
        [
            h.make_tensor_value_info("s_in", T.FLOAT, ["N", 5]),
            h.make_tensor_value_info("row", T.FLOAT, [5]),
        ],
        [
            h.make_tensor_value_info("s_out", T.FLOAT, ["N", 5]),
            h.make_tensor_value_info("y", T.FLOAT, None),
        ],
    )
    scan = h.make_node("Scan", ["X", "C"], ["S", "Y"], body=body, num_scan_inputs=1)
    graph = h.make_graph(
        [scan],
        "g",
        [
            h.make_tensor_value_info("X", T.FLOAT, ["N", 5]),
            h.make_tensor_value_info("C", T.FLOAT, ["M", 5]),
        ],
        [
            h.make_tensor_value_info("S", T.FLOAT, None),
            h.make_tensor_value_info("Y", T.FLOAT, None),
        ],
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])


@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("reduce", ["ReduceSumSquare", "ReduceMax", "ReduceSum"])
def test_batched_scan_bodies_match_onnxruntime(reduce, keepdims, monkeypatch) -> None:
    """Element-wise ops of mixed ranks, a constant, and each kind of reduction (attribute or
    input axes), in several blocks of iterations."""
    monkeypatch.setattr(_scan_vector, "BLOCK_BYTES", 200)  # 1-2 iterations per block
    axes = [h.make_node("Constant", [], ["ax"], value_ints=[-1])] if reduce == "ReduceSum" else []
    red = (
        h.make_node(reduce, ["d2", "ax"], ["y"], keepdims=keepdims)
        if reduce == "ReduceSum"
        else h.make_node(reduce, ["d2"], ["y"], axes=[1], keepdims=keepdims)
    )
    nodes = [
        h.make_node("Identity", ["s_in"], ["s_out"]),
        h.make_node("Sub", ["s_in", "row"], ["d"]),
        h.make_node("Abs", ["d"], ["d1"]),
        h.make_node("Mul", ["d1", "row"], ["d2"]),
        *axes,
        red,
    ]
    rng = np.random.default_rng(5)
    feeds = {
        "X": rng.standard_normal((7, 5)).astype(np.float32),
        "C": rng.standard_normal((9, 5)).astype(np.float32),
    }
    model = _scan_model(nodes)
    calls = []
    real = _scan_vector._apply
    monkeypatch.setattr(_scan_vector, "_apply", lambda *a: calls.append(1) or real(*a))
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)
    assert calls, "the body should have run batched"
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)


def test_scan_with_a_state_that_changes_loops(monkeypatch) -> None:
    """A body that updates its state is not batched (and still matches onnxruntime)."""
    nodes = [
        h.make_node("Add", ["s_in", "row"], ["s_out"]),
        h.make_node("ReduceSum", ["s_out"], ["y"], keepdims=0),
    ]
    rng = np.random.default_rng(6)
    feeds = {
        "X": rng.standard_normal((3, 5)).astype(np.float32),
        "C": rng.standard_normal((4, 5)).astype(np.float32),
    }
    model = _scan_model(nodes)
    calls = []
    real = _scan_vector._run_block
    monkeypatch.setattr(_scan_vector, "_run_block", lambda *a: calls.append(1) or real(*a))
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)
    assert not calls
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_topk_partial_sort_keeps_the_tie_rule(largest, axis) -> None:
    rng = np.random.default_rng(7)
    x = rng.integers(0, 6, (90, 80)).astype(np.float32)  # many ties
    for k in (1, 3, 7):
        fast = op_topk._few(x, k, axis % 2, largest)
        full = np.argsort(-x if largest else x, axis=axis, kind="stable")
        want = np.take(full, np.arange(k), axis=axis)
        assert fast is not None
        np.testing.assert_array_equal(fast, want)
    x[3, 4] = np.nan
    assert op_topk._few(x, 3, axis % 2, largest) is None  # NaN: the full sort orders it


def test_topk_model_matches_onnxruntime() -> None:
    rng = np.random.default_rng(8)
    x = np.round(rng.standard_normal((120, 64)), 1).astype(np.float32)
    node = h.make_node("TopK", ["X", "K"], ["V", "I"], largest=0, axis=1)
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("X", T.FLOAT, [120, 64])],
        [
            h.make_tensor_value_info("V", T.FLOAT, None),
            h.make_tensor_value_info("I", T.INT64, None),
        ],
        [onnx.numpy_helper.from_array(np.array([5], np.int64), "K")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    got = anychip.load(model, devices=["cpu"]).run(None, {"X": x})
    assert_same(got, ort_run(model, {"X": x}), rtol=0, atol=0)


def test_feed_fast_path_keeps_the_checks() -> None:
    node = h.make_node("Relu", ["X"], ["Y"])
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("X", T.FLOAT, ["N", 3])],
        [h.make_tensor_value_info("Y", T.FLOAT, ["N", 3])],
    )
    sess = anychip.load(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), "cpu")
    x = np.arange(-6, 6, dtype=np.float32).reshape(4, 3)
    unpickled = np.frombuffer(x.tobytes(), dtype=np.dtype("<f4")).reshape(4, 3)
    for feed in (x, unpickled):
        np.testing.assert_array_equal(sess.run(None, {"X": feed})[0], np.maximum(x, 0))
    for bad, words in (
        (x.reshape(3, 4), "dimension 1 is 4"),
        (x.astype(np.float64), "expects dtype float32"),
        (x.reshape(12), "expects rank 2"),
    ):
        with pytest.raises(anychip.InputError, match=words):
            sess.run(None, {"X": bad})
    out = sess.run(None, {"X": x})[0]
    assert out is not x and out.flags.writeable
