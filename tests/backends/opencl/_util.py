"""Helpers of the OpenCL tests: one-node models, and runs compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

import anychip

__all__ = ["one_node", "run_both", "check", "check_op", "rand"]

RNG = np.random.default_rng(0)
#: outputs whose type is not the first input's
OUT_TYPES = {("MaxPool", 1): onnx.TensorProto.INT64}


def rand(*shape: int, dtype=np.float32) -> np.ndarray:
    """Seeded normal values (never constant fills)."""
    return RNG.standard_normal(shape).astype(dtype)


def one_node(op: str, inputs: dict, outputs: int = 1, opset: int = 17, **attrs) -> onnx.ModelProto:
    """A model of one ``op`` node over float/int inputs given as numpy arrays."""
    vis = [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
        for n, a in inputs.items()
    ]
    outs = [f"y{i}" for i in range(outputs)]
    first = helper.np_dtype_to_tensor_dtype(next(iter(inputs.values())).dtype)
    types = [first] + [OUT_TYPES.get((op, i), first) for i in range(1, outputs)]
    node = helper.make_node(op, list(inputs), outs, **attrs)
    graph = helper.make_graph(
        [node], op, vis, [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, types)]
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def run_both(model: onnx.ModelProto, feeds: dict, devices=("opencl",)) -> tuple[list, list]:
    """(anychip outputs on ``devices`` strict, onnxruntime outputs). The outputs' types and
    shapes are declared from onnxruntime's results (anychip's loader checks the model)."""
    ref = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    typed = onnx.ModelProto()
    typed.CopyFrom(model)
    for out, r in zip(typed.graph.output, ref):
        out.CopyFrom(
            helper.make_tensor_value_info(
                out.name, helper.np_dtype_to_tensor_dtype(r.dtype), list(r.shape)
            )
        )
    sess = anychip.load(typed, devices=list(devices), strict=True)
    return sess.run(None, feeds), ref


def check(model: onnx.ModelProto, feeds: dict, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """The model on ``opencl`` alone (strict) agrees with onnxruntime."""
    got, ref = run_both(model, feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape and g.dtype == r.dtype
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def check_op(
    op: str,
    feeds: dict,
    *,
    outputs: int = 1,
    opset: int = 17,
    rtol: float = 1e-4,
    atol: float = 1e-5,
    **attrs,
) -> None:
    """One ``op`` node over ``feeds`` (graph inputs) on ``opencl`` agrees with onnxruntime."""
    check(one_node(op, feeds, outputs, opset, **attrs), feeds, rtol=rtol, atol=atol)
