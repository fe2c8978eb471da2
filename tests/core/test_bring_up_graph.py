"""Bring-up for graph-mode devices: a compiled partition's outputs against the CPU's run of
the same partition, each run; the first output that differs is an error naming it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import anychip
from anychip import hookimpl
from anychip.core.plugin.backend import Backend, CompiledGraph
from anychip.core.plugin.host import register_plugin, unregister_plugin
from anychip.errors import BringUpError
from anychip.ir.graph import Model
from anychip.ir.onnx import export_model


class GraphChip(Backend):
    """Compiles a partition into onnx's reference evaluator (its "executable"); with
    ``bug`` set, the compiled result of the first output is off by that much."""

    name = kind = "gchip"
    graph_mode = True
    priority = 50

    def __init__(self) -> None:
        super().__init__()
        self.bug = 0.0

    def _copy_in(self, array: np.ndarray) -> np.ndarray:
        return array.copy()

    def _copy_out(self, tensor: np.ndarray) -> np.ndarray:
        return tensor.copy()

    def compile(self, graph) -> CompiledGraph:
        opsets = {n.domain: max(int(n.version or 1), 1) for n in graph.walk()}
        proto = export_model(Model(graph, opsets or {"": 17}))
        evaluator = ReferenceEvaluator(proto)
        names = [v.name for v in graph.inputs]
        bug = self.bug

        def run(inputs):
            outs = evaluator.run(None, dict(zip(names, inputs)))
            if bug:
                outs[0] = (outs[0] + np.float32(bug)).astype(outs[0].dtype)
            return outs

        return CompiledGraph(run)


CHIP = GraphChip()


@hookimpl
def anychip_register_backends(registry) -> None:
    registry.add_backend(CHIP)


@pytest.fixture
def chip():
    CHIP.bug = 0.0
    register_plugin(SimpleNamespace(anychip_register_backends=anychip_register_backends), "g")
    yield CHIP
    unregister_plugin("g")


def _model() -> bytes:
    rng = np.random.default_rng(7)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _x() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(3).standard_normal((4, 16)).astype(np.float32)}


def test_a_correct_graph_device_passes_bring_up(chip) -> None:
    sess = anychip.load(_model(), ["gchip", "cpu"], bring_up=True, cost_model=False)
    assert sess.placement().by_device() == {"gchip": 2}
    (y,) = sess.run(None, _x())
    ref = ReferenceEvaluator(onnx.load_from_string(_model())).run(None, _x())[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    info = " ".join(str(p.info.get("bring-up", "")) for p in sess.placement().partitions)
    assert "compared with the CPU" in info


def test_a_miscompiled_partition_is_an_error_naming_its_output(chip) -> None:
    chip.bug = 0.01
    sess = anychip.load(_model(), ["gchip", "cpu"], bring_up=True, cost_model=False)
    with pytest.raises(BringUpError, match=r"partition 0 on gchip .*output 0 \('y'\).*differs"):
        sess.run(None, _x())


def test_without_bring_up_the_same_bug_goes_unseen(chip) -> None:
    chip.bug = 0.01  # what bring-up is for: the session alone cannot know
    sess = anychip.load(_model(), ["gchip", "cpu"], cost_model=False)
    (y,) = sess.run(None, _x())
    ref = ReferenceEvaluator(onnx.load_from_string(_model())).run(None, _x())[0]
    assert np.abs(y - ref).max() == pytest.approx(0.01, rel=1e-3)
