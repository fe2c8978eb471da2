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


def test_a_request_that_fails_everywhere_does_not_blame_the_device() -> None:
    """An index out of range fails on the NPU and on the CPU: the caller gets the error, and
    the NPU keeps its nodes (issue 47: it was marked unhealthy for good)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    k = numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32), "k")
    nodes = [
        helper.make_node("Add", ["x", "k"], ["a"]),
        helper.make_node("Gather", ["a", "i"], ["g"], axis=0),
        helper.make_node("Relu", ["g"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6, 8]),
            helper.make_tensor_value_info("i", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [k],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    x = rng.standard_normal((6, 8)).astype(np.float32)
    with pytest.raises(anychip.KernelError, match="indices must lie"):
        sess.run(None, {"x": x, "i": np.array([0, 9, 1])})
    assert sess.unhealthy == {} and sess.placement().by_device() == {"npu": 3}
    good = sess.run(None, {"x": x, "i": np.array([2, 0, 5])})[0]
    np.testing.assert_allclose(good, np.maximum((x + numpy_helper.to_array(k))[[2, 0, 5]], 0))


def test_a_request_too_large_for_the_device_runs_elsewhere_alone(chip) -> None:
    sess = anychip.load(_model("N"), devices=["badchip", "cpu"], cost_model=False)
    chip.mode = "small_memory"
    big = np.random.default_rng(1).standard_normal((16, 64)).astype(np.float32)
    np.testing.assert_allclose(sess.run(None, {"x": big})[0], _expected(big), rtol=1e-6)
    report = sess.placement()
    assert sess.unhealthy == {} and report.by_device() == {"badchip": 2}
    assert "rerouted: 1 request(s) too large for badchip" in str(report)
    small = big[:4]
    np.testing.assert_allclose(sess.run(None, {"x": small})[0], _expected(small), rtol=1e-6)


def test_an_unhealthy_device_is_tried_again_after_its_backoff(chip, monkeypatch) -> None:
    from anychip.core.run import failover

    clock = [1000.0]
    monkeypatch.setattr(failover, "_now", lambda: clock[0])
    sess = anychip.load(_model(), devices=["badchip", "cpu"], cost_model=False)
    x = np.random.default_rng(2).standard_normal((4, 64)).astype(np.float32)
    chip.mode = "gone"
    sess.run(None, {"x": x})
    assert "badchip" in sess.unhealthy and sess.placement().by_device() == {"cpu": 2}
    chip.mode = "ok"
    clock[0] += failover.BACKOFF - 1  # not yet
    sess.run(None, {"x": x})
    assert sess.placement().by_device() == {"cpu": 2}
    clock[0] += 2
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], _expected(x), rtol=1e-6)
    assert sess.unhealthy == {} and sess.placement().by_device() == {"badchip": 2}
    chip.mode = "gone"  # fails again: out for twice as long
    sess.run(None, {"x": x})
    assert failover._state(sess)["retry_at"]["badchip"] == clock[0] + 2 * failover.BACKOFF
