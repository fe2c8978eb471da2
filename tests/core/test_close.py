"""``Session.close()`` and the with-block give device memory back at once; a closed session
refuses to run or report, with an error that says what to do (issue 18)."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.core.plugin.host import get_registry


def _mlp() -> bytes:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((64, 128)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((128, 32)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Relu", ["h"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 32])],
        [w1, w2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _in_use(device: str) -> int:
    return get_registry().backends[device].memory_stats().in_use


@pytest.mark.parametrize("device", ["xpu", "npu"])
def test_close_gives_device_memory_back_at_once(device):
    if not get_registry().backends[device].available()[0]:
        pytest.skip(f"{device} unavailable here")
    before = _in_use(device)
    x = np.random.default_rng(1).standard_normal((8, 64)).astype(np.float32)
    sess = anychip.load(_mlp(), devices=[device, "cpu"], cost_model=False)
    assert sess.placement().by_device().get(device, 0) >= 2
    want = sess.run(None, {"x": x})[0]
    assert _in_use(device) > before  # the weights live on the device
    keep = sess  # a second reference: close must not wait for the last one
    sess.close()
    assert _in_use(device) == before
    assert keep.closed
    with pytest.raises(anychip.AnychipError, match="session is closed"):
        keep.run(None, {"x": x})
    with pytest.raises(anychip.AnychipError, match="closed"):
        keep.placement()
    with pytest.raises(anychip.AnychipError, match="closed"):
        keep.memory()
    sess.close()  # twice: nothing
    with anychip.load(_mlp(), devices=[device, "cpu"], cost_model=False) as again:
        np.testing.assert_allclose(again.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
        assert _in_use(device) > before
    assert _in_use(device) == before and again.closed


def test_weights_that_do_not_fit_a_full_device_fall_back_at_load():
    """Another user holds nearly all of the XPU's heap: the load places the MLP on the CPU
    and says why, instead of failing (issue 18)."""
    xpu = get_registry().backends["xpu"]
    if not xpu.available()[0]:
        pytest.skip("xpu unavailable here")
    from anychip.backends.xpu_stub.driver import get_driver

    drv = get_driver()
    info = drv.mem_info()
    hog = drv.malloc(info.capacity - info.used - (16 << 10))  # 16 KiB left; the weights are 48
    try:
        sess = anychip.load(_mlp(), devices=["xpu", "cpu"], cost_model=False)
        assert sess.placement().by_device() == {"cpu": 3}
        assert any("weights do not fit" in n for n in sess.compiled.memory_notes)
        x = np.random.default_rng(2).standard_normal((8, 64)).astype(np.float32)
        want = anychip.load(_mlp(), devices=["cpu"]).run(None, {"x": x})[0]
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
    finally:
        drv.free(hog)


def test_close_while_a_background_compile_runs_still_gives_the_memory_back():
    npu = get_registry().backends["npu"]
    before, others = npu.memory_stats().in_use, set(threading.enumerate())
    sess = anychip.load(_mlp(), devices=["npu", "cpu"], cost_model=False, background_compile=True)
    x = np.random.default_rng(3).standard_normal((8, 64)).astype(np.float32)
    sess.run(None, {"x": x})  # served by the host; the compile starts after the request
    sess.close()
    # close waited for the compile: nothing can put an executable on the NPU after it
    assert not [t for t in set(threading.enumerate()) - others if t.name == "anychip-compile"]
    assert npu.memory_stats().in_use == before
