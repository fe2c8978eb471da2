"""Computed shapes on IREE devices: a Reshape whose target comes from ``Shape`` -> ``Gather``
-> ``Concat`` (with a ``-1``, as Hugging Face's ``view(B, S, -1, d)``) is probed with the
values its model computes, its ``-1`` resolved in the exported graph, and placed on the
device; results match onnxruntime at several lengths."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from tests.backends.iree.conftest import backend_or_skip, close, model, reference, weight

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _heads():
    """x [B, S, 8] -> MatMul -> Reshape to (B, S, -1, 4) computed from Shape(x) -> Transpose
    -> Softmax: the head split of attention, shapes computed as exporters write them."""
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "w"], ["h"]),
        n("Shape", ["x"], ["s"]),
        n("Gather", ["s", "i0"], ["b"], axis=0),
        n("Gather", ["s", "i1"], ["t"], axis=0),
        n("Unsqueeze", ["b", "ax0"], ["b1"]),
        n("Unsqueeze", ["t", "ax0"], ["t1"]),
        n("Concat", ["b1", "t1", "minus_one", "four"], ["target"], axis=0),
        n("Reshape", ["h", "target"], ["r"]),
        n("Transpose", ["r"], ["p"], perm=[0, 2, 1, 3]),
        n("Softmax", ["p"], ["y"], axis=-1),
    ]
    consts = [
        weight(rng, "w", 8, 8),
        numpy_helper.from_array(np.array(0, np.int64), "i0"),
        numpy_helper.from_array(np.array(1, np.int64), "i1"),
        numpy_helper.from_array(np.array([0], np.int64), "ax0"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
        numpy_helper.from_array(np.array([4], np.int64), "four"),
    ]
    return model(nodes, [("x", F, ["B", "S", 8])], [("y", F, ["B", 2, "S", 4])], consts)


def test_reshape_targets_resolved_keep_the_model_the_same():
    """The rewrite alone, checked by onnxruntime: same outputs, no ``-1`` reaches Reshape."""
    from anychip.backends.iree.compiler import resolve_reshape_targets

    m = _heads()
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(m)
    assert resolve_reshape_targets(rewritten) == 1
    onnx.checker.check_model(rewritten)
    reshape = next(n for n in rewritten.graph.node if n.op_type == "Reshape")
    assert reshape.input[1].endswith("target") and reshape.input[1] != "target"
    x = np.random.default_rng(1).standard_normal((2, 5, 8)).astype(np.float32)
    (want,) = reference(m, {"x": x})
    sess = ort.InferenceSession(rewritten.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    assert resolve_reshape_targets(model([], [], [], opset=10)) == 0


def test_computed_shape_inputs_are_probed_with_model_values():
    from anychip.backends.iree.probe import _computed_shape, model_values
    from anychip.core.plugin.host import get_registry
    from anychip.ir.onnx import import_model

    graph = import_model(_heads()).graph
    by_op = {n.op_type: n for n in graph.nodes}
    assert _computed_shape(by_op["Reshape"].inputs[1])
    assert not _computed_shape(by_op["Reshape"].inputs[0])  # data, not a shape
    values = model_values(graph, get_registry().kernel_table("cpu"), None)
    assert values is not None
    assert values[by_op["Reshape"].inputs[1]].tolist() == [3, 3, -1, 4]  # symbols at 3


@pytest.mark.parametrize("name", ["iree-cpu"])
def test_computed_reshape_runs_on_the_device(name):
    backend_or_skip(name)
    m = _heads()
    sess = anychip.load(m, devices=[name, "cpu"], cost_model=False)
    rows = {r.op_type: r for r in sess.placement().nodes}
    assert rows["Reshape"].device == name, rows["Reshape"].reason
    rng = np.random.default_rng(2)
    for b, s in ((1, 5), (2, 7)):
        x = rng.standard_normal((b, s, 8)).astype(np.float32)
        close(sess.run(None, {"x": x}), reference(m, {"x": x}))
    sess.close()
