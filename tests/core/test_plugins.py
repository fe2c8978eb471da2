"""The plugin manager: entry-point plugins, broken plugins, API versions, disabling."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.core.plugin import host as plugins


def _make_dist(tmp_path: Path, dist: str, module: str, source: str, ep_name: str) -> None:
    """A throwaway installed package: a module plus a dist-info with an ``anychip`` entry point."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    info = tmp_path / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[anychip]\n{ep_name} = {module}\n")


@pytest.fixture
def plugin_path(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    plugins.reset_plugins()
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("anychip_test_")]:
        del sys.modules[name]
    plugins.reset_plugins()


GOOD = """
    import numpy as np
    from anychip import hookimpl
    from anychip.core.plugin.backend import Backend, DeviceModel
    from anychip.core.plugin.kernels import KernelTable

    ANYCHIP_API_VERSION = 1
    TABLE = KernelTable("toy")
    CALLS = []

    class ToyTensor:
        def __init__(self, data):
            self.data = data

    class ToyBackend(Backend):
        name = "toy"
        kind = "toy"
        priority = 5

        def _copy_in(self, array):
            return ToyTensor(array.copy())

        def _copy_out(self, tensor):
            return tensor.data.copy()

    @TABLE.register("Relu", since=1)
    def relu(x):
        CALLS.append("relu")
        return ToyTensor(np.maximum(x.data, 0) + 1)  # +1: proves the toy kernel ran

    @hookimpl
    def anychip_register_backends(registry):
        registry.add_backend(ToyBackend())

    @hookimpl
    def anychip_register_kernels(registry):
        registry.add_kernels(TABLE)
"""


def _relu_model() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_entry_point_plugin_registers_a_backend_that_runs(plugin_path):
    _make_dist(plugin_path, "anychip-toy", "anychip_test_toy", GOOD, "toy")
    names = [d.name for d in anychip.devices()]
    assert "toy" in names
    # cost_model=False: the toy device declares default (slow) throughput figures
    sess = anychip.load(_relu_model(), devices=["toy", "cpu"], cost_model=False)
    (y,) = sess.run(None, {"x": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(y, [1.0, 3.0])
    rep = sess.placement()
    assert rep.nodes[0].device == "toy"
    assert rep.copy_count == 2  # x to toy, y back to host
    assert sys.modules["anychip_test_toy"].CALLS == ["relu"]


def test_broken_plugin_is_reported_and_skipped(plugin_path):
    _make_dist(
        plugin_path,
        "anychip-broken",
        "anychip_test_broken",
        "ANYCHIP_API_VERSION = 1\nraise RuntimeError('driver missing')\n",
        "broken",
    )
    rows = anychip.devices(include_failed_plugins=True)
    broken = [d for d in rows if d.name == "broken"]
    assert broken and not broken[0].available
    assert "driver missing" in broken[0].reason
    assert "cpu" in [d.name for d in rows if d.available]


def test_plugin_whose_hook_raises_is_dropped(plugin_path):
    src = GOOD.replace("registry.add_kernels(TABLE)", "raise ValueError('bad table')")
    _make_dist(plugin_path, "anychip-half", "anychip_test_half", src, "half")
    reg = plugins.get_registry()
    assert "toy" not in reg.backends
    rec = [r for r in reg.plugins if r.name == "half"][0]
    assert not rec.ok and "bad table" in rec.error


def test_api_version_mismatch_names_the_plugin(plugin_path):
    src = GOOD.replace("ANYCHIP_API_VERSION = 1", "ANYCHIP_API_VERSION = 99")
    _make_dist(plugin_path, "anychip-old", "anychip_test_old", src, "old")
    rec = [r for r in plugins.get_registry().plugins if r.name == "old"][0]
    assert not rec.ok
    assert "'old'" in rec.error and "API 99" in rec.error and "API 1" in rec.error


def test_missing_api_version_is_an_error(plugin_path):
    src = GOOD.replace("ANYCHIP_API_VERSION = 1", "")
    _make_dist(plugin_path, "anychip-nover", "anychip_test_nover", src, "nover")
    rec = [r for r in plugins.get_registry().plugins if r.name == "nover"][0]
    assert not rec.ok and "ANYCHIP_API_VERSION" in rec.error


def test_disable_plugins_env(plugin_path, monkeypatch):
    _make_dist(plugin_path, "anychip-toy2", "anychip_test_toy2", GOOD, "toy")
    monkeypatch.setenv("ANYCHIP_DISABLE_PLUGINS", "toy")
    reg = plugins.get_registry()
    assert "toy" not in reg.backends
    assert "cpu" in reg.backends


def test_plugins_load_lazily_not_at_import():
    import importlib

    plugins.reset_plugins()
    importlib.reload(anychip)
    assert plugins._loader is None
    anychip.devices()
    assert plugins._loader is not None


def test_unknown_device_lists_known_ones():
    with pytest.raises(anychip.DeviceError, match="unknown device 'tpu'.*cpu"):
        anychip.load(_relu_model(), devices=["tpu"])


def test_a_device_that_must_be_named_is_not_probed_by_a_default_session():
    """auto_select=False devices (onnxruntime's providers load a model to answer) are left
    out before their availability is asked."""
    from anychip.core.plugin.backend import Backend
    from anychip.core.plugin.hookspecs import hookimpl
    from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin

    asked = []

    class Shy(Backend):
        name, kind, auto_select = "shy", "shy", False

        def _available(self):
            asked.append(self.name)
            return True, ""

    class Plugin:
        @hookimpl
        def anychip_register_backends(self, registry):
            registry.add_backend(Shy())

    get_registry()
    register_plugin(Plugin(), "shy")
    try:
        sess = anychip.load(_relu_model())
        assert "shy" not in sess.devices and asked == []
    finally:
        unregister_plugin("shy")
