"""The NPU's partition passes: each one verified, numerics unchanged, and idempotent."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

from anychip.backends.npu_stub.backend import NpuBackend
from anychip.backends.npu_stub.passes import (
    ConvertToNhwcPass,
    FuseConvActivationPass,
    npu_fold_batch_norm,
)
from tests.backends.npu_stub.conftest import convnet, ir_graph, run_on_npu


def _ops(graph):
    return Counter(n.op_type for n in graph.nodes)


def _check(model, feeds, passes, rtol=1e-5):
    """Run ``passes`` in order on a fresh graph, verifying after each; compare numerics with
    the graph before any pass. Returns the rewritten graph."""
    (want,) = run_on_npu(ir_graph(model), feeds)
    graph = ir_graph(model)
    for p in passes:
        assert p(graph).modified, p
        graph.verify()
        (got,) = run_on_npu(graph, feeds)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)
    assert not passes[-1](graph).modified  # nothing left to do: a second run changes nothing
    graph.verify()
    return graph


def test_fold_batch_norm(x):
    graph = _check(convnet(), {"x": x}, [npu_fold_batch_norm()])
    assert "BatchNormalization" not in _ops(graph)
    assert "w1" not in graph.initializers  # the unfolded weights are gone from the partition
    assert graph.meta["passes"] == ["fold_batch_norm"]


def test_fuse_conv_activation(x):
    graph = _check(convnet(), {"x": x}, [npu_fold_batch_norm(), FuseConvActivationPass()])
    fused = [n for n in graph.nodes if n.op_type == "NpuConv"]
    assert len(fused) == 2 and all(n.domain == "anychip" for n in fused)
    assert {n.attr("activation") for n in fused} == {"Relu"}
    assert _ops(graph)["Conv"] == 0
    assert _ops(graph)["Relu"] == 1  # the Relu after the pool has no conv to join


def test_convert_to_nhwc(x):
    passes = [npu_fold_batch_norm(), FuseConvActivationPass(), ConvertToNhwcPass()]
    graph = _check(convnet(), {"x": x}, passes)
    layouts = {n.attr("layout") for n in graph.nodes if n.op_type in ("NpuConv", "NpuPool")}
    assert layouts == {"NHWC"}
    # Only the partition's edges keep a transpose: after the input, before Flatten.
    perms = [tuple(n.attr("perm")) for n in graph.nodes if n.op_type == "Transpose"]
    assert sorted(perms) == [(0, 2, 3, 1), (0, 3, 1, 2)]
    assert [v.name for v in graph.outputs] == ["y"]
    info = NpuBackend(memory=16 << 20).compile(graph).info
    assert info["nodes_after_passes"] < info["nodes_before_passes"]
    assert info["fused_ops"] == 2


def _conv_model(tail, extra_inits=(), outputs=("y",), out_shapes=None):
    rng = np.random.default_rng(3)
    inits = [
        nh.from_array((rng.standard_normal((4, 3, 3, 3)) * 0.5).astype(np.float32), "w"),
        nh.from_array((rng.standard_normal((4, 4, 1, 1)) * 0.5).astype(np.float32), "w2"),
        *extra_inits,
    ]
    nodes = [h.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"), *tail]
    outs = [h.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = h.make_graph(
        nodes, "m", [h.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 6, 6])], outs, inits
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


X6 = np.random.default_rng(4).standard_normal((1, 3, 6, 6)).astype(np.float32) * 3


def test_clip_fuses_with_its_bounds():
    lo = nh.from_array(np.array(0.0, np.float32), "lo")
    hi = nh.from_array(np.array(2.0, np.float32), "hi")
    model = _conv_model([h.make_node("Clip", ["c", "lo", "hi"], ["y"])], [lo, hi])
    graph = _check(model, {"x": X6}, [FuseConvActivationPass()])
    (node,) = graph.nodes
    assert node.op_type == "NpuConv" and node.attr("activation") == "Clip"
    assert node.attr("activation_params") == [0.0, 2.0]
    (out,) = run_on_npu(graph, {"x": X6})
    assert out.min() == 0.0 and out.max() == 2.0


def test_no_fusion_when_the_conv_output_has_other_readers():
    model = _conv_model(
        [h.make_node("Relu", ["c"], ["y"]), h.make_node("Sigmoid", ["c"], ["z"])],
        outputs=("y", "z"),
    )
    graph = ir_graph(model)
    assert not FuseConvActivationPass()(graph).modified
    assert not npu_fold_batch_norm()(graph).modified
    assert _ops(graph) == Counter({"Conv": 1, "Relu": 1, "Sigmoid": 1})


def test_nhwc_permutes_broadcast_constants_and_keeps_graph_outputs():
    bias = nh.from_array(np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1), "bias")
    tail = [
        h.make_node("Add", ["c", "bias"], ["a"]),
        h.make_node("Relu", ["a"], ["r"]),
        h.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    model = _conv_model(tail, [bias], outputs=("y", "r"))
    (want_y, want_r) = _run_all(ir_graph(model))
    graph = ir_graph(model)
    assert ConvertToNhwcPass()(graph).modified
    graph.verify()
    assert [v.name for v in graph.outputs] == ["y", "r"]
    add = next(n for n in graph.nodes if n.op_type == "Add")
    assert add.inputs[1].shape == (1, 1, 1, 4)  # the constant moved to NHWC with its data
    got_y, got_r = _run_all(graph)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_r, want_r, rtol=1e-5, atol=1e-6)


def _run_all(graph):
    npu = NpuBackend(memory=16 << 20)
    compiled = npu.compile(graph)
    return [npu.to_host(t) for t in compiled.run([npu.to_device(X6)])]
