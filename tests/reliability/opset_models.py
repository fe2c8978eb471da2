"""Models whose answer depends on their opset (an op's attribute form, or its semantics before
a version), each with seeded random inputs and weights: the cases the compile caches must keep
apart (issue 47)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
X_SHAPE = (2, 3, 4, 6)


def _model(op_nodes: list, opset: int, inits: list | None = None) -> onnx.ModelProto:
    """``x + k`` (a node every device runs) feeding ``op_nodes``, which read ``a``; output y."""
    k = np.random.default_rng(opset).standard_normal(X_SHAPE).astype(np.float32)
    nodes = [helper.make_node("Add", ["x", "k"], ["a"]), *op_nodes]
    graph = helper.make_graph(
        nodes,
        "opset_case",
        [helper.make_tensor_value_info("x", F, list(X_SHAPE))],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(k, "k"), *(inits or [])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


def _c(name: str, values: list, dtype: type = np.int64) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, dtype), name)


def cases() -> dict[str, onnx.ModelProto]:
    n = helper.make_node
    return {
        "softmax_11": _model([n("Softmax", ["a"], ["y"], axis=1)], 11),
        "logsoftmax_11": _model([n("LogSoftmax", ["a"], ["y"], axis=2)], 11),
        "hardmax_11": _model([n("Hardmax", ["a"], ["y"], axis=1)], 11),
        "softmax_13": _model([n("Softmax", ["a"], ["y"], axis=1)], 13),
        "split_11": _model(
            [
                n("Split", ["a"], ["s0", "s1"], axis=3, split=[2, 4]),
                n("ReduceSum", ["s1"], ["r"], axes=[3], keepdims=1),
                n("Mul", ["s0", "r"], ["y"]),
            ],
            11,
        ),
        "squeeze_unsqueeze_11": _model(
            [
                n("ReduceMean", ["a"], ["m"], axes=[1], keepdims=1),
                n("Squeeze", ["m"], ["q"], axes=[1]),
                n("Unsqueeze", ["q"], ["y"], axes=[0]),
            ],
            11,
        ),
        "reduce_max_11": _model([n("ReduceMax", ["a"], ["y"], axes=[1, 3], keepdims=0)], 11),
        "pad_2": _model([n("Pad", ["a"], ["y"], pads=[0, 0, 1, 2, 0, 0, 1, 0], value=0.5)], 10),
        "pad_11": _model(
            [n("Pad", ["a", "p", "v"], ["y"], mode="reflect")],
            11,
            [_c("p", [0, 0, 1, 2, 0, 0, 1, 0]), _c("v", 0.0, np.float32)],
        ),
        "resize_10": _model(
            [n("Resize", ["a", "sc"], ["y"], mode="nearest")],
            10,
            [_c("sc", [1, 1, 2, 2], np.float32)],
        ),
        "resize_11": _model(
            [n("Resize", ["a", "roi", "sc"], ["y"], mode="linear")],
            11,
            [_c("roi", [], np.float32), _c("sc", [1, 1, 2, 2], np.float32)],
        ),
        "clip_6": _model([n("Clip", ["a"], ["y"], min=-0.5, max=0.75)], 10),
    }


def feed(seed: int) -> np.ndarray:
    return np.random.default_rng(1000 + seed).standard_normal(X_SHAPE).astype(np.float32)
