"""The Conv + BatchNormalization fold: the session runs it before placement (``optimize``)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip
from anychip.ir.onnx import import_model
from anychip.ir.passes.fold_batch_norm import FoldBatchNormPass

RNG = np.random.default_rng(7)


def _model(
    dtype=np.float32, bias=True, extra_reader=False, bn_inputs=None, training=False
) -> onnx.ModelProto:
    """x -> Conv(w[, b]) -> BatchNormalization -> y (plus z = Relu(conv) when extra_reader)."""
    c_in, c_out = 3, 4
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    stats = {
        "scale": RNG.uniform(0.5, 2.0, c_out),
        "bias": RNG.standard_normal(c_out),
        "mean": RNG.standard_normal(c_out),
        "var": RNG.uniform(0.5, 2.0, c_out),
    }
    inits = [nh.from_array((RNG.standard_normal((c_out, c_in, 3, 3)) * 0.3).astype(dtype), "w")]
    conv_in = ["x", "w"]
    if bias:
        inits.append(nh.from_array(RNG.standard_normal(c_out).astype(dtype), "b"))
        conv_in.append("b")
    for k, v in stats.items():
        inits.append(nh.from_array(v.astype(dtype), k))
    nodes = [
        h.make_node("Conv", conv_in, ["c"], pads=[1, 1, 1, 1], name="conv"),
        h.make_node(
            "BatchNormalization",
            bn_inputs or ["c", "scale", "bias", "mean", "var"],
            ["y"],
            epsilon=1e-3,
            training_mode=int(training),
            name="bn",
        ),
    ]
    outs = [h.make_tensor_value_info("y", elem, [2, c_out, 5, 5])]
    if extra_reader:
        nodes.append(h.make_node("Relu", ["c"], ["z"], name="relu"))
        outs.append(h.make_tensor_value_info("z", elem, [2, c_out, 5, 5]))
    graph = h.make_graph(
        nodes, "m", [h.make_tensor_value_info("x", elem, [2, c_in, 5, 5])], outs, inits
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 15)])


def _reference(model, x, **feeds):
    """The unfolded graph, evaluated by onnx's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, {"x": x, **feeds})


@pytest.mark.parametrize("bias", [True, False], ids=["conv_bias", "no_conv_bias"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_cpu_folds_and_matches_the_unfolded_graph(dtype, bias):
    model = _model(dtype, bias)
    x = RNG.standard_normal((2, 3, 5, 5)).astype(dtype)
    sess = anychip.load(model, devices=["cpu"])
    (got,) = sess.run(None, {"x": x})
    (want,) = _reference(model, x)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    assert got.dtype == dtype
    assert sess.optimizations == {"fold_batch_norm": 1}
    assert "BatchNormalization" not in {n.op_type for n in sess.model.graph.nodes}


def test_optimize_false_and_pins_keep_the_batch_norm():
    x = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32)
    model = _model()
    (want,) = _reference(model, x)
    for sess in (
        anychip.load(model, devices=["cpu"], optimize=False),
        anychip.load(model, devices=["cpu"], placement={"bn": "cpu"}),
    ):
        assert sess.optimizations.get("fold_batch_norm", 0) == 0
        assert "BatchNormalization" in {n.op_type for n in sess.model.graph.nodes}
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_pass_rewrites_the_graph_and_drops_the_old_weights():
    graph = import_model(_model()).graph
    p = FoldBatchNormPass()
    assert p(graph).modified
    assert [n.op_type for n in graph.nodes] == ["Conv"]
    assert {"w", "b", "scale", "mean", "var"}.isdisjoint(graph.initializers)
    assert [v.name for v in graph.outputs] == ["y"]
    assert not p(graph).modified  # nothing left: a second call changes nothing
    assert p.folded == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_reader": True},  # the raw conv output is read elsewhere
        {"training": True},  # batch statistics, not the inference formula
    ],
    ids=["conv_output_read_elsewhere", "training_mode"],
)
def test_not_folded(kwargs):
    graph = import_model(_model(**kwargs)).graph
    assert not FoldBatchNormPass()(graph).modified
    assert "BatchNormalization" in [n.op_type for n in graph.nodes]


def test_statistics_fed_at_run_time_are_not_folded():
    model = _model()
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == "mean"))
    model.graph.input.append(h.make_tensor_value_info("mean", TensorProto.FLOAT, [4]))
    graph = import_model(model).graph
    assert not FoldBatchNormPass()(graph).modified
    sess = anychip.load(model, devices=["cpu"])
    x = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32)
    mean = np.zeros(4, np.float32)
    (got,) = sess.run(None, {"x": x, "mean": mean})
    (want,) = _reference(model, x, mean=mean)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_old_weights_are_freed_as_the_fold_goes():
    """Folding a model never holds all its old and new weights at once (ResNet-50's load
    peak rose by 90 MiB when it did): by the second fold the first conv's weights are gone."""
    import gc
    import weakref

    first = _model()
    second = onnx.ModelProto()
    second.CopyFrom(first)
    # Chain two Conv+BN pairs: y = BN2(Conv2(BN1(Conv1(x)))).
    g = first.graph
    for init in second.graph.initializer:
        init.name += "2"
        g.initializer.append(init)
    g.node.extend(
        [
            h.make_node("Conv", ["y", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], name="conv2",
                        group=1),
            h.make_node("BatchNormalization", ["c2", "scale2", "bias2", "mean2", "var2"],
                        ["y2"], name="bn2"),
        ]
    )  # fmt: skip
    g.initializer.remove(next(i for i in g.initializer if i.name == "w2"))
    w2 = (RNG.standard_normal((4, 4, 3, 3)) * 0.3).astype(np.float32)
    g.initializer.append(nh.from_array(w2, "w2"))
    del g.output[:]
    g.output.append(h.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 4, 5, 5]))
    graph = import_model(first).graph
    old = weakref.ref(graph.initializers["w"].const)
    seen = []

    def accept(conv, bn):
        gc.collect()
        seen.append(old() is None)
        return True

    from anychip.ir.passes.fold_batch_norm import fold_batch_norm

    assert fold_batch_norm(graph, accept=accept) == 2
    assert seen == [False, True]
