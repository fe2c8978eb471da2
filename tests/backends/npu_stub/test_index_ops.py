"""The NPU's index datapath (kernels/op_index.py: the shape and mask arithmetic of transformer
exports over int64, int32, bool and float32) against onnx's reference evaluator. The output
shapes are made concrete from the reference, as the runtime's trace does before a compile."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h
from onnx import numpy_helper as nh
from onnx.reference import ReferenceEvaluator

from tests.backends.npu_stub.conftest import ir_graph, run_on_npu

R = np.random.default_rng(11)
F = R.standard_normal((2, 3, 4)).astype(np.float32)
I64 = R.integers(-5, 5, (2, 3, 4)).astype(np.int64)
B = R.random((2, 3, 4)) > 0.5
EMB = R.standard_normal((16, 8)).astype(np.float32)
IDS = R.integers(-16, 16, (2, 5)).astype(np.int64)


def i64(*v):
    return np.array(v, np.int64)


# name: (op, inputs, indices of inputs that are initializers, attributes, number of outputs)
CASES = {
    "shape": ("Shape", [F], (), {}),
    "shape_slice": ("Shape", [F], (), {"start": 1, "end": -1}),
    "gather_embedding": ("Gather", [EMB, IDS], (0,), {}),
    "gather_int_axis1": ("Gather", [I64, i64(2, -1)], (), {"axis": 1}),
    "gather_elements": ("GatherElements", [F, R.integers(-3, 3, (2, 2, 4))], (), {"axis": 1}),
    "gather_nd": ("GatherND", [F, i64([[0, 1], [1, -1]])], (), {}),
    "unsqueeze": ("Unsqueeze", [I64, i64(0, -1)], (1,), {}),
    "squeeze": ("Squeeze", [F[:1], i64(0)], (1,), {}),
    "expand": ("Expand", [F[:, :1], i64(2, 1, 3, 4)], (1,), {}),
    "cast_to_int": ("Cast", [F * 4], (), {"to": TensorProto.INT64}),
    "cast_bool_to_float": ("Cast", [B], (), {"to": TensorProto.FLOAT}),
    "where": ("Where", [B, F, np.float32(-1e9)], (), {}),
    "where_int": ("Where", [B, I64, i64(7)], (), {}),
    "range": ("Range", [np.int64(2), np.int64(11), np.int64(3)], (0, 1, 2), {}),
    "and": ("And", [B, ~B[:1]], (), {}),
    "or": ("Or", [B, B[:, :1]], (), {}),
    "not": ("Not", [B], (), {}),
    "equal": ("Equal", [I64, i64(0)], (), {}),
    "less": ("Less", [F, np.float32(0.1)], (), {}),
    "greater": ("Greater", [I64, I64[:, :1]], (), {}),
    "less_or_equal": ("LessOrEqual", [I64, I64[:1]], (), {}),
    "greater_or_equal": ("GreaterOrEqual", [I64, i64(1)], (), {}),
    "max_int": ("Max", [I64, i64(0), I64[:1] - 1], (), {}),
    "min_float": ("Min", [F, np.float32(0.2)], (), {}),
    "slice": ("Slice", [F, i64(0, -3), i64(2, 99), i64(0, 2)], (1, 2, 3), {}),
    "slice_back": ("Slice", [F, i64(-1), i64(-99), i64(2), i64(-2)], (1, 2, 3, 4), {}),
    "slice_runtime": ("Slice", [I64, i64(1), i64(3), i64(1)], (), {}),
    "constant_of_shape": (
        "ConstantOfShape",
        [i64(2, 3)],
        (0,),
        {"value": nh.from_array(np.array([7], np.int64))},
    ),
    "cumsum": ("CumSum", [I64, np.int64(1)], (1,), {}),
    "cumsum_excl_rev": ("CumSum", [I64, np.int64(-1)], (1,), {"exclusive": 1, "reverse": 1}),
    "neg": ("Neg", [I64], (), {}),
    "pow": ("Pow", [F, np.float32(3)], (1,), {}),
    "add_int": ("Add", [I64, i64(3)], (), {}),
    "concat_int": ("Concat", [i64(1, 2), I64.reshape(-1)[:3]], (), {"axis": 0}),
    "reshape_runtime_shape": ("Reshape", [F, i64(2, -1)], (), {}),
}


def _model(op, inputs, consts, attributes, n_out=1):
    names, feeds, infos, inits = [], {}, [], []
    for i, arr in enumerate(inputs):
        arr = np.asarray(arr)
        names.append(f"in{i}")
        if i in consts:
            inits.append(nh.from_array(arr, f"in{i}"))
        else:
            feeds[f"in{i}"] = arr
            elem = h.np_dtype_to_tensor_dtype(arr.dtype)
            infos.append(h.make_tensor_value_info(f"in{i}", elem, list(arr.shape)))
    outs = [f"out{k}" for k in range(n_out)]
    node = h.make_node(op, names, outs, **attributes)
    graph = h.make_graph([node], op.lower(), infos, [], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    want = ReferenceEvaluator(model.SerializeToString() and _with_outputs(model, outs)).run(
        None, feeds
    )
    for name, w in zip(outs, want):
        elem = h.np_dtype_to_tensor_dtype(np.asarray(w).dtype)
        model.graph.output.append(h.make_tensor_value_info(name, elem, list(np.shape(w))))
    return onnx.shape_inference.infer_shapes(model), feeds, want


def _with_outputs(model, outs):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(h.make_empty_tensor_value_info(o) for o in outs)
    return m


@pytest.mark.parametrize("name", sorted(CASES))
def test_index_kernel_matches_reference(name):
    op, inputs, consts, attributes = CASES[name]
    model, feeds, want = _model(op, inputs, consts, attributes)
    graph = ir_graph(model)
    for v, w in zip(graph.outputs, want):
        # the trace's concrete shapes: a shape fed at run time (reshape_runtime_shape) is not
        # taken from the declaration at import (ir/onnx/_declared.py)
        v.shape = tuple(np.shape(w))
    got = run_on_npu(graph, feeds)
    for g, w in zip(got, want):
        assert g.shape == np.shape(w) and g.dtype == np.asarray(w).dtype, (g, w)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_split_writes_every_output():
    x = R.standard_normal((2, 3, 12)).astype(np.float32)
    model, feeds, want = _model("Split", [x], (), {"axis": 2, "num_outputs": 3}, n_out=3)
    got = run_on_npu(ir_graph(model), feeds)
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_out_of_range_gather_is_a_kernel_error():
    import anychip

    model, feeds, _ = _model("Gather", [EMB, i64(1, 2)], (0,), {})
    with pytest.raises(anychip.AnychipError, match="out of range"):
        run_on_npu(ir_graph(model), {"in1": i64(1, 16)})


def test_one_constant_feeding_several_inputs_reaches_each():
    """GPT-2's export slices with one constant as its ends, axes and steps."""
    node = h.make_node("Slice", ["x", "zero", "one", "one", "one"], ["y"])
    graph = h.make_graph(
        [node],
        "slice",
        [h.make_tensor_value_info("x", TensorProto.INT64, [2, 5])],
        [h.make_tensor_value_info("y", TensorProto.INT64, [2, 1])],
        [nh.from_array(i64(0), "zero"), nh.from_array(i64(1), "one")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 18)])
    x = I64.reshape(2, -1)[:, :5].copy()
    (got,) = run_on_npu(ir_graph(model), {"x": x})
    np.testing.assert_array_equal(got, x[:, :1])
