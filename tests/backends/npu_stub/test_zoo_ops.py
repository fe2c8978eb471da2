"""Ops the Hugging Face zoo (bench/hf_zoo.py) found missing on the NPU, strictly on ``npu,cpu``
against onnxruntime: the RMS norm of Llama-style decoders (ReduceMean, Reciprocal), integer
Div in shape arithmetic (GPT-NeoX's TorchScript export), Pad (MobileBERT, ConvBERT) and the
other reductions."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh

import anychip

R = np.random.default_rng(47)
X = R.standard_normal((2, 4, 8)).astype(np.float32)


def _i64(name: str, *v: int):
    return nh.from_array(np.array(v, np.int64), name)


def _model(nodes, inputs, inits, opset: int, out_type: int = TensorProto.FLOAT) -> bytes:
    infos = [
        h.make_tensor_value_info(n, h.np_dtype_to_tensor_dtype(a.dtype), list(a.shape))
        for n, a in inputs.items()
    ]
    out = h.make_tensor_value_info("y", out_type, None)
    graph = h.make_graph(nodes, "g", infos, [out], inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()


def _rms_norm(opset: int):
    mean = (
        h.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1)
        if opset >= 18
        else h.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1)
    )
    nodes = [
        h.make_node("Mul", ["x", "x"], ["sq"]),
        mean,
        h.make_node("Add", ["ms", "eps"], ["v"]),
        h.make_node("Sqrt", ["v"], ["r"]),
        h.make_node("Reciprocal", ["r"], ["inv"]),
        h.make_node("Mul", ["x", "inv"], ["n"]),
        h.make_node("Mul", ["n", "w"], ["y"]),
    ]
    inits = [
        nh.from_array(np.array(1e-6, np.float32), "eps"),
        nh.from_array(R.standard_normal(8).astype(np.float32), "w"),
    ]
    if opset >= 18:
        inits.append(_i64("axes", -1))
    return _model(nodes, {"x": X}, inits, opset), {"x": X}


def _int_div():
    a = np.array([7, -7, 6, -6, 0, 9], np.int64)
    b = np.array([2, 2, -4, -4, 3, 3], np.int64)
    nodes = [h.make_node("Div", ["a", "b"], ["y"])]
    return _model(nodes, {"a": a, "b": b}, [], 17, TensorProto.INT64), {"a": a, "b": b}


def _pad(mode: str):
    nodes = [h.make_node("Pad", ["x", "pads", "value"], ["y"], mode=mode)]
    inits = [_i64("pads", 0, 1, 2, 0, 2, -1), nh.from_array(np.array(0.5, np.float32), "value")]
    return _model(nodes, {"x": X}, inits, 13), {"x": X}


def _reduce(op: str, opset: int, keepdims: int):
    if op == "ReduceSum" and opset >= 13 or opset >= 18:
        node = h.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)
        return _model([node], {"x": X}, [_i64("axes", 0, 2)], opset), {"x": X}
    node = h.make_node(op, ["x"], ["y"], axes=[0, -1], keepdims=keepdims)
    return _model([node], {"x": X}, [], opset), {"x": X}


CASES = {
    "rms_norm_opset17": lambda: _rms_norm(17),
    "rms_norm_opset18": lambda: _rms_norm(18),
    "int_div_truncates": _int_div,
    "pad_constant_and_crop": lambda: _pad("constant"),
    "pad_reflect": lambda: _pad("reflect"),
    "pad_edge": lambda: _pad("edge"),
    "reduce_sum_13": lambda: _reduce("ReduceSum", 13, 1),
    "reduce_max_17": lambda: _reduce("ReduceMax", 17, 0),
    "reduce_min_18": lambda: _reduce("ReduceMin", 18, 1),
    "reduce_mean_all": lambda: (
        _model([h.make_node("ReduceMean", ["x"], ["y"], keepdims=0)], {"x": X}, [], 17),
        {"x": X},
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_zoo_op_runs_strictly_on_the_npu_as_onnxruntime(name):
    model, feeds = CASES[name]()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    sess = anychip.load(
        model, devices=["npu", "cpu"], strict=True, failover=False, cost_model=False,
        background_compile=False,
    )  # fmt: skip
    assert set(sess.placement().by_device()) == {"npu"}
    got = sess.run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
