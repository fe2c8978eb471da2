"""The CPU kernels' out protocol: writing into planned memory, in place, and declining.

Every ONNX conformance case of an op whose CPU kernel takes ``out=`` is run with its output
made an intermediate of the plan (``op -> Identity -> graph output``) and, where the first
input is a float graph input, that input first copied into planned memory by ``Sum`` (so the
element-wise ops really write over their dying input). Both runs of each data set must match
the spec's expected outputs, and the kernel must have been handed the planned view.
"""

from __future__ import annotations

import inspect

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as h

import anychip
from anychip.backends.cpu.kernels import load_all
from anychip.backends.cpu.kernels.op_elementwise import sum_
from anychip.backends.cpu.kernels.op_matmul import matmul
from anychip.backends.cpu.table import CPU_KERNELS
from anychip.core.run import memory as memory_partition
from anychip.core.run.memory import INPLACE_OPS
from tests.node_cases import assert_outputs_close, load_case, node_cases


@pytest.fixture(autouse=True)
def _every_arena_used(monkeypatch):
    """These tests exercise the arena on small models: every planned arena is used (below
    ``MIN_ARENA_BYTES`` a session lets numpy allocate; tests/wild/test_sklearn_fixed_costs)."""
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)


load_all()

OUT_OPS = sorted(
    {
        k.op_type
        for k in CPU_KERNELS
        if k.domain in ("", "ai.onnx") and "out" in inspect.signature(k.fn).parameters
    }
)
_COPYABLE = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16}


def _single_node(case) -> bool:
    model, _ = load_case(case)
    return len(model.graph.node) == 1 and len(model.graph.node[0].output) == 1


CASES = [c for c in node_cases(OUT_OPS) if _single_node(c)]


@pytest.fixture(autouse=True)
def _views_for_small_outputs(monkeypatch):
    """The conformance cases' tensors are small: hand them views all the same (by default the
    executor keeps outputs under ``MIN_OUT_BYTES`` out of the arena, tests/core/test_dispatch)."""
    from anychip.core.run import kernel_call

    monkeypatch.setattr(kernel_call, "MIN_OUT_BYTES", 0)


