"""The registry and the backend as the unit: a backend reaches its kernels, passes and pool
factory; ``Backend.supports`` answers per node; passes follow one contract."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper

import anychip
from anychip import hookimpl
from anychip.core.plugin import host as plugins
from anychip.core.plugin.host import get_registry
from anychip.ir.passes import Pass, PassResult


def _model() -> bytes:
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Sin", ["r"], ["n"], name="sin"),
        helper.make_node("Softmax", ["n"], ["y"], name="softmax", axis=-1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString()


@pytest.fixture
def fresh_plugins():
    plugins.reset_plugins()
    yield
    for name in ("test-registry-pass", "test-registry-old-pass"):
        plugins.unregister_plugin(name)
    plugins.reset_plugins()


def test_backend_reaches_what_plugins_registered_for_it() -> None:
    registry = get_registry()
    cpu, npu = registry.backends["cpu"], registry.backends["npu"]
    assert cpu.kernels is registry.kernel_table("cpu")
    assert npu.passes == [e.pass_ for e in registry.passes_for("npu")]
    assert [type(p).__name__ for p in npu.passes][-1] == "ConvertToNhwcPass"
    assert all(isinstance(p, Pass) for p in npu.passes)
    assert cpu.pool_factory is registry.pools.get("cpu")


def test_supports_answers_with_a_reason() -> None:
    sess = anychip.load(_model(), devices=["xpu", "cpu"], cost_model=False)
    xpu = get_registry().backends["xpu"]
    nodes = {n.name: n for n in sess.model.graph.nodes}
    assert xpu.supports(nodes["relu"]) is None
    rep = {r.name: r for r in sess.placement().nodes}
    # What supports says is what the placement report shows for each node.
    for name, node in nodes.items():
        reason = xpu.supports(node)
        assert (rep[name].device == "xpu") == (reason is None), (name, reason)
        if reason is not None:
            assert reason in rep[name].reason
    assert xpu.supports(nodes["sin"]) == "no kernel for Sin"


class _CountSins(Pass):
    """A whole-graph pass that modifies nothing and counts Sin nodes."""

    name = "count_sins"

    def __init__(self) -> None:
        self.seen = 0

    def call(self, graph):
        self.seen += sum(n.op_type == "Sin" for n in graph.nodes)
        return PassResult(graph, False)


def test_a_pass_runs_and_a_plain_callable_still_works_with_a_warning(fresh_plugins) -> None:
    counter = _CountSins()
    calls = []

    class PassPlugin:
        ANYCHIP_API_VERSION = 1

        @hookimpl
        def anychip_register_passes(self, registry):
            registry.add_pass(counter)

    def old_style(graph):
        calls.append(len(graph.nodes))

    class OldPlugin:
        ANYCHIP_API_VERSION = 1

        @hookimpl
        def anychip_register_passes(self, registry):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                registry.add_pass(old_style, backend="cpu")
            calls.append([str(w.message) for w in caught])

    plugins.register_plugin(PassPlugin(), "test-registry-pass")
    plugins.register_plugin(OldPlugin(), "test-registry-old-pass")
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    sess = anychip.load(_model(), devices=["cpu"])
    (y,) = sess.run(None, {"x": x})
    s = np.sin(np.maximum(x, 0))
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-6)
    assert counter.seen == 1
    warned = next(c for c in calls if isinstance(c, list))
    assert any("deprecated" in m and "PassResult" in m for m in warned)
    assert 3 in calls  # the old-style pass ran on the cpu partition's three nodes
    # It returned None: counted as a change, so it is recorded for the report.
    assert "old_style" in sess.partitions[0].graph.meta["passes"]


def test_a_pass_returning_a_bool_is_refused() -> None:
    from anychip.errors import GraphError
    from anychip.ir.onnx import import_model

    class Wrong(Pass):
        def call(self, graph):
            return True

    with pytest.raises(GraphError, match="PassResult"):
        Wrong()(import_model(_model()).graph)
