"""``core/run/checks.py``: a kernel's wrong dtype or shape is caught at the node that made it,
naming the device, the kernel and the node; a plugin without hooks is reported, not lost."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import anychip
from anychip import hookimpl
from anychip.core.plugin import host as plugins
from anychip.core.plugin.backend import Backend
from anychip.core.plugin.kernels import KernelTable
from anychip.errors import KernelError
from tests.core.test_placement import three_nodes


class _Host(Backend):
    """A host-memory test device whose Relu kernel is wrong in a chosen way."""

    name, kind, priority, host_memory = "wrongchip", "wrongchip", 50, True

    def _copy_in(self, array):
        return array.copy()

    def _copy_out(self, tensor):
        return tensor.copy()


def _plugin(relu):
    table = KernelTable("wrongchip")
    table.register("Relu", since=1)(relu)

    class Plugin:
        ANYCHIP_API_VERSION = 1

        @hookimpl
        def anychip_register_backends(self, registry):
            registry.add_backend(_Host())

        @hookimpl
        def anychip_register_kernels(self, registry):
            registry.add_kernels(table)

    return Plugin()


@pytest.fixture
def with_plugin():
    added = []

    def add(relu):
        plugins.register_plugin(_plugin(relu), "test-wrongchip")
        added.append(1)

    yield add
    plugins.unregister_plugin("test-wrongchip")


_X = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}


def test_a_float64_result_is_caught_at_its_node(with_plugin) -> None:
    with_plugin(lambda x: np.maximum(x, 0).astype(np.float64))
    sess = anychip.load(
        three_nodes(), devices=["wrongchip", "cpu"], cost_model=False, failover=False
    )
    with pytest.raises(KernelError) as info:
        sess.run(None, _X)
    text = str(info.value)
    assert "wrongchip: kernel" in text and "node 'relu' (Relu)" in text
    assert "dtype float64, expected float32" in text


def test_a_wrong_shape_is_caught_and_the_check_can_be_turned_off(with_plugin) -> None:
    with_plugin(lambda x: np.maximum(x, 0)[:2])
    sess = anychip.load(
        three_nodes(), devices=["wrongchip", "cpu"], cost_model=False, failover=False
    )
    with pytest.raises(KernelError, match=r"shape \[2, 8\], expected \[4, 8\]"):
        sess.run(None, _X)
    # With failover (the default) the wrong device is dropped and the run gives the right
    # result from the CPU.
    safe = anychip.load(three_nodes(), devices=["wrongchip", "cpu"], cost_model=False)
    assert safe.run(None, _X)[0].shape == (4, 8) and "wrongchip" in safe.unhealthy
    unchecked = anychip.load(
        three_nodes(),
        devices=["wrongchip", "cpu"],
        cost_model=False,
        check_kernels=False,
        failover=False,
    )
    (y,) = unchecked.run(None, _X)  # the wrong result flows on: what the check prevents
    assert y.shape == (2, 8)


def test_a_correct_plugin_kernel_passes_the_check(with_plugin) -> None:
    with_plugin(lambda x: np.maximum(x, 0))
    sess = anychip.load(three_nodes(), devices=["wrongchip", "cpu"], cost_model=False)
    (got,) = sess.run(None, _X)
    (want,) = anychip.load(three_nodes(), devices=["cpu"]).run(None, _X)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert sess.placement().by_device()["wrongchip"] == 1


def test_a_plugin_without_hookimpl_is_reported(caplog) -> None:
    class NoHooks:
        ANYCHIP_API_VERSION = 1

        def anychip_register_backends(self, registry):  # forgot @hookimpl
            raise AssertionError("never called")

    plugins.register_plugin(NoHooks(), "test-nohooks")
    try:
        with caplog.at_level(logging.WARNING, logger="anychip"):
            rows = anychip.devices(include_failed_plugins=True)
        assert any("registers no hook" in r.message for r in caplog.records)
        assert any("test-nohooks" in r.plugin and "@anychip.hookimpl" in r.reason for r in rows)
    finally:
        plugins.unregister_plugin("test-nohooks")
