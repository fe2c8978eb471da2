"""FuseElementwisePass: chains fused (and equal to the unfused graph and onnxruntime), and the
cases it must leave alone."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import anychip
from anychip.errors import DeviceError
from tests.backends.cpu._fusion_models import check, model, ops, rand

N = helper.make_node
X = [("x", [2, 4, 3, 5])]


def _silu_chain():
    return model(
        [
            N("Add", ["x", "b"], ["a"]),
            N("Sigmoid", ["a"], ["s"]),
            N("Mul", ["a", "s"], ["m"]),
            N("Clip", ["m", "lo", ""], ["c"]),
            N("LeakyRelu", ["c"], ["y"], alpha=0.3),
        ],
        X,
        [("y", [2, 4, 3, 5])],
        [("b", rand(1, 4, 1, 1)), ("lo", np.array(-0.2, np.float32))],
    )


def test_a_chain_becomes_one_node():
    m = _silu_chain()
    assert ops(m) == ["FusedElementwise"]
    assert check(m) == {"fuse_elementwise": 1}


def test_a_chain_longer_than_a_group_becomes_several():
    """A 1,000-node chain (Add, Mul, Relu, Neg, Abs in turn) loads and runs fused, in groups
    of at most ``MAX_NODES`` (one group's expression tree failed with ``RecursionError``),
    equal to onnxruntime and to the unfused graph."""
    from anychip.ir.passes.patterns.fuse_elementwise import MAX_NODES
    from bench.dispatch import chain_model

    m = chain_model(1000)
    kinds = ops(m)
    assert set(kinds) == {"FusedElementwise"}
    assert len(kinds) == -(-1000 // MAX_NODES)
    check(m)


@pytest.mark.parametrize(
    "op, attrs, extra",
    [
        ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}, []),
        ("HardSwish", {}, []),
        ("Tanh", {}, []),
        ("Erf", {}, []),
        ("Exp", {}, []),
        ("Abs", {}, []),
        ("Neg", {}, []),
        ("Reciprocal", {}, []),
        ("Sqrt", {}, []),  # of |x| below
        ("Gelu", {}, []),
        ("Gelu", {"approximate": "tanh"}, []),
        ("Max", {}, ["x"]),
        ("Min", {}, ["x"]),
        ("Pow", {}, ["three"]),
        ("Div", {}, ["x"]),
        ("Sub", {}, ["x"]),
    ],
)
def test_each_op_fused_equals_onnxruntime(op, attrs, extra):
    opset = 20 if op == "Gelu" else 17
    nodes = [N("Abs", ["x"], ["ax"]), N("Add", ["ax", "half"], ["h"])]
    nodes.append(N(op, ["h", *extra], ["o"], **attrs))
    nodes.append(N("Mul", ["o", "x"], ["y"]))
    inits = [("half", np.array(0.5, np.float32)), ("three", np.array(3.0, np.float32))]
    m = model(nodes, X, [("y", [2, 4, 3, 5])], inits, opset=opset)
    assert check(m, seed=3) == {"fuse_elementwise": 1}


def test_values_read_outside_the_chain_are_kept():
    m = model(
        [N("Add", ["x", "x"], ["a"]), N("Relu", ["a"], ["r"]), N("Exp", ["a"], ["e"])],
        X,
        [("r", [2, 4, 3, 5]), ("e", [2, 4, 3, 5])],
    )
    assert check(m) == {}  # a has two readers and each group is one node
    m = model(
        [N("Add", ["x", "x"], ["a"]), N("Relu", ["a"], ["y"])],
        X,
        [("a", [2, 4, 3, 5]), ("y", [2, 4, 3, 5])],
    )
    assert check(m) == {}  # a is a graph output


def test_one_node_is_fused_when_it_is_three_primitives_or_more():
    y = [("y", [2, 4, 3, 5])]
    assert ops(model([N("HardSwish", ["x"], ["y"])], X, y)) == ["FusedElementwise"]
    assert ops(model([N("Sigmoid", ["x"], ["y"])], X, y)) == ["Sigmoid"]


def test_what_cannot_be_expressed_is_not_fused():
    m = model([N("Pow", ["x", "x"], ["p"]), N("Relu", ["p"], ["y"])], X, [("y", [2, 4, 3, 5])])
    assert ops(m) == ["Pow", "Relu"]
    m = model([N("Softmax", ["x"], ["s"]), N("Relu", ["s"], ["y"])], X, [("y", [2, 4, 3, 5])])
    assert ops(m) == ["Softmax", "Relu"]


def test_disabled_by_name_by_switch_and_by_environment(monkeypatch):
    m = _silu_chain()
    assert "FusedElementwise" not in ops(m, disabled_passes=["fuse_elementwise"])
    assert "FusedElementwise" not in ops(m, fusion=False)
    monkeypatch.setenv("ANYCHIP_DISABLED_PASSES", "fuse_elementwise")
    assert "FusedElementwise" not in ops(m)
    monkeypatch.setenv("ANYCHIP_DISABLED_PASSES", "")
    with pytest.raises(DeviceError, match="no pass named"):
        ops(m, disabled_passes=["fuse_everything"])


def test_the_report_lists_the_fusions():
    s = anychip.load(_silu_chain().SerializeToString(), "cpu")
    assert "fusions={'fuse_elementwise': 1}" in str(s.placement())


def test_fallback_without_a_compiler_gives_the_same_result(monkeypatch):
    from anychip.backends.cpu.kernels.op_fused_elementwise import forget_plans

    m = _silu_chain()
    with_cc = check(m, seed=5)
    monkeypatch.setenv("CC", "/nonexistent/anychip-no-cc")
    forget_plans()
    try:
        assert check(m, seed=5) == with_cc
    finally:
        monkeypatch.undo()
        forget_plans()


def test_the_fused_kernel_writes_over_its_dying_first_input(monkeypatch):
    from anychip.backends.cpu.kernels import op_contrib_transformer

    # MatMul + bias Add would become a FusedGemm: keep them apart to test the Add's fusion.
    monkeypatch.setattr(op_contrib_transformer.fused_gemm, "fast", False)
    m = model(
        [
            N("MatMul", ["x", "w"], ["h"]),
            N("Add", ["h", "b"], ["a"]),
            N("Sigmoid", ["a"], ["s"]),
            N("Mul", ["a", "s"], ["y"]),
            N("MatMul", ["y", "w2"], ["z"]),
        ],
        [("x", [8, 16])],
        [("z", [8, 4])],
        [("w", rand(1, 16, 32)), ("b", rand(2, 32)), ("w2", rand(3, 32, 4))],
    )
    s = anychip.load(m.SerializeToString(), "cpu")
    (pm,) = s.compiled.part_memory.values()
    fused = next(i for i in pm.program.instrs if i.node.op_type == "FusedElementwise")
    assert check(m) == {"fuse_elementwise": 1}
    s.run(None, {"x": rand(4, 8, 16)})
    plan = pm.current.plan
    assert plan.inplace.get(fused.outs[0]) == fused.ins[0]  # h's memory reused for y
    assert pm.current.arena.offsets[fused.outs[0]] == pm.current.arena.offsets[fused.ins[0]]


def test_optimize_false_keeps_the_nodes_as_written():
    s = anychip.load(_silu_chain().SerializeToString(), "cpu", optimize=False)
    assert [n.op_type for n in s.partitions[0].graph.nodes][:3] == ["Add", "Sigmoid", "Mul"]


@pytest.mark.parametrize("fusion", [True, False])
def test_pow_by_a_half_is_c_pow_at_minus_inf_and_minus_zero(fusion):
    # numpy takes a size-1 exponent of 0.5 as sqrt: NaN for -inf, -0 for -0; onnxruntime's Pow
    # and the fused kernel's C give +inf and +0. Both of anychip's paths must give C's.
    import onnxruntime as ort

    m = model(
        [N("Mul", ["x", "one"], ["a"]), N("Pow", ["a", "half"], ["y"])],
        X,
        [("y", [2, 4, 3, 5])],
        [("one", np.array(1.0, np.float32)), ("half", np.array(0.5, np.float32))],
    )
    x = rand(7, 2, 4, 3, 5) * 5
    x.reshape(-1)[:6] = [-np.inf, -0.0, 0.0, np.inf, np.nan, -4.0]
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = anychip.load(m.SerializeToString(), "cpu", optimize=fusion).run(None, {"x": x})[0]
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    np.testing.assert_allclose(got, want, rtol=1e-6)
