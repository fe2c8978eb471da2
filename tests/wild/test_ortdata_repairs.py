"""Structural problems found in onnxruntime's own test models (bench/wild_ortdata.py), rebuilt
here with onnx.helper: anychip repairs each with a warning and gives onnxruntime's result."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.wild._compare import anychip_run, assert_same, ort_run

_X = np.random.default_rng(45).standard_normal((2, 4)).astype(np.float32)


def _model(nodes: list, opset: int = 11) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [
            helper.make_tensor("scale", TensorProto.FLOAT, [4], [1.0, 2.0, 0.5, 1.5]),
            helper.make_tensor("bias", TensorProto.FLOAT, [4], [0.1, 0.0, -0.2, 0.3]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=7)


def test_node_without_outputs_dropped() -> None:
    branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["z"])],
        "b",
        [],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])],
    )
    dead_if = helper.make_node("If", [], [], name="If1", then_branch=branch, else_branch=branch)
    model = _model([helper.make_node("Relu", ["x"], ["y"]), dead_if])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)
    want = ort_run(model, {"x": _X})
    got, warned = anychip_run(model, {"x": _X})
    assert_same(got, want)
    assert any("no outputs" in w and "If1" in w for w in warned), warned


def test_misspelt_contrib_attribute_ignored() -> None:
    # LayerNormalization below opset 17 is onnxruntime's contrib op (registered in the default
    # domain); the misspelling is that of onnxruntime's attention_mask_no_cast.onnx
    node = helper.make_node(
        "LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsion=1e-5
    )
    model = _model([node])
    want = ort_run(model, {"x": _X})
    got, warned = anychip_run(model, {"x": _X})
    assert_same(got, want)
    assert any("LayerNormalization.epsion" in w for w in warned), warned


def test_known_contrib_attributes_kept() -> None:
    node = helper.make_node("LayerNormalization", ["x", "scale", "bias"], ["y"], epsilon=0.5)
    model = _model([node])
    want = ort_run(model, {"x": _X})
    got, warned = anychip_run(model, {"x": _X})
    assert_same(got, want)
    assert not any("does not define" in w for w in warned), warned


@pytest.mark.parametrize("op", ["LayerNormalization", "SimplifiedLayerNormalization"])
@pytest.mark.parametrize("declared", [True, False])
def test_contrib_norm_output_has_the_scale_type(op: str, declared: bool) -> None:
    # onnxruntime's contrib norms type Y as the scale (V), not X (T): float16 X, float32
    # scale give float32 Y (its skip_layer_norm_no_beta_with_cast.onnx)
    x = np.random.default_rng(46).standard_normal((3, 8)).astype(np.float16)
    nodes = [helper.make_node(op, ["x", "scale"], ["n"], axis=-1, epsilon=1e-5)]
    nodes.append(helper.make_node("Identity", ["n"], ["y"]))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [3, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 8])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [8], np.linspace(0.5, 2, 8))],
        value_info=[helper.make_tensor_value_info("n", TensorProto.FLOAT, [3, 8])]
        if declared
        else [],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    want = ort_run(model, {"x": x})
    got, _ = anychip_run(model, {"x": x})
    assert got[0].dtype == np.float32
    assert_same(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("ml_opset", [1, 3])
def test_tree_ensemble_regressor_on_doubles_gives_floats(ml_opset: int) -> None:
    # onnxruntime's tree_ensemble_as_tensor.onnx: a double input, its scores declared float
    node = helper.make_node(
        "TreeEnsembleRegressor",
        ["x"],
        ["t"],
        domain="ai.onnx.ml",
        n_targets=1,
        nodes_treeids=[0, 0, 0],
        nodes_nodeids=[0, 1, 2],
        nodes_featureids=[1, 0, 0],
        nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"],
        nodes_values=[0.25, 0, 0],
        nodes_truenodeids=[1, 0, 0],
        nodes_falsenodeids=[2, 0, 0],
        target_treeids=[0, 0],
        target_nodeids=[1, 2],
        target_ids=[0, 0],
        target_weights=[1.5, -2.25],
        base_values=[0.125],
    )
    cast = helper.make_node("Cast", ["t"], ["y"], to=TensorProto.DOUBLE)
    graph = helper.make_graph(
        [node, cast],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.DOUBLE, [None, 2])],
        [helper.make_tensor_value_info("y", TensorProto.DOUBLE, [None, 1])],
        value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [None, 1])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", ml_opset)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    x = np.random.default_rng(47).standard_normal((5, 2))
    want = ort_run(model, {"x": x})
    got, _ = anychip_run(model, {"x": x})
    assert_same(got, want)


@pytest.mark.parametrize("iter_shape", [[1], []])
def test_loop_iteration_number_shaped_as_the_body_declares(iter_shape: list) -> None:
    # onnxruntime's fp16model_loop.onnx: the body declares the iteration number [1] and
    # squeezes it; onnxruntime feeds it so
    squeeze = [helper.make_node("Squeeze", ["i"], ["i0"], axes=[0])] if iter_shape else []
    body = helper.make_graph(
        [
            *squeeze,
            helper.make_node("Cast", ["i0" if iter_shape else "i"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Add", ["acc", "f"], ["acc_out"]),
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, iter_shape),
            helper.make_tensor_value_info("c", TensorProto.BOOL, iter_shape),
            helper.make_tensor_value_info("acc", TensorProto.FLOAT, [2, 4]),
        ],
        [
            helper.make_tensor_value_info("c_out", TensorProto.BOOL, iter_shape),
            helper.make_tensor_value_info("acc_out", TensorProto.FLOAT, [2, 4]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor("n", TensorProto.INT64, [], [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)], ir_version=7)
    want = ort_run(model, {"x": _X})
    got, _ = anychip_run(model, {"x": _X})
    assert_same(got, want)
