"""``core/compile/pipeline.py``: the walk from a model to compiled partitions, on a copy of the
caller's model."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper

import anychip
from anychip.core.compile.pipeline import CompiledModel
from anychip.ir.onnx import export_model, import_model
from tests.core.test_placement import three_nodes


def _conv_bn() -> bytes:
    rng = np.random.default_rng(0)

    def t(name, *shape, low=None):
        arr = rng.uniform(0.5, 1.5, shape) if low else rng.standard_normal(shape) * 0.3
        return helper.make_tensor(name, TensorProto.FLOAT, shape, arr.astype(np.float32).ravel())

    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    inits = [t("w", 4, 3, 3, 3), t("s", 4, low=1), t("b", 4), t("m", 4), t("v", 4, low=1)]
    graph = helper.make_graph(
        nodes,
        "convbn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)]).SerializeToString()


def test_load_never_rewrites_the_callers_model() -> None:
    model = import_model(_conv_bn())
    before = export_model(model).SerializeToString()
    nodes_before = list(model.graph.nodes)
    sess = anychip.load(model, devices=["npu", "cpu"])
    assert sess.optimizations["fold_batch_norm"] == 1
    assert list(model.graph.nodes) == nodes_before
    assert all("device" not in n.meta for n in model.graph.nodes)
    assert export_model(model).SerializeToString() == before
    assert sess.model is not model
    # And the compiled copy computes what the original does.
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    (want,) = anychip.load(model, devices=["cpu"], optimize=False).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-5)


def test_the_compiled_model_holds_the_walks_results() -> None:
    sess = anychip.load(three_nodes(), devices=["xpu", "cpu"], cost_model=False)
    c = sess.compiled
    assert isinstance(c, CompiledModel)
    assert [p.device for p in c.partitions] == ["xpu", "cpu", "xpu"]
    assert len(c.steps.steps) == len(c.partitions) + len(c.copies)
    assert [s.is_copy for s in c.steps.steps] == [True, False, True, False, True, False, True]
    assert set(c.part_memory) == {p.index for p in c.partitions}  # all kernel mode
    assert all(n.meta["since"] for n in c.model.graph.nodes)  # schemas resolved once


def test_a_partition_too_big_for_its_device_goes_to_the_next(monkeypatch) -> None:
    from anychip.core.plugin.host import get_registry

    xpu = get_registry().backends["xpu"]
    small = xpu.device
    monkeypatch.setattr(small, "memory_capacity", 1024)  # bytes: the 4x8 model needs more
    sess = anychip.load(three_nodes(shape=(16, 64)), devices=["xpu", "cpu"], cost_model=False)
    assert {p.device for p in sess.partitions} == {"cpu"}
    report = sess.memory()
    assert any("xpu" in n and "out of memory" in n for n in report.notes)
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    (want,) = anychip.load(three_nodes(shape=(16, 64)), devices=["cpu"]).run(None, {"x": x})
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-6)
