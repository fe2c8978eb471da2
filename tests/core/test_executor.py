"""``core/run/program.py``: ``Program`` on small graphs: outputs, frees after the last use,
errors naming the node, nested graphs reading outer values."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from anychip.core.compile.pipeline import resolve_schemas
from anychip.core.plugin.host import get_registry
from anychip.core.run.program import Program
from anychip.core.run.slots import free_after_last_use
from anychip.errors import InputError, KernelError
from anychip.ir.onnx import import_model


def _program(nodes, inputs, outputs, opset: int = 17) -> Program:
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    registry = get_registry()
    model = import_model(proto)
    resolve_schemas(model, registry.schemas)
    cpu = registry.backends["cpu"]
    return Program(model.graph, cpu, registry.kernel_table("cpu"), registry.schemas)


def _f(name: str, shape: list) -> object:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def test_three_nodes_compute_and_free_each_value_after_its_last_reader() -> None:
    prog = _program(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Exp", ["a"], ["b"], name="exp"),
            helper.make_node("Add", ["a", "b"], ["y"], name="add"),
        ],
        [_f("x", [3, 5])],
        [_f("y", [3, 5])],
    )
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    (y,) = prog.run([x])
    a = np.maximum(x, 0)
    np.testing.assert_allclose(y, a + np.exp(a), rtol=1e-6)
    slot = {v.name: s for v, s in prog.slot_of.items()}
    frees = {ins.node.name: set(ins.frees) for ins in prog.instrs}
    assert frees["relu"] == set()  # x is the caller's: never freed by the program
    assert frees["exp"] == set()  # a is still read by add
    assert frees["add"] == {slot["a"], slot["b"]}
    assert slot["y"] not in set().union(*frees.values())  # outputs are kept


def test_a_kernel_failure_names_the_node_and_the_program_stays_usable() -> None:
    prog = _program(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
        [_f("x", ["n", "k"]), _f("w", ["k2", "m"])],
        [_f("y", ["n", "m"])],
    )
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((4, 5))
    with pytest.raises(KernelError, match="node 'proj' \\(MatMul\\) failed"):
        prog.run([x, w.astype(np.float32)])
    w3 = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(prog.run([x, w3])[0], x @ w3, rtol=1e-5)


def test_anychip_errors_keep_their_class_and_gain_the_node() -> None:
    prog = _program(
        [helper.make_node("Relu", ["x"], ["y"], name="act")], [_f("x", [2])], [_f("y", [2])]
    )

    def refuse(x):
        raise InputError("no negative zeros here")

    prog.instrs[0].fn = refuse
    with pytest.raises(InputError, match="node 'act' \\(Relu\\) failed: no negative zeros"):
        prog.run([np.zeros(2, np.float32)])


def test_a_nested_graph_reads_an_outer_value() -> None:
    then_out = helper.make_tensor_value_info("t", TensorProto.FLOAT, [4])
    else_out = helper.make_tensor_value_info("e", TensorProto.FLOAT, [4])
    then_g = helper.make_graph([helper.make_node("Neg", ["a"], ["t"])], "then", [], [then_out])
    else_g = helper.make_graph([helper.make_node("Exp", ["a"], ["e"])], "else", [], [else_out])
    prog = _program(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("If", ["c"], ["y"], name="if", then_branch=then_g, else_branch=else_g),
        ],
        [_f("x", [4]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [_f("y", [4])],
    )
    x = np.random.default_rng(2).standard_normal(4).astype(np.float32)
    a = np.maximum(x, 0)
    np.testing.assert_allclose(prog.run([x, np.array(True)])[0], -a)
    np.testing.assert_allclose(prog.run([x, np.array(False)])[0], np.exp(a), rtol=1e-6)
    # ``a`` is read inside If's branches: it lives until If has run.
    slot_a = next(s for v, s in prog.slot_of.items() if v.name == "a")
    assert slot_a in prog.instrs[1].frees and slot_a in prog.instrs[1].reads


def test_free_after_last_use_is_the_one_routine() -> None:
    assert free_after_last_use([(0, 1), (1, 2), (2, 3)], keep=[3]) == [(0,), (1,), (2,)]
    assert free_after_last_use([(0, -1), (0,)], keep=[]) == [(), (0,)]
