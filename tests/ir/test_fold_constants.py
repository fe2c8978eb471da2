"""``FoldConstantsPass``: constant subexpressions become initializers, except results larger
than ``max_bytes``, which are refused from their inferred size before anything is made."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from anychip.ir.onnx import import_model
from anychip.ir.passes.fold_constants import FoldConstantsPass


def _graph(n: int):
    shape = numpy_helper.from_array(np.array([n], np.int64), "shape")
    graph = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["c"]),
            helper.make_node("Add", ["x", "c"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])],
        [shape],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return import_model(model.SerializeToString()).graph


def _evaluate(calls: list):
    def evaluate(node, ins):
        calls.append(node.op_type)
        return [np.zeros(tuple(int(d) for d in ins[0]), np.float32)]

    return evaluate


def test_a_constant_subexpression_becomes_an_initializer():
    graph, calls = _graph(1000), []
    fold = FoldConstantsPass(_evaluate(calls), max_bytes=1 << 20)
    assert fold.call(graph).modified
    assert calls == ["ConstantOfShape"] and [n.op_type for n in graph.nodes] == ["Add"]
    assert graph.initializers["c"].const.shape == (1000,)


def test_a_result_over_max_bytes_is_never_made():
    graph, calls = _graph(1000), []  # 4,000 bytes of float32
    fold = FoldConstantsPass(_evaluate(calls), max_bytes=1000)
    assert not fold.call(graph).modified
    assert calls == []  # refused from the inferred shape, not after evaluating
    assert [n.op_type for n in graph.nodes] == ["ConstantOfShape", "Add"]
