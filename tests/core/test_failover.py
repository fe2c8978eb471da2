"""Failover: a device that fails mid-run is marked unhealthy, the request re-runs on the
remaining devices, and later runs stay off it; strict sessions and the host do not fail over."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.core.plugin.host import register_plugin, unregister_plugin
from tests.conformance import badchip
from tests.core.test_feedback import _expected, _model


@pytest.fixture
def chip():
    badchip.CHIP.mode, badchip.CHIP._pool = "ok", None
    register_plugin(badchip, "badchip")
    yield badchip.CHIP
    unregister_plugin("badchip")
    badchip.CHIP.mode, badchip.CHIP._pool = "ok", None


def test_a_device_that_fails_mid_run_is_replaced_for_that_request_and_after(chip, caplog):
    sess = anychip.load(_model(), devices=["badchip", "cpu"], cost_model=False)
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)
    assert sess.placement().by_device() == {"badchip": 2}
    chip.mode = "gone"
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)
    report = sess.placement()
    assert report.by_device() == {"cpu": 2}
    assert "device lost" in report.unhealthy["badchip"] and "unhealthy: badchip" in str(report)
    assert "marked unhealthy" in caplog.text
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)
    assert chip.memory_stats().in_use == 0  # the failed run gave its device tensors back


def test_replan_is_explicit_too(chip):
    sess = anychip.load(_model(), devices=["badchip", "cpu"], cost_model=False)
    sess.unhealthy["badchip"] = "taken out for maintenance"
    sess.replan()
    assert sess.placement().by_device() == {"cpu": 2}


def test_strict_sessions_do_not_fail_over(chip):
    sess = anychip.load(_model(), devices=["badchip", "cpu"], cost_model=False, strict=True)
    chip.mode = "gone"
    with pytest.raises(anychip.KernelError, match="device lost"):
        sess.run(None, {"x": np.ones((4, 64), np.float32)})
    assert sess.unhealthy == {}
