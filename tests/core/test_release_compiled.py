"""``Backend.release_compiled``: what a graph-mode ``compile`` put on its device goes back once,
when the session closes or is collected, when a per-signature executable is evicted, or when a
re-placement replaces it; never before the executable's last run."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.conformance import OpClaim
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from anychip.ir.dtypes import DType

# Counts compiles and telemetry of executables made in memory: the artifact cache off (an
# artifact another test stored would be loaded instead; the disk cache's own tests:
# tests/core/test_compile_cache.py).
pytestmark = pytest.mark.usefixtures("no_compile_cache")

F32 = frozenset({DType.FLOAT})


class Held:
    """A device tensor: an array and the block of device memory it occupies."""

    def __init__(self, chip: GraphChip, value: np.ndarray) -> None:
        self.value, self.block = value, chip.allocate(max(1, value.nbytes))
        self.shape, self.dtype = value.shape, value.dtype


class GraphChip(Backend):
    """A graph-mode device with memory of its own: ``compile`` uploads the partition's weights
    (a block per executable) and ``release_compiled`` gives them back."""

    name = kind = "graphchip"
    priority, graph_mode = 5, True

    def __init__(self, shape_policy: str = "symbolic") -> None:
        super().__init__()
        self.shape_policy = shape_policy
        self.released: list[int] = []
        self.collected = 0  # a finalizer of the backend's own on each executable

    def device_model(self) -> DeviceModel:
        return DeviceModel("graphchip", "graphchip", dtypes=F32, host_link=1e10)

    def claims(self) -> list[OpClaim]:
        return [OpClaim("", "MatMul", 13), OpClaim("", "Relu", 14)]

    def check_node(self, node):
        return None if node.op_type in ("MatMul", "Relu") else "only MatMul and Relu"

    def _alloc(self, nbytes):
        return np.empty(nbytes, np.uint8)

    def _free(self, buffer):
        pass

    def _copy_in(self, a):
        return Held(self, np.array(a))

    def _copy_out(self, t):
        return np.array(t.value)

    def release(self, t):
        self.deallocate(t.block)

    def compile(self, graph):
        weights = {v.name: Held(self, np.array(v.const)) for v in graph.initializers.values()}
        nodes = [(n.op_type, [v.name for v in n.inputs], n.outputs[0].name) for n in graph.nodes]
        names, outs = [v.name for v in graph.inputs], [v.name for v in graph.outputs]

        def run(inputs):  # holds the weights, not the CompiledGraph
            env = {k: t.value for k, t in weights.items()} | {
                n: t.value for n, t in zip(names, inputs)
            }
            for op, ins, out in nodes:
                a = [env[i] for i in ins]
                env[out] = a[0] @ a[1] if op == "MatMul" else np.maximum(a[0], 0)
            return [Held(self, env[o]) for o in outs]

        compiled = CompiledGraph(run, info={"weights": len(weights)})
        compiled.weights = weights
        weakref.finalize(compiled, self._collected)
        return compiled

    def _collected(self):
        self.collected += 1

    def release_compiled(self, compiled):
        for t in compiled.weights.values():
            self.deallocate(t.block)
        self.released.append(id(compiled))


@pytest.fixture
def chip(request):
    chip = GraphChip(getattr(request, "param", "symbolic"))

    class Plugin:
        @hookimpl
        def anychip_register_backends(self, registry):
            registry.add_backend(chip)

    get_registry()
    register_plugin(Plugin(), "test-graphchip")
    yield chip
    unregister_plugin("test-graphchip")


def _model(batch="n"):
    rng = np.random.default_rng(11)
    w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])],
        [w],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _check(sess, model, rows, seed=0):
    x = np.random.default_rng(seed).standard_normal((rows, 8)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_an_executable_is_held_for_its_runs_and_released_once_at_close(chip):
    model = _model()
    sess = anychip.load(model, ["graphchip", "cpu"], cost_model=False)
    gc.collect()
    assert chip.collected == 0 and chip.released == []  # alive until the session ends
    assert chip.memory_stats().in_use > 0  # the weights, on the device
    for seed in range(3):
        _check(sess, model, 5, seed)
    assert set(sess.placement().by_device()) == {"graphchip"}
    sess.close()
    assert len(chip.released) == 1 and chip.memory_stats().in_use == 0
    sess.close()
    assert len(chip.released) == 1


def test_a_session_dropped_without_close_releases_too(chip):
    model = _model()
    sess = anychip.load(model, ["graphchip", "cpu"], cost_model=False)
    _check(sess, model, 3)
    del sess
    gc.collect()
    assert len(chip.released) == 1 and chip.memory_stats().in_use == 0


@pytest.mark.parametrize("chip", ["static"], indirect=True)
def test_an_evicted_signature_is_released_and_the_rest_at_close(chip):
    model = _model()
    sess = anychip.load(
        model, ["graphchip", "cpu"], cost_model=False, background_compile=False,
        compile_cache_size=1,
    )  # fmt: skip
    for rows in (2, 2, 3, 3, 2):
        _check(sess, model, rows)
    (sp,) = sess.compiled.specialized.values()
    assert sp.stats["compiles"] == 3 and sp.stats["evictions"] == 2
    assert len(chip.released) == 1  # the last eviction is given back by the next run
    _check(sess, model, 2)
    assert len(chip.released) == 2
    sess.close()
    assert len(chip.released) == sp.stats["compiles"] and chip.memory_stats().in_use == 0


def test_a_replan_releases_the_placement_it_replaces(chip):
    model = _model()
    sess = anychip.load(model, ["graphchip", "cpu"], cost_model=False)
    _check(sess, model, 4)
    sess.unhealthy["graphchip"] = "taken out for maintenance"
    sess.replan()
    assert len(chip.released) == 1 and chip.memory_stats().in_use == 0
    _check(sess, model, 4)
    assert set(sess.placement().by_device()) == {"cpu"}
