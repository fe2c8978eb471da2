"""``core/run/dispatch.py``: the flat per-node loop, against onnxruntime on seeded random inputs:
the chain of tiny ops, omitted optional inputs, several outputs, small outputs kept out of the
arena, the arena's views reused run after run, kernel checks, profiling hooks."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.run import memory as memory_partition
from anychip.errors import KernelError
from bench.dispatch import chain_model


@pytest.fixture(autouse=True)
def _every_arena_used(monkeypatch):
    """These tests exercise the arena on small models: every planned arena is used (below
    ``MIN_ARENA_BYTES`` a session lets numpy allocate; tests/wild/test_sklearn_fixed_costs)."""
    monkeypatch.setattr(memory_partition, "MIN_ARENA_BYTES", 0)


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _model(nodes, inputs, outputs, inits=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _program(sess):
    (pm,) = sess.compiled.part_memory.values()
    return pm


def test_chain_of_tiny_ops_matches_onnxruntime_unfused():
    model = chain_model(60)
    x = np.random.default_rng(3).standard_normal(4).astype(np.float32)
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    assert len(_program(sess).program.instrs) == 60  # one instruction per node
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], _ort(model, {"x": x})[0], 1e-6)


def test_omitted_optional_input_and_several_outputs():
    rng = np.random.default_rng(4)
    hi = numpy_helper.from_array(np.array(0.5, np.float32), "hi")
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),  # min omitted
        helper.make_node("TopK", ["c", "k"], ["v", "i"], axis=-1, name="topk"),
        helper.make_node("Split", ["c"], ["s0", "s1"], axis=0, name="split"),
        helper.make_node("ReduceSum", ["s1"], ["r"], keepdims=0, name="sum"),  # a 0-d result
    ]
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [
            helper.make_tensor_value_info("v", TensorProto.FLOAT, [4, 3]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [4, 3]),
            helper.make_tensor_value_info("s0", TensorProto.FLOAT, [2, 64]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
        ],
        [hi, k],
    )
    x = rng.standard_normal((4, 64)).astype(np.float32)
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    for _ in range(2):
        got, want = sess.run(None, {"x": x}), _ort(model, {"x": x})
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _two_relus(model_small=4, model_big=(64, 64)):
    nodes = [
        helper.make_node("Relu", ["a"], ["ra"], name="small"),
        helper.make_node("Neg", ["ra"], ["ya"], name="small_out"),
        helper.make_node("Relu", ["b"], ["rb"], name="big"),
        helper.make_node("Neg", ["rb"], ["yb"], name="big_out"),
    ]
    f = TensorProto.FLOAT
    return _model(
        nodes,
        [
            helper.make_tensor_value_info("a", f, [model_small]),
            helper.make_tensor_value_info("b", f, list(model_big)),
        ],
        [
            helper.make_tensor_value_info("ya", f, [model_small]),
            helper.make_tensor_value_info("yb", f, list(model_big)),
        ],
    )


def test_small_outputs_get_no_planned_view_large_ones_do():
    model = _two_relus()
    rng = np.random.default_rng(5)
    feeds = {
        "a": rng.standard_normal(4).astype(np.float32),
        "b": rng.standard_normal((64, 64)).astype(np.float32),
    }
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    first = sess.run(None, feeds)
    pm = _program(sess)
    slots = {v.name: s for v, s in pm.program.slot_of.items()}
    assert slots["rb"] in pm.current.arena.offsets  # 16 KiB: written through out=
    assert slots["ra"] not in pm.current.arena.offsets  # 16 B: numpy allocates it
    assert slots["ra"] in pm.current.plan.offsets  # still in the plan's figures
    arena_before = pm.current._last[3]
    second = sess.run(None, feeds)
    assert pm.current._last[3] is arena_before  # the views were not made again
    for a, b, w in zip(first, second, _ort(model, feeds)):
        np.testing.assert_array_equal(a, w)
        np.testing.assert_array_equal(b, w)
        assert not np.shares_memory(a, b)  # outputs never alias the reused arena
    assert pm.program.peak > 0 and sess.memory()["cpu"].declined == 0


def test_a_kernel_returning_the_wrong_shape_is_still_caught():
    model = _two_relus()
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    pm = _program(sess)
    ins = next(i for i in pm.program.instrs if i.node.name == "big")
    ins.fn = lambda x, out=None, **kw: np.maximum(x, 0)[:3]  # a wrong kernel
    feeds = {"a": np.ones(4, np.float32), "b": np.ones((64, 64), np.float32)}
    with pytest.raises(KernelError, match="shape"):
        sess.run(None, feeds)


def test_profile_times_every_node_through_the_flat_loop():
    model = chain_model(25)
    sess = anychip.load(model, devices=["cpu"], optimize=False)
    prof = sess.profile({"x": np.ones(4, np.float32)})
    nodes = [e for e in prof.events if e.kind == "node"]
    assert len(nodes) == 25
    # the timers were taken off again: the instructions run their own kernels
    assert all(i.fn.__name__ != "timed" for i in _program(sess).program.instrs)


class _Held:
    """A device tensor of ``_ThreeOutChip``: a block of its pool."""

    def __init__(self, chip, value):
        self.shape, self.dtype, self.value = value.shape, value.dtype, value
        self.block = chip.allocate(max(1, value.nbytes))


def test_outputs_a_node_omits_are_released_on_an_own_memory_device():
    """A kernel computes every output (LayerNormalization's Mean and InvStdDev too); the node
    uses Y alone: the executor releases the two it drops, or the device keeps them."""
    from anychip.core.plugin.backend import Backend, DeviceModel
    from anychip.core.plugin.hookspecs import hookimpl
    from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
    from anychip.core.plugin.kernels import KernelTable
    from anychip.ir.dtypes import DType

    class ThreeOut(Backend):
        name = kind = "threeout"
        priority = 5

        def device_model(self):
            return DeviceModel("threeout", "threeout", dtypes=frozenset({DType.FLOAT}))

        def _alloc(self, nbytes):
            return np.empty(nbytes, np.uint8)

        def _free(self, buffer):
            pass

        def _copy_in(self, a):
            return _Held(self, np.array(a))

        def _copy_out(self, t):
            return np.array(t.value)

        def release(self, t):
            self.deallocate(t.block)

    chip = ThreeOut()
    table = KernelTable("threeout")

    @table.register("LayerNormalization", since=17, dtypes={DType.FLOAT})
    def layer_norm(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
        v = x.value
        mean = v.mean(axis=-1, keepdims=True)
        inv = 1 / np.sqrt(((v - mean) ** 2).mean(axis=-1, keepdims=True) + epsilon)
        y = (v - mean) * inv * scale.value + b.value
        return _Held(chip, y.astype(v.dtype)), _Held(chip, mean), _Held(chip, inv)

    class Plugin:
        @hookimpl
        def anychip_register_backends(self, registry):
            registry.add_backend(chip)

        @hookimpl
        def anychip_register_kernels(self, registry):
            registry.add_kernels(table)

    rng = np.random.default_rng(5)
    f = TensorProto.FLOAT
    inits = [numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), n) for n in "sb"]
    model = _model(
        [helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)],
        [helper.make_tensor_value_info("x", f, [3, 8])],
        [helper.make_tensor_value_info("y", f, [3, 8])],
        inits,
    )
    x = rng.standard_normal((3, 8)).astype(np.float32)
    get_registry()
    register_plugin(Plugin(), "test-threeout")
    try:
        with anychip.load(model, ["threeout", "cpu"], cost_model=False) as sess:
            assert [n.device for n in sess.placement().nodes] == ["threeout"]
            for _ in range(3):
                (y,) = sess.run(None, {"x": x})
                np.testing.assert_allclose(y, _ort(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
        assert chip.memory_stats().in_use == 0
    finally:
        unregister_plugin("test-threeout")
