"""A plugin hook that calls back into anychip (``anychip.devices()``) gets a clear error
naming the plugin, and breaks no other plugin (issue 47: it recursed, other plugins were
blamed, and cpu and xpu stayed broken for the rest of the process)."""

from __future__ import annotations

import types

import numpy as np
import pytest

import anychip
from anychip.core.plugin.hookspecs import API_VERSION
from anychip.core.plugin.host import register_plugin, unregister_plugin
from tests.conformance import badchip
from tests.core.test_feedback import _expected, _model


def _reentrant(call: str) -> types.ModuleType:
    mod = types.ModuleType("reentrant_plugin")
    mod.ANYCHIP_API_VERSION = API_VERSION  # type: ignore[attr-defined]

    @anychip.hookimpl
    def anychip_register_backends(registry: object) -> None:
        if call == "devices":
            anychip.devices()
        else:
            anychip.load(_model(), devices=["cpu"])

    mod.anychip_register_backends = anychip_register_backends  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def plugins(request: pytest.FixtureRequest):
    badchip.CHIP.mode, badchip.CHIP._pool = "ok", None
    register_plugin(badchip, "badchip")
    register_plugin(_reentrant(request.param), "reentrant")
    yield
    unregister_plugin("reentrant")
    unregister_plugin("badchip")


@pytest.mark.parametrize("plugins", ["devices", "load"], indirect=True)
def test_a_hook_calling_back_into_anychip_is_refused_alone(plugins: None) -> None:
    found = {d.name: d for d in anychip.devices(include_failed_plugins=True)}
    assert not found["reentrant"].available
    why = found["reentrant"].reason
    assert "plugin 'reentrant' called back into anychip" in why
    assert "anychip_register_backends" in why
    for name in ("cpu", "xpu", "badchip"):
        assert found[name].available, found[name]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    sess = anychip.load(_model(), devices=["badchip", "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)
    assert sess.placement().by_device() == {"badchip": 2}
    sess = anychip.load(_model(), devices=["xpu", "cpu"], cost_model=False)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-5)
