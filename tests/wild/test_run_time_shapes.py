"""Shapes that follow data fed at run time, declared by the exporter with the numbers of its
one trace: onnxruntime runs with the actual sizes (a warning), and so does anychip, instead of
failing the kernel's check against the declaration (ir/onnx/_declared.py). Plus the
TreeEnsembleRegressor's tensor-valued attributes. Each compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tests.wild._compare import anychip_run, assert_same, ort_run


def _model(nodes, inputs, outputs, inits=(), value_info=(), opset=17) -> onnx.ModelProto:
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits), value_info=list(value_info))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset), h.make_opsetid("ai.onnx.ml", 3)])
    m.ir_version = 8
    return m


def _same(model: onnx.ModelProto, feeds: dict) -> None:
    got, _ = anychip_run(model, feeds)
    assert_same(got, ort_run(model, feeds))


@pytest.mark.parametrize("where", ["output", "value_info"])
def test_reshape_to_a_shape_fed_at_run_time(where) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    nodes = [h.make_node("Reshape", ["x", "s"], ["t"]), h.make_node("Relu", ["t"], ["y"])]
    declared = h.make_tensor_value_info("t" if where == "value_info" else "y", T.FLOAT, [6, 4])
    inputs = [
        h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
        h.make_tensor_value_info("s", T.INT64, [2]),
    ]
    outputs = [declared if where == "output" else h.make_tensor_value_info("y", T.FLOAT, None)]
    vi = [declared] if where == "value_info" else []
    model = _model(nodes, inputs, outputs, value_info=vi)
    for shape in ([6, 4], [4, 6], [-1, 3]):  # the declared one, then two others
        _same(model, {"x": x, "s": np.array(shape, np.int64)})


def test_reshape_whose_declared_rank_is_the_traces() -> None:
    # onnxruntime's reshape_fusion_with_graph_inputs.onnx: the shape is computed from an
    # input's shape, the output declared [10, 20, ?] although the result is 2-D
    x = np.random.default_rng(4).standard_normal((1, 20, 5)).astype(np.float32)
    nodes = [
        h.make_node("Shape", ["q"], ["qs"]),
        h.make_node("Gather", ["qs", "one"], ["n"], axis=0),
        h.make_node("Unsqueeze", ["n"], ["n1"], axes=[0]),
        h.make_node("Concat", ["minus1", "n1"], ["s"], axis=0),
        h.make_node("Reshape", ["x", "s"], ["y"]),
    ]
    inits = [
        nh.from_array(np.array(1, np.int64), "one"),
        nh.from_array(np.array([-1], np.int64), "minus1"),
    ]
    model = _model(
        nodes,
        [
            h.make_tensor_value_info("q", T.FLOAT, [1, 5]),
            h.make_tensor_value_info("x", T.FLOAT, [1, 20, 5]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [10, 20, None])],
        inits,
        opset=11,
    )
    _same(model, {"q": np.zeros((1, 5), np.float32), "x": x})


def test_constant_of_shape_from_an_input_with_a_tensor_value() -> None:
    value = nh.from_array(np.array([7], np.int32))
    node = h.make_node("ConstantOfShape", ["s"], ["y"], value=value)
    model = _model(
        [node],
        [h.make_tensor_value_info("s", T.INT64, [2])],
        [h.make_tensor_value_info("y", T.INT32, [2, 3])],
    )
    for shape in ([2, 3], [3, 2], [0, 5]):
        _same(model, {"s": np.array(shape, np.int64)})


def test_loop_trip_count_fed_and_a_body_input_shadowing_an_outer_name() -> None:
    rng = np.random.default_rng(2)
    body = h.make_graph(
        [
            h.make_node("Add", ["x", "w"], ["bt"]),  # "x": the body's own input, not the outer x
            h.make_node("Identity", ["cond_in"], ["cond_out"]),
            h.make_node("Mul", ["bt", "half"], ["x_out"]),
            h.make_node("Concat", ["bt", "bt"], ["scan"], axis=0),
        ],
        "body",
        [
            h.make_tensor_value_info("i", T.INT64, []),
            h.make_tensor_value_info("cond_in", T.BOOL, []),
            h.make_tensor_value_info("x", T.FLOAT, [3]),
        ],
        [
            h.make_tensor_value_info("cond_out", T.BOOL, []),
            h.make_tensor_value_info("x_out", T.FLOAT, [3]),
            h.make_tensor_value_info("scan", T.FLOAT, [6]),
        ],
        [nh.from_array(np.array(0.5, np.float32), "half")],
    )
    nodes = [
        h.make_node("Neg", ["x"], ["t"]),
        h.make_node("Loop", ["n", "c", "t"], ["last", "scans"], body=body),
        h.make_node("Add", ["last", "t"], ["y"]),
    ]
    model = _model(
        nodes,
        [
            h.make_tensor_value_info("x", T.FLOAT, [3]),
            h.make_tensor_value_info("n", T.INT64, []),
            h.make_tensor_value_info("c", T.BOOL, []),
        ],
        [
            h.make_tensor_value_info("y", T.FLOAT, [3]),
            h.make_tensor_value_info("scans", T.FLOAT, [4, 6]),  # the trace's trip count
        ],
        [nh.from_array(rng.standard_normal(3).astype(np.float32), "w")],
    )
    x = rng.standard_normal(3).astype(np.float32)
    for n in (4, 2, 7):
        _same(model, {"x": x, "n": np.array(n, np.int64), "c": np.array(True)})


def test_tree_ensemble_regressor_with_tensor_attributes() -> None:
    rng = np.random.default_rng(3)
    common = dict(
        n_targets=1,
        nodes_treeids=[0, 0, 0, 1, 1, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 0, 1, 2, 3, 4],
        nodes_featureids=[0, 0, 0, 1, 2, 0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "BRANCH_GTE"] + ["LEAF"] * 3,
        nodes_truenodeids=[1, 0, 0, 1, 3, 0, 0, 0],
        nodes_falsenodeids=[2, 0, 0, 2, 4, 0, 0, 0],
        target_treeids=[0, 0, 1, 1, 1],
        target_nodeids=[1, 2, 2, 3, 4],
        target_ids=[0] * 5,
    )
    splits = np.array([0.1, 0, 0, -0.2, 0.3, 0, 0, 0], np.float32)
    weights = rng.standard_normal(5).astype(np.float32)
    node = h.make_node(
        "TreeEnsembleRegressor",
        ["X"],
        ["Y"],
        domain="ai.onnx.ml",
        nodes_values_as_tensor=nh.from_array(splits),
        target_weights_as_tensor=nh.from_array(weights),
        base_values_as_tensor=nh.from_array(np.array([0.125], np.float32)),
        **common,
    )
    model = _model(
        [node],
        [h.make_tensor_value_info("X", T.FLOAT, [None, 3])],
        [h.make_tensor_value_info("Y", T.FLOAT, [None, 1])],
    )
    _same(model, {"X": rng.standard_normal((9, 3)).astype(np.float32)})


def test_a_shape_fed_at_run_time_on_the_static_npu() -> None:
    """The NPU compiles per input signature; a Reshape to a fed shape gives each shape's
    answer (the declaration [2, 12] is the exporter's one trace)."""
    import warnings

    import anychip

    nodes = [
        h.make_node("Relu", ["x"], ["r"]),
        h.make_node("Reshape", ["r", "s"], ["t"]),
        h.make_node("Relu", ["t"], ["y"]),
    ]
    model = _model(
        nodes,
        [
            h.make_tensor_value_info("x", T.FLOAT, [2, 3, 4]),
            h.make_tensor_value_info("s", T.INT64, [2]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 12])],
    )
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = anychip.load(model, devices=["npu", "cpu"])
    for shape in ([2, 12], [4, 6], [24, 1]):
        feeds = {"x": x, "s": np.array(shape, np.int64)}
        (got,) = sess.run(None, feeds)
        np.testing.assert_array_equal(got, ort_run(model, feeds)[0])
