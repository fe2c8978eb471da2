"""The public API is small, guarded and documented (onnx-ir's public_api_test is the model)."""

from __future__ import annotations

import importlib
import inspect

import pytest

import anychip
import anychip.errors

PUBLIC_MODULES = [
    "anychip",
    "anychip.errors",
    "anychip.zoo",
    "anychip.core.api.session",
    "anychip.core.compile.pipeline",
    "anychip.core.run.steps",
    "anychip.core.api.feeds",
    "anychip.core.plan.placement",
    "anychip.core.plan.partition",
    "anychip.core.run.program",
    "anychip.core.plugin.backend",
    "anychip.core.plugin.kernels",
    "anychip.core.plugin.registry",
    "anychip.core.memory",
    "anychip.ir.passes",
    "anychip.ir.passes.patterns",
    "anychip.core.report.profile",
    "anychip.core.progress",
    "anychip.core.report.render",
    "anychip.core.logsetup",
    "anychip.viz",
    "anychip.viz.view",
    "anychip.viz.layout",
    "anychip.viz.html",
    "anychip.viz.dot",
    "anychip.viz.inspect",
    "anychip.viz.timeline",
    "anychip.viz.terminal",
    "anychip.viz.notebook",
]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_every_public_name_exists_and_is_documented(module: str) -> None:
    mod = importlib.import_module(module)
    assert mod.__doc__, f"{module} has no docstring"
    names = getattr(mod, "__all__", None)
    assert names, f"{module} has no __all__"
    for name in names:
        obj = getattr(mod, name)  # AttributeError: a name in __all__ that does not exist
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"


def test_errors_are_one_family_importable_from_both_places() -> None:
    for name in anychip.errors.__all__:
        cls = getattr(anychip.errors, name)
        assert issubclass(cls, anychip.AnychipError)
        assert getattr(anychip, name) is cls
    from anychip.core import errors as old  # plugins written against the old path

    assert old.AnychipError is anychip.AnychipError


def test_load_run_placement_memory_devices() -> None:
    import numpy as np

    from tests.core.test_placement import three_nodes

    sess = anychip.load(three_nodes(), devices="xpu,cpu", cost_model=False)
    assert sess.devices == ["xpu", "cpu"]
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    s = np.sin(np.maximum(x, 0))
    e = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(-1, keepdims=True), rtol=1e-5)
    assert sess.placement().by_device() == {"xpu": 2, "cpu": 1}
    assert {r.device for r in sess.memory()} == {"xpu", "cpu"}
    names = {d.name for d in anychip.devices()}
    assert {"cpu", "xpu", "npu"} <= names
    assert sess.get_inputs()[0].name == "x" and sess.get_outputs()[0].name == "y"