def _through_the_plan(model: onnx.ModelProto) -> tuple[onnx.ModelProto, bool]:
    """``model`` with its node's output planned, and its first input copied into planned
    memory when it is a float graph input; also whether that copy was made."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    node = g.node[0]
    nodes = [node, h.make_node("Identity", ["__planned"], [node.output[0]], name="__id")]
    node.output[0] = "__planned"
    types = {i.name: i.type.tensor_type.elem_type for i in g.input}
    copied = bool(node.input) and types.get(node.input[0]) in _COPYABLE
    if copied:
        nodes.insert(0, h.make_node("Sum", [node.input[0]], ["__copy"], name="__sum"))
        node.input[0] = "__copy"
    del g.node[:]
    g.node.extend(nodes)
    return m, copied


def test_out_ops_cover_the_hot_kernels():
    """The ops of the light CNNs and the transformer layer all take ``out``."""
    hot = {"Conv", "Relu", "BatchNormalization", "MaxPool", "AveragePool", "Sum", "Add", "Mul",
           "Concat", "Gemm", "MatMul", "Softmax", "Transpose", "LRN", "GlobalAveragePool",
           "LayerNormalization", "Div"}  # fmt: skip
    assert hot <= set(OUT_OPS)
    assert len(CASES) > 150


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_conformance_case_through_planned_memory(case):
    model, sets = load_case(case)
    wrapped, copied = _through_the_plan(model)
    # the kernel itself under test: no fusion pass may rewrite the node (backends/cpu/passes)
    sess = anychip.load(wrapped, devices=["cpu"], device_options={"cpu": {"fusion": False}})
    names = [i.name for i in sess.inputs]
    for ins, outs in sets:
        feeds = dict(zip(names, ins))
        for _ in range(2):  # dynamic shapes: the first run plans, the second uses the arena
            assert_outputs_close(sess.run(None, feeds), outs, case.rtol, case.atol)
    (pm,) = sess.compiled.part_memory.values()
    slots = {v.name: s for v, s in pm.program.slot_of.items()}
    values = {v.name: v for v in pm.program.slot_of}
    arena = pm.current.arena if pm.current is not None else None
    assert arena is not None and slots["__planned"] in arena.offsets, "kernel got no out view"
    op = model.graph.node[0].op_type
    x, y = values.get("__copy"), values["__planned"]
    if copied and op in INPLACE_OPS and x.shape == y.shape and x.dtype == y.dtype:
        # The element-wise op wrote over its dying first input.
        assert arena.offsets[slots["__planned"]] == arena.offsets[slots["__copy"]]


def test_light_resnet_writes_every_planned_tensor_in_place():
    import os

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_resnet50.onnx"
    )
    # the kernels' out protocol: no fusion (FusedConv chains keep channels-last instead)
    sess = anychip.load(path, devices=["cpu"], device_options={"cpu": {"fusion": False}})
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    feeds = {sess.inputs[0].name: x}
    first = sess.run(None, feeds)[0]
    second = sess.run(None, feeds)[0]
    rec = sess.memory()["cpu"]
    assert rec.arena == rec.planned > 0
    assert rec.declined == 0
    # The caller's outputs are never the arena's memory: the second run did not change them.
    np.testing.assert_array_equal(first, second)
    assert first is not second and not np.shares_memory(first, second)


# -- the protocol on single kernels ---------------------------------------------------------------


def test_kernel_writes_into_a_fitting_out_and_returns_it():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = np.empty((2, 3), np.float32)
    assert sum_(a, np.ones(3, np.float32), out=out) is out
    np.testing.assert_array_equal(out, a + 1)
    m = np.empty((2, 2), np.float32)
    assert matmul(a, a.T, out=m) is m
    np.testing.assert_array_equal(m, a @ a.T)


@pytest.mark.parametrize(
    "out",
    [np.empty((2, 2, 3), np.float32), np.empty((2, 3), np.float64), np.empty((3, 2), np.float32)],
    ids=["broadcast_larger", "other_dtype", "other_shape"],
)
def test_kernel_declines_an_out_that_does_not_fit(out):
    """A wrong planned shape is never broadcast into, a wrong dtype never cast into."""
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    before = out.copy()
    got = sum_(a, a, out=out)
    assert got is not out and got.shape == (2, 3) and got.dtype == np.float32
    np.testing.assert_array_equal(got, a + a)
    np.testing.assert_array_equal(out, before)


def test_variadic_in_place_with_a_repeated_input_declines():
    """``Sum(a, b, a)`` with ``out`` over ``a`` would read ``a`` after overwriting it."""
    a = np.arange(4, dtype=np.float32)
    b = np.ones(4, np.float32)
    got = sum_(a, b, a, out=a)
    assert got is not a
    np.testing.assert_array_equal(got, np.arange(4) * 2 + 1)


def test_report_names_declined_views():
    """A kernel that declines its view is counted and the report says so."""
    g = h.make_graph(
        [
            h.make_node("MatMul", ["x", "x"], ["t"], name="mm"),
            h.make_node("Identity", ["t"], ["y"], name="id"),
        ],
        "g",
        [h.make_tensor_value_info("x", TensorProto.FLOAT16, [4, 4])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT16, [4, 4])],
    )
    model = h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    sess = anychip.load(model, devices=["cpu"])
    x = np.eye(4, dtype=np.float16)
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], x)
    rec = sess.memory()["cpu"]
    assert rec.declined == 1  # float16 MatMul accumulates in float32 and allocates
    assert "declined 1 planned out= views" in str(sess.memory())


def test_dynamic_batch_cnn_plans_each_shape_and_writes_into_it():
    """SqueezeNet with a symbolic batch: each batch size is planned on its first run and run
    from its arena after; every result equals the batch-1 session's rows."""
    import os

    path = os.path.join(
        os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_squeezenet.onnx"
    )
    unfused = {"cpu": {"fusion": False}}  # the kernels' out protocol (see above)
    static = anychip.load(path, devices=["cpu"], device_options=unfused)
    name = static.inputs[0].name
    model = onnx.load(path)
    (data,) = [i for i in model.graph.input if i.name == name]
    data.type.tensor_type.shape.dim[0].dim_param = "N"
    dynamic = anychip.load(model, devices=["cpu"], device_options=unfused)
    x = np.random.default_rng(2).standard_normal((2, 3, 224, 224)).astype(np.float32)
    rows = [static.run(None, {name: x[i : i + 1]})[0] for i in range(2)]
    for n in (2, 1, 2, 1):
        (got,) = dynamic.run(None, {name: x[:n]})
        np.testing.assert_allclose(got, np.concatenate(rows[:n]), rtol=1e-5, atol=1e-6)
    rec = dynamic.memory()["cpu"]
    assert (rec.dynamic_partitions, rec.misses, rec.hits) == (1, 2, 2)
    assert rec.arena == rec.planned > static.memory()["cpu"].planned
    assert rec.declined == 0


def test_memory_facts_are_declared_on_the_cpu_kernels():
    """The planner reads ``inplace``/``alias`` from kernels: the CPU declares exactly the ops
    of ``ALIAS_OPS`` and ``INPLACE_OPS``, on every version of each."""
    from anychip.backends.cpu.kernels import load_all
    from anychip.backends.cpu.table import CPU_KERNELS
    from anychip.core.run.memory import ALIAS_OPS

    load_all()
    by_op: dict[str, set[tuple[bool, bool]]] = {}
    for k in CPU_KERNELS:
        if k.domain == "":
            by_op.setdefault(k.op_type, set()).add((k.inplace, k.alias))
    assert {op for op, f in by_op.items() if (False, True) in f} == set(ALIAS_OPS)
    assert {op for op, f in by_op.items() if (True, False) in f} == set(INPLACE_OPS)
    mixed = {op: f for op, f in by_op.items() if len(f) > 1}
    assert not mixed, f"versions of one op disagree: {mixed}"
