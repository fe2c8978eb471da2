"""The scikit-learn models' fixed costs cut, each against onnxruntime and the path it
replaces: oneDNN's MatMul and Gemm wrappers declining a small product before switching the
OpenMP team; the tree kernels' C walk bound once per node; sibling tree ensembles stacked by a
Concat, or reading one input, run as one node (Bagging, AdaBoost); arenas under
``MIN_ARENA_BYTES`` left to numpy; LogSumExp's max over a short axis column by column; the
Imputer's values made once per node; linear models' rows read without a copy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

import anychip
from anychip.backends.cpu.kernels import op_reduce
from anychip.backends.cpu.onednn import kernels as onednn_kernels
from anychip.core.run import memory as memory_partition
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

    def no_team(work: float):
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


_BAGGING = ("BaggingRegressor (regression)", "BaggingClassifier (multi)")


@pytest.mark.parametrize("name", _BAGGING)
def test_tree_stack_is_the_unfused_concat_bit_for_bit(name) -> None:
    """Bagging's ten ensembles, reshapes and Concat as one node: equal to onnxruntime, and to
    the unfused graph exactly (each ensemble sums its own trees in its own order)."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[name]()
    sess = anychip.load(model, devices=["cpu"])
    assert sess.partitions[0].info["fusions"]["fuse_tree_stack"] == 1
    ops = [n.op_type for n in sess.partitions[0].graph.nodes]
    assert "TreeEnsembleStack" in ops and "Concat" not in ops
    got = sess.run(None, feeds)
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)
    off = {"cpu": {"disabled_passes": ["fuse_tree_stack"]}}
    unfused = anychip.load(model, devices=["cpu"], device_options=off)
    assert "TreeEnsembleStack" not in [n.op_type for n in unfused.partitions[0].graph.nodes]
    assert_same(got, unfused.run(None, feeds), rtol=0, atol=0)


def test_tree_stack_leaves_read_labels_and_mixed_inputs() -> None:
    """A classifier whose labels are read, or a Concat input that is not a reshaped ensemble
    score, keeps the graph as written (and its results)."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[_BAGGING[1]]()
    label = next(n for n in model.graph.node if n.op_type == "TreeEnsembleClassifier").output[0]
    model.graph.output.append(h.make_tensor_value_info(label, T.INT64, None))
    sess = anychip.load(model, devices=["cpu"])
    assert "fuse_tree_stack" not in sess.partitions[0].info.get("fusions", {})
    assert_same(sess.run(None, feeds), ort_run(model, feeds), rtol=1e-5, atol=1e-5)


def test_tree_stack_one_c_call_finishes_each_ensemble_as_its_kernel(monkeypatch) -> None:
    """Ensembles that average, add base values or differ in post transform, walked in one C
    call: each finished as its own kernel does (bit for bit), and as the body run without C."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[_BAGGING[0]]()
    rng = np.random.default_rng(7)
    for i, node in enumerate(n for n in model.graph.node if n.op_type == "TreeEnsembleRegressor"):
        if i % 2:
            node.attribute.append(h.make_attribute("aggregate_function", "AVERAGE"))
        if i % 3 == 0:
            node.attribute.append(h.make_attribute("base_values", [float(rng.normal())]))
    got = anychip.load(model, devices=["cpu"]).run(None, feeds)
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)
    off = {"cpu": {"disabled_passes": ["fuse_tree_stack"]}}
    assert_same(got, anychip.load(model, "cpu", device_options=off).run(None, feeds), 0, 0)
    monkeypatch.setenv("ANYCHIP_NATIVE", "0")  # the body with the kernels' numpy walks
    assert_same(got, anychip.load(model, devices=["cpu"]).run(None, feeds), 0, 0)


_ADABOOST = ("AdaBoostClassifier (multi)", "AdaBoostRegressor (regression)")


@pytest.mark.parametrize("name", _ADABOOST)
@pytest.mark.parametrize("read_labels", [False, True])
def test_tree_group_is_the_unfused_graph_bit_for_bit(name, read_labels, monkeypatch) -> None:
    """AdaBoost's twenty ensembles of X as one node (labels made only where read): equal to
    onnxruntime, to the unfused graph exactly, and to the body run without the C call."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[name]()
    if read_labels:  # a classifier's labels, or a regressor's scores, returned as they are
        first = next(n for n in model.graph.node if n.op_type.startswith("TreeEnsemble"))
        kind = T.INT64 if first.op_type == "TreeEnsembleClassifier" else T.FLOAT
        model.graph.output.append(h.make_tensor_value_info(first.output[0], kind, None))
    sess = anychip.load(model, devices=["cpu"])
    assert sess.partitions[0].info["fusions"]["fuse_tree_group"] == 1
    got = sess.run(None, feeds)
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)
    off = {"cpu": {"disabled_passes": ["fuse_tree_group"]}}
    assert_same(got, anychip.load(model, "cpu", device_options=off).run(None, feeds), 0, 0)
    monkeypatch.setenv("ANYCHIP_NATIVE", "0")
    assert_same(got, anychip.load(model, devices=["cpu"]).run(None, feeds), 0, 0)


def test_small_arenas_are_left_to_numpy_large_ones_used(monkeypatch) -> None:
    """MLPRegressor's 40 KB arena (300 rows) is not taken from the pool; at 3000 rows its
    arena (400 KB) is. Both equal onnxruntime, and the small one equals the arena path."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}["MLPRegressor (regression)"]()
    big = {"X": np.repeat(feeds["X"], 10, axis=0)}
    results = []
    for rows, used in ((feeds, False), (big, True)):
        sess = anychip.load(model, devices=["cpu"])
        got = [sess.run(None, rows) for _ in range(2)][1]  # the first run plans
        assert_same(got, ort_run(model, rows), rtol=1e-4, atol=1e-4)
        assert (sess.compiled.pools["cpu"].stats().alloc_count > 0) is used
        assert (sess.memory()["cpu"].arena > 0) is used
        results.append(got)
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)
    sess = anychip.load(model, devices=["cpu"])
    planned = [sess.run(None, feeds) for _ in range(2)][1]
    assert sess.compiled.pools["cpu"].stats().alloc_count == 1
    assert_same(results[0], planned, 0, 0)


