"""``import anychip`` is cheap, and a plugin is imported only when a session needs its device.

In fresh interpreters: ``import anychip`` imports no onnx, ml_dtypes, pluggy or backend; a cpu
session imports the cpu's plugin alone, an npu session the npu's too, ``anychip.devices()`` all.
In this process: the discovery rules on monkeypatched entry points (a name is the device kinds
its plugin provides; another name is imported when a device nobody provides is asked for), and
failure isolation across batches.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import anychip
from anychip.core.plugin import discovery
from anychip.core.plugin import host as plugins
from tests.core.test_plugin_isolation import POISON
from tests.core.test_plugins import GOOD, _relu_model

HEAVY = ("onnx", "ml_dtypes", "pluggy")
STUBS = ("opencl", "npu_stub", "xpu_stub", "cuda")
UNSET = ("ANYCHIP_DEVICES", "ANYCHIP_LOG_LEVEL", "ANYCHIP_DISABLE_PLUGINS", "ANYCHIP_TRACE_PLUGINS")


def _fresh(code: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter with this process's environment and anychip."""
    check = f"import anychip; assert anychip.__file__ == {anychip.__file__!r}, anychip.__file__\n"
    return subprocess.run(
        [sys.executable, "-c", check + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k not in UNSET},
        cwd=Path(anychip.__file__).parents[1],
        timeout=300,
    )


