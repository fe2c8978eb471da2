"""Faulty plugins never break the host or other plugins (issue 18): a plugin that fails is
removed whole (kernels it merged into the CPU's table included), any exception from a hook
(SystemExit too) is contained, an unknown hook name leaves only that plugin out, a bad
DeviceModel is named, and a raising check_node, compile, pass or release means fallback or
a clear AnychipError, never the plugin's own exception."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.core.plugin import host as plugins
from tests.core.test_plugins import GOOD, _make_dist, _relu_model, plugin_path  # noqa: F401

#: A plugin that first adds a deliberately wrong CPU Relu (x + 100) to the CPU's own table,
#: then fails in a later hook.
POISON = """
    import numpy as np
    from anychip import hookimpl
    from anychip.core.plugin.kernels import KernelTable

    ANYCHIP_API_VERSION = 1
    TABLE = KernelTable("cpu")

    @TABLE.register("Relu", since=1)
    def wrong_relu(x):
        return np.maximum(x, 0) + 100

    @hookimpl
    def anychip_register_kernels(registry):
        registry.add_kernels(TABLE)

    @hookimpl
    def anychip_register_passes(registry):
        raise {exc}
"""


def _x() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(2).astype(np.float32)


@pytest.mark.parametrize("exc", ["RuntimeError('later hook')", "SystemExit(3)"])
def test_a_failed_plugin_leaves_no_kernel_behind(plugin_path, exc):  # noqa: F811
    _make_dist(plugin_path, "anychip-poison", "anychip_test_poison", POISON.format(exc=exc), "p")
    x = _x()
    (y,) = anychip.load(_relu_model(), devices=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))  # the CPU's own Relu, not x + 100
    rec = next(r for r in plugins.get_registry().plugins if r.name == "p")
    assert not rec.ok and "anychip_register_passes raised" in rec.error
    assert "left out whole" in rec.error
    # "p" names no device, so the cpu session above did not import it; get_registry() did.
    (y,) = anychip.load(_relu_model(), devices=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, np.maximum(x, 0))


def test_a_plugin_raising_systemexit_at_import_is_contained(plugin_path):  # noqa: F811
    _make_dist(plugin_path, "anychip-exit", "anychip_test_exit", "raise SystemExit(2)\n", "exiting")
    rows = anychip.devices(include_failed_plugins=True)
    row = next(d for d in rows if d.name == "exiting")
    assert not row.available and "SystemExit" in row.reason
    assert anychip.load(_relu_model(), devices=["cpu"]).run(None, {"x": _x()})


def test_an_unknown_hook_name_leaves_only_that_plugin_out(plugin_path):  # noqa: F811
    typo = GOOD + "\n    @hookimpl\n    def anychip_register_kernals(registry):\n        pass\n"
    _make_dist(plugin_path, "anychip-typo", "anychip_test_typo", typo, "typo")
    reg = plugins.get_registry()
    rec = next(r for r in reg.plugins if r.name == "typo")
    assert not rec.ok and "anychip_register_kernals" in rec.error
    assert "toy" not in reg.backends and "cpu" in reg.backends
    anychip.load(_relu_model(), devices=["cpu"]).run(None, {"x": _x()})


@pytest.mark.parametrize(
    ("figures", "named"),
    [
        ("flops=0", "flops=0"),
        ("flops=float('nan')", "flops=nan"),
        ("mem_bandwidth=-1.0", "mem_bandwidth=-1.0"),
        ("launch_overhead=float('inf')", "launch_overhead=inf"),
        ("memory_capacity=-5", "memory_capacity=-5"),
    ],
)
def test_a_bad_device_model_is_named(plugin_path, figures, named):  # noqa: F811
    src = GOOD.replace(
        "        priority = 5\n",
        "        priority = 5\n\n        def device_model(self):\n"
        f"            return DeviceModel('toy', 'toy', {figures})\n",
    )
    _make_dist(plugin_path, "anychip-figs", "anychip_test_figs", src, "toy")
    with pytest.raises(anychip.DeviceError, match=f"toy: its DeviceModel has {named}"):
        anychip.load(_relu_model(), devices=["toy", "cpu"])


def _failing(method: str) -> str:
    """GOOD, with a graph-mode or kernel-mode hook that raises."""
    raising = {
        "check_node": "        def check_node(self, node):\n            raise KeyError('x')\n",
        "release": "        def release(self, tensor):\n            raise OSError('driver')\n",
    }[method]
    return GOOD.replace("        priority = 5\n", "        priority = 5\n\n" + raising)


def test_a_raising_check_node_means_fallback_with_the_reason(plugin_path):  # noqa: F811
    _make_dist(plugin_path, "anychip-cn", "anychip_test_cn", _failing("check_node"), "toy")
    sess = anychip.load(_relu_model(), devices=["toy", "cpu"], cost_model=False)
    x = _x()
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    node = sess.placement().nodes[0]
    assert node.device == "cpu" and "check_node raised KeyError" in node.reason


def test_a_raising_release_is_a_device_error(plugin_path):  # noqa: F811
    _make_dist(plugin_path, "anychip-rel", "anychip_test_rel", _failing("release"), "toy")
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = anychip.load(model, devices=["toy", "cpu"], cost_model=False, failover=False)
    with pytest.raises(anychip.DeviceError, match="release.*raised OSError: driver"):
        sess.run(None, {"x": _x()})


GRAPH_MODE = """
    import numpy as np
    from anychip import hookimpl
    from anychip.core.plugin.backend import Backend
    from anychip.ir.passes import Pass

    ANYCHIP_API_VERSION = 1

    class Chip(Backend):
        name = "gchip"
        kind = "gchip"
        graph_mode = True

        def _copy_in(self, array):
            return array.copy()

        def _copy_out(self, tensor):
            return tensor.copy()

        def compile(self, graph):
            raise {compile_error}

    class Boom(Pass):
        def call(self, graph):
            graph.nodes[0].op_type = "Broken"  # half done, then it fails
            raise ZeroDivisionError("pass bug")

    @hookimpl
    def anychip_register_backends(registry):
        registry.add_backend(Chip())

    @hookimpl
    def anychip_register_passes(registry):
        registry.add_pass(Boom())
"""


def test_a_raising_compile_or_generic_pass_means_fallback(plugin_path):  # noqa: F811
    src = GRAPH_MODE.format(compile_error="MemoryError('compiler crashed')")
    _make_dist(plugin_path, "anychip-g", "anychip_test_g", src, "gchip")
    sess = anychip.load(_relu_model(), devices=["gchip", "cpu"], cost_model=False)
    x = _x()
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.maximum(x, 0))
    assert sess.placement().by_device() == {"cpu": 1}
    notes = " ".join(sess.compiled.memory_notes)
    assert "pass Boom of plugin 'gchip' failed, skipped: ZeroDivisionError" in notes
    assert "compile failed on partition 0: MemoryError: compiler crashed" in notes
    with pytest.raises(anychip.DeviceError, match="compile failed"):  # strict: no fallback
        anychip.load(_relu_model(), devices=["gchip", "cpu"], strict=True, cost_model=False)
