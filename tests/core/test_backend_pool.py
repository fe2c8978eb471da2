"""A memory pool registered for a non-host device is the one its tensors come from, and
``Session.memory()`` reports its figures."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import anychip
from anychip.core.memory import CachingPool
from anychip.core.plugin.backend import Backend
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.host import register_plugin, unregister_plugin
from anychip.errors import DeviceError
from tests.conformance import badchip


class _PoolPlugin:
    """Registers a CachingPool for kind ``badchip`` and counts the factory's calls."""

    ANYCHIP_API_VERSION = 1
    made: list = []

    @hookimpl
    def anychip_register_memory_pools(self, registry) -> None:
        def factory(backend):
            pool = CachingPool(backend.name, allocator=backend)
            self.made.append(pool)
            return pool

        registry.add_pool("badchip", factory)


def _relu_add() -> bytes:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 64])
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "x"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def test_a_registered_pool_serves_the_device_and_reports_its_figures():
    badchip.CHIP.mode, badchip.CHIP._pool = "ok", None
    plugin = _PoolPlugin()
    _PoolPlugin.made.clear()
    register_plugin(badchip, "badchip")
    register_plugin(plugin, "badchip_pool")
    try:
        sess = anychip.load(_relu_add(), devices=["badchip", "cpu"], cost_model=False)
        x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, np.maximum(x, 0) + x, rtol=1e-6)
        assert sess.placement().by_device() == {"badchip": 2}
        assert len(plugin.made) == 1 and badchip.CHIP.memory_pool is plugin.made[0]
        stats = plugin.made[0].stats()
        assert stats.peak >= 3 * x.nbytes  # input, Relu's output, Add's output
        rec = {r.device: r for r in sess.memory()}["badchip"]
        assert rec.peak == stats.peak and rec.reserved == stats.reserved > 0
    finally:
        unregister_plugin("badchip_pool")
        unregister_plugin("badchip")
        badchip.CHIP._pool = None


def test_a_backend_with_alloc_but_no_free_gets_the_device_error():
    # The backend author's message (an AnychipError), not the pool's TypeError.
    class HalfChip(Backend):
        name = kind = "halfchip"

        def _alloc(self, nbytes: int) -> bytearray:
            return bytearray(nbytes)

    with pytest.raises(DeviceError, match=r"define _alloc\(nbytes\) and _free\(buffer\)"):
        HalfChip().allocate(64)
