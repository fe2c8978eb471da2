"""Small ONNX models, one per fusion pattern, with seeded random weights, for the NaN/Inf tests."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F = TensorProto.FLOAT


def _model(
    nodes: list, inits: list, x_shape: list[int], outs: list, opset: int = 13
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", F, x_shape)], outs, inits
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _out(name: str = "y", dtype: int = F) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, None)


def _conv(act: str, opset: int = 13) -> Callable[[np.random.Generator], onnx.ModelProto]:
    def build(rng: np.random.Generator) -> onnx.ModelProto:
        w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
        b = rng.standard_normal(8).astype(np.float32)
        inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
        nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1])]
        if act == "Relu":
            nodes.append(helper.make_node("Relu", ["c"], ["y"]))
        elif act == "Clip" and opset < 11:
            nodes.append(helper.make_node("Clip", ["c"], ["y"], min=0.0, max=6.0))
        elif act == "Clip":
            inits += [
                numpy_helper.from_array(np.array(0, np.float32), "lo"),
                numpy_helper.from_array(np.array(6, np.float32), "hi"),
            ]
            nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["y"]))
        elif act == "AddRelu":
            r = rng.standard_normal((1, 8, 8, 8)).astype(np.float32)
            inits.append(numpy_helper.from_array(r, "R"))
            nodes += [
                helper.make_node("Add", ["c", "R"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ]
        return _model(nodes, inits, [1, 4, 8, 8], [_out()], opset)

    return build


def _gemm(act: str) -> Callable[[np.random.Generator], onnx.ModelProto]:
    def build(rng: np.random.Generator) -> onnx.ModelProto:
        w = rng.standard_normal((16, 32)).astype(np.float32)
        b = rng.standard_normal(32).astype(np.float32)
        inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
        if act == "MatMulAddRelu":
            nodes = [
                helper.make_node("MatMul", ["x", "W"], ["m"]),
                helper.make_node("Add", ["m", "B"], ["s"]),
                helper.make_node("Relu", ["s"], ["y"]),
            ]
        else:
            nodes = [
                helper.make_node("Gemm", ["x", "W", "B"], ["s"]),
                helper.make_node(act, ["s"], ["y"]),
            ]
        return _model(nodes, inits, [4, 16], [_out()])

    return build


def _elementwise(op: str) -> Callable[[np.random.Generator], onnx.ModelProto]:
    def build(rng: np.random.Generator) -> onnx.ModelProto:
        k = rng.standard_normal((4, 16)).astype(np.float32)
        inits = [numpy_helper.from_array(k, "K")]
        nodes = [
            helper.make_node("Mul", ["x", "K"], ["m"]),
            helper.make_node(op, ["m", "K"], ["y"]),
        ]
        return _model(nodes, inits, [4, 16], [_out()])

    return build


def _chain(ops: tuple[str, ...]) -> Callable[[np.random.Generator], onnx.ModelProto]:
    def build(rng: np.random.Generator) -> onnx.ModelProto:
        k = rng.standard_normal((4, 16)).astype(np.float32)
        nodes = [helper.make_node("Add", ["x", "K"], ["t0"])]
        for i, op in enumerate(ops):
            nodes.append(helper.make_node(op, [f"t{i}"], [f"t{i + 1}"]))
        nodes.append(helper.make_node("Identity", [f"t{len(ops)}"], ["y"]))
        return _model(nodes, [numpy_helper.from_array(k, "K")], [4, 16], [_out()])

    return build


def _reduce(op: str) -> Callable[[np.random.Generator], onnx.ModelProto]:
    def build(rng: np.random.Generator) -> onnx.ModelProto:
        k = rng.standard_normal((4, 16)).astype(np.float32)
        dtype = TensorProto.INT64 if op.startswith("Arg") else F
        nodes = [
            helper.make_node("Add", ["x", "K"], ["s"]),
            helper.make_node(op, ["s"], ["y"], axis=1, keepdims=0)
            if op.startswith("Arg")
            else helper.make_node(op, ["s"], ["y"], axes=[1], keepdims=0),
        ]
        return _model(nodes, [numpy_helper.from_array(k, "K")], [4, 16], [_out("y", dtype)], 13)

    return build


#: name -> builder; the input is x of the model's declared shape.
PATTERNS: dict[str, Callable[[np.random.Generator], onnx.ModelProto]] = {
    "conv_relu": _conv("Relu"),
    "conv_clip": _conv("Clip"),
    "conv_clip6": _conv("Clip", opset=6),
    "conv_add_relu": _conv("AddRelu"),
    "gemm_relu": _gemm("Relu"),
    "gemm_sigmoid": _gemm("Sigmoid"),
    "matmul_add_relu": _gemm("MatMulAddRelu"),
    "max": _elementwise("Max"),
    "min": _elementwise("Min"),
    "relu_chain": _chain(("Relu", "Neg", "Relu", "Abs")),
    "reduce_max": _reduce("ReduceMax"),
    "reduce_min": _reduce("ReduceMin"),
    "argmax": _reduce("ArgMax"),
    "argmin": _reduce("ArgMin"),
}


def nonfinite_input(model: onnx.ModelProto, rng: np.random.Generator) -> np.ndarray:
    """A seeded normal input with NaN, +Inf and -Inf at scattered places (one of each per row
    where the rows allow it, and one row left finite)."""
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    x = rng.standard_normal(dims).astype(np.float32)
    flat = x.reshape(dims[0], -1)
    n = flat.shape[1]
    for r in range(flat.shape[0] - 1):
        picks = rng.choice(n, size=3, replace=False)
        flat[r, picks[0]] = np.nan
        if r % 2 == 0:
            flat[r, picks[1]] = np.inf
        else:
            flat[r, picks[2]] = -np.inf
    if flat.shape[0] == 1:
        picks = rng.choice(n, size=3, replace=False)
        flat[0, picks] = [np.nan, np.inf, -np.inf]
    return x