@pytest.mark.parametrize("k", [2, 3, 16, 17])
def test_log_sum_exp_short_axis_max_is_the_reduction(k, monkeypatch) -> None:
    """ReduceLogSumExp over a short last axis takes its max column by column: equal to
    onnxruntime, and bit for bit to numpy's reduction, with NaN, infinities and signed zeros."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((40, k)) * 30).astype(np.float32)
    x[1, 0], x[2, -1], x[3, :] = np.nan, np.inf, -np.inf
    x[4, :] = 0.0
    x[4, ::2] = -0.0
    node = h.make_node("ReduceLogSumExp", ["X"], ["Y"], axes=[-1], keepdims=0)
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("X", T.FLOAT, ["N", k])],
        [h.make_tensor_value_info("Y", T.FLOAT, None)],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    got, _ = anychip_run(model, {"X": x})
    assert_same(got, ort_run(model, {"X": x}), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(op_reduce, "_SHORT", 0)  # numpy's max reduction
    reduced, _ = anychip_run(model, {"X": x})
    np.testing.assert_array_equal(got[0].view(np.int32), reduced[0].view(np.int32))


@pytest.mark.parametrize("name", ["SimpleImputer", "SimpleImputer median"])
def test_imputer_values_made_once_per_node(name) -> None:
    """The Imputer's values converted on the first run and kept: the second and third runs,
    on other NaN patterns, equal onnxruntime."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[name]()
    sess = anychip.load(model, devices=["cpu"])
    rng = np.random.default_rng(3)
    for _ in range(3):
        x = feeds["X"].copy()
        x[rng.random(x.shape) < 0.2] = np.nan
        assert_same(sess.run(None, {"X": x}), ort_run(model, {"X": x}), 0, 0)


def test_one_partition_runs_direct_and_keeps_its_errors(monkeypatch) -> None:
    """A one-device session runs its one partition without slots: outputs equal the slot
    path's, and a kernel's MemoryError still reaches the caller as OutOfMemoryError."""
    rng = np.random.default_rng(11)
    model = _projection("MatMul", rng)
    feeds = {"X": rng.standard_normal((30, 12)).astype(np.float32)}
    sess = anychip.load(model, devices=["cpu"])
    steps = sess.compiled.steps
    assert steps.direct is not None
    got = sess.run(None, feeds)
    direct, steps.direct = steps.direct, None
    assert_same(got, sess.run(None, feeds), 0, 0)
    steps.direct = direct
    assert_same(got, ort_run(model, feeds), rtol=1e-5, atol=1e-5)

    def no_memory(*args, **kwargs):
        raise MemoryError("test")

    ins = sess.partitions[0].program
    while hasattr(ins, "wrapped"):  # the backend's wrappers (BLAS threads, the pool)
        ins = ins.wrapped
    program = getattr(ins, "__self__", None)
    program = getattr(program, "program", program)
    monkeypatch.setattr(program.instrs[0], "fn", no_memory)
    with pytest.raises(anychip.OutOfMemoryError, match="MatMul"):
        sess.run(None, feeds)


@pytest.mark.parametrize("name", ["LinearRegression (regression)", "LinearSVC (multi)"])
def test_linear_models_read_float32_rows_in_place(name) -> None:
    """The linear kernels read float32 rows without a copy: the feed is left as it was, the
    outputs are their own arrays, equal to onnxruntime."""
    model, feeds = {n: b for n, b, _ in sklearn_cases(False)}[name]()
    x = feeds["X"]
    kept = x.copy()
    got = anychip.load(model, devices=["cpu"]).run(None, {"X": x})
    np.testing.assert_array_equal(x, kept)
    assert not any(np.shares_memory(g, x) for g in got if isinstance(g, np.ndarray))
    assert_same(got, ort_run(model, {"X": x}), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("swapped", [False, True])
def test_the_direct_run_keeps_input_and_output_order(swapped: bool) -> None:
    """The direct run passes the feeds and returns the outputs as they are when the partition
    takes and gives them in the graph's order, and reorders them when it does not."""
    rng = np.random.default_rng(12)
    a, b = ("b", "a") if swapped else ("a", "b")
    nodes = [h.make_node("Sub", [a, b], ["d"]), h.make_node("Neg", [a], ["n"])]
    vi = [h.make_tensor_value_info(n, T.FLOAT, [2, 3]) for n in "abdn"]
    outs = [vi[3], vi[2]] if swapped else [vi[2], vi[3]]
    graph = h.make_graph(nodes, "orders", vi[:2], outs)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    feeds = {n: rng.standard_normal((2, 3)).astype(np.float32) for n in "ab"}
    sess = anychip.load(model, devices=["cpu"])
    _, order, picks = sess.compiled.steps.direct
    assert (order is None and picks is None) is not swapped
    assert_same(sess.run(None, feeds), ort_run(model, feeds), 0, 0)
