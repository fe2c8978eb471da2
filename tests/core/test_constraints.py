"""Declared constraints: a claim carries conditions as data; placement names the reason."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import anychip
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.claims import Constraint, OpClaim, declared_refusal
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

KERNELS = KernelTable("lastaxis")


@KERNELS.register("Softmax", since=13, dtypes={DType.FLOAT})
def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    assert axis in (-1, x.ndim - 1), "the placement gave this device an axis it declared it refuses"
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class _LastAxisChip(Backend):
    """A host-memory device whose Softmax runs on the last axis only, declared as data."""

    name, kind, priority, host_memory = "lastaxis", "lastaxis", 5, True

    def device_model(self) -> DeviceModel:
        return DeviceModel("lastaxis", "lastaxis", dtypes=frozenset({DType.FLOAT}))

    def claims(self) -> list[OpClaim] | None:
        softmax = OpClaim("", "Softmax", 13, None, frozenset({DType.FLOAT}), 0)
        return [dataclasses.replace(softmax, constraints=(Constraint.last_axis(),))]


class _Plugin:
    @hookimpl
    def anychip_register_backends(self, registry):
        registry.add_backend(_LastAxisChip())

    @hookimpl
    def anychip_register_kernels(self, registry):
        registry.add_kernels(KERNELS)


def _model(axis: int) -> bytes:
    g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], axis=axis, name="sm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString()


def test_a_constraint_refuses_the_node_it_does_not_hold_for():
    c = Constraint.last_axis()
    claim = OpClaim("", "Softmax", 13, None, None, 0, (c,))
    sess = anychip.load(_model(1), ["cpu"])
    (node,) = sess.compiled.model.graph.nodes
    assert claim.refusal(node) == "declared constraint: axis on the last axis only"
    assert declared_refusal([claim], node) == claim.refusal(node)
    sess = anychip.load(_model(-1), ["cpu"])
    (node,) = sess.compiled.model.graph.nodes
    assert claim.refusal(node) is None and declared_refusal([claim], node) is None


def test_placement_names_the_declared_constraint_and_the_answer_is_right():
    get_registry()
    register_plugin(_Plugin(), "test-lastaxis")
    try:
        x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
        for axis, device in ((1, "cpu"), (2, "lastaxis")):
            model = _model(axis)
            sess = anychip.load(model, ["lastaxis", "cpu"], cost_model=False)
            (rec,) = sess.placement().nodes
            assert rec.device == device, rec.reason
            if device == "cpu":
                assert "declared constraint: axis on the last axis only" in rec.reason
            (ref,) = ort.InferenceSession(model).run(None, {"x": x})
            np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-5, atol=1e-6)
    finally:
        unregister_plugin("test-lastaxis")