def test_import_anychip_imports_no_onnx_pluggy_or_backend() -> None:
    # A bare interpreter importing anychip alone (0.1 s): kept in the quick tier.
    out = _fresh(
        f"""
        import sys
        heavy = [m for m in {HEAVY!r} if m in sys.modules]
        backends = [m for m in sys.modules if m.startswith("anychip.backends")]
        assert not heavy and not backends, (heavy, backends)
        from anychip import ir
        assert ir.Graph and ir.DType.FLOAT.numpy
        heavy = [m for m in {HEAVY!r} if m in sys.modules]
        assert not heavy, heavy  # the IR classes alone need none of them
        assert anychip.SessionOptions and anychip.IOInfo and "pluggy" not in sys.modules
        assert anychip.hookimpl and "pluggy" in sys.modules
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow  # starts another process: the slow tier (pyproject.toml, markers)
def test_a_session_imports_the_backends_of_its_devices_only() -> None:
    out = _fresh(
        f"""
        import sys
        import numpy as np
        from onnx import TensorProto, helper
        from anychip.core.plugin.discovery import discover

        def stubs():
            return {{m for m in {STUBS!r} if "anychip.backends." + m in sys.modules}}

        g = helper.make_graph(
            [helper.make_node("Relu", ["x"], ["y"])], "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        x = np.array([-1.0, 2.0], np.float32)
        assert "anychip.backends.cpu" not in sys.modules
        y, = anychip.load(m, devices=["cpu"]).run(None, {{"x": x}})
        assert list(y) == [0.0, 2.0] and "anychip.backends.cpu" in sys.modules
        assert stubs() == set(), stubs()
        y, = anychip.load(m, devices=["npu", "cpu"]).run(None, {{"x": x}})
        assert stubs() == {{"npu_stub"}}, stubs()
        names = {{d.name for d in anychip.devices()}}
        assert {{"cpu", "npu", "xpu"}} <= names, names
        missing = [c.module for c in discover() if c.module not in sys.modules]
        assert not missing, missing
        print("ok")
        """
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# -- the rules, on monkeypatched entry points ---------------------------------------------------
#: A plugin adding to another plugin's device (a pass for the cpu), named after that device.
ADDS_TO_THE_CPU = """
    from anychip import hookimpl

    ANYCHIP_API_VERSION = 1

    @hookimpl
    def anychip_register_passes(registry):
        pass
"""


def _plugin_source(device: str) -> str:
    return GOOD.replace('"toy"', f'"{device}"')


@pytest.fixture
def entry_points(tmp_path, monkeypatch):
    """``install(name, source)``: a plugin module from ``source`` under entry-point ``name``,
    in place of the installed entry points (the built-ins stay: anychip finds them itself)."""
    monkeypatch.syspath_prepend(str(tmp_path))
    installed: list[importlib.metadata.EntryPoint] = []
    monkeypatch.setattr(discovery, "_installed", lambda: list(installed))
    modules: list[str] = []

    def install(name: str, source: str | None, *, value: str | None = None) -> str:
        module = f"anychip_test_lazy_{len(modules)}"
        if source is not None:
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            modules.append(module)
        installed.append(importlib.metadata.EntryPoint(name, value or module, "anychip"))
        return module

    plugins.reset_plugins()
    yield install
    for module in modules:
        sys.modules.pop(module, None)
    plugins.reset_plugins()


def _imported(*modules: str) -> list[bool]:
    return [m in sys.modules for m in modules]


def test_a_device_imports_the_plugins_named_by_its_kind(entry_points) -> None:
    alpha = entry_points("alpha", _plugin_source("alpha"))
    beta = entry_points("beta", _plugin_source("beta"))
    cpu_extra = entry_points("cpu.extra", ADDS_TO_THE_CPU)
    two = entry_points("gamma+delta", _plugin_source("delta:1"))
    reg = plugins.get_registry(["alpha"])
    assert _imported(alpha, beta, cpu_extra, two) == [True, False, True, False]
    assert {r.name for r in reg.plugins} == {"cpu", "alpha", "cpu.extra"}
    assert "alpha" in reg.backends and "beta" not in reg.backends
    reg = plugins.get_registry(["delta:1"])  # a name's kind is up to ":"
    assert _imported(beta, two) == [False, True] and "delta:1" in reg.backends
    plugins.get_registry()
    assert _imported(beta) == [True]


def test_a_device_nobody_named_imports_the_rest_first(entry_points) -> None:
    other = entry_points("oddname", _plugin_source("toy"))
    beta = entry_points("beta", _plugin_source("beta"))
    sess = anychip.load(_relu_model(), devices=["toy", "cpu"], cost_model=False)
    assert _imported(other, beta) == [True, True]
    assert sess.placement().nodes[0].device == "toy"
    with pytest.raises(anychip.DeviceError, match="unknown device 'tpu'.*toy"):
        anychip.load(_relu_model(), devices=["tpu"])


@pytest.fixture
def fresh_plugins():
    plugins.reset_plugins()
    yield
    plugins.reset_plugins()


def test_the_cpu_alone_imports_no_other_plugin(fresh_plugins) -> None:
    # The installed entry points (opencl, cuda, the stubs under their old or new names): a cpu
    # session imports the cpu's plugin alone, an npu one the npu's too.
    reg = plugins.get_registry(["cpu"])
    assert [r.name for r in reg.plugins] == ["cpu"]
    reg = plugins.get_registry(["npu", "cpu"])
    assert [r.name for r in reg.plugins] == ["cpu", "npu"]
    assert set(reg.backends) == {"cpu", "npu"}


def test_old_entry_point_names_still_work(entry_points, monkeypatch) -> None:
    # An installed copy's metadata may carry the old names: the module tells the built-in.
    entry_points("npu_stub", None, value="anychip.backends.npu_stub")
    entry_points("npu", None, value="anychip.backends.npu_stub")
    reg = plugins.get_registry(["npu"])
    assert [r.name for r in reg.plugins] == ["cpu", "npu"] and all(r.ok for r in reg.plugins)
    monkeypatch.setenv("ANYCHIP_DISABLE_PLUGINS", "npu_stub")
    plugins.reset_plugins()
    with pytest.raises(anychip.DeviceError, match="'npu' provides it but was left out: disabled"):
        anychip.load(_relu_model(), devices=["npu"])


def test_one_module_under_two_names_is_one_plugin(entry_points) -> None:
    # stale metadata (an egg-info beside the dist-info) lists a third-party module twice
    module = entry_points("alpha", _plugin_source("alpha"))
    entry_points("alpha_old", None, value=module)
    reg = plugins.get_registry()
    assert [r.name for r in reg.plugins].count("alpha") == 1
    assert "alpha_old" not in {r.name for r in reg.plugins} and all(r.ok for r in reg.plugins)


def test_a_failing_plugin_is_reported_and_the_cpu_still_loads(entry_points) -> None:
    entry_points("cpu.broken", "ANYCHIP_API_VERSION = 1\nraise RuntimeError('no driver')\n")
    entry_points("tpu", "raise ImportError('libtpu missing')\n")
    x = np.array([-1.0, 2.0], np.float32)
    (y,) = anychip.load(_relu_model(), devices=["cpu"]).run(None, {"x": x})
    np.testing.assert_array_equal(y, [0.0, 2.0])
    reg = plugins.get_registry(["cpu"])
    rec = next(r for r in reg.plugins if r.name == "cpu.broken")
    assert not rec.ok and "no driver" in rec.error
    with pytest.raises(anychip.DeviceError, match="'tpu' provides it.*libtpu missing"):
        anychip.load(_relu_model(), devices=["tpu"])
    rows = {d.name: d for d in anychip.devices(include_failed_plugins=True)}
    assert not rows["cpu.broken"].available and "no driver" in rows["cpu.broken"].reason
    assert not rows["tpu"].available and rows["cpu"].available


def test_a_later_batch_that_fails_leaves_the_earlier_ones_as_they_were(entry_points) -> None:
    # "late" puts a wrong Relu into the cpu's table, then fails: the cpu loaded before it keeps
    # its backend object and table object, and the table its own kernels only.
    entry_points("late", POISON.format(exc="RuntimeError('later hook')"))
    x = np.array([-1.0, 2.0], np.float32)
    first = anychip.load(_relu_model(), devices=["cpu"])
    reg = plugins.get_registry(["cpu"])
    cpu, table, size = reg.backends["cpu"], reg.kernel_table("cpu"), len(reg.kernel_table("cpu"))
    reg = plugins.get_registry()  # imports "late"
    rec = next(r for r in reg.plugins if r.name == "late")
    assert not rec.ok and "left out whole" in rec.error
    assert reg.backends["cpu"] is cpu and reg.kernel_table("cpu") is table
    assert len(table) == size
    for sess in (first, anychip.load(_relu_model(), devices=["cpu"])):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], [0.0, 2.0])
