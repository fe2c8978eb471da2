"""The XPU as a device: placement, copies, pins, strict mode, and proof the copies are real."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from tests.models import transformer_layer

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()),
    reason="the XPU driver could not be built here (no C compiler)",
)


@pytest.fixture(scope="module")
def model():
    return transformer_layer()


@pytest.fixture(scope="module")
def x():
    return np.random.default_rng(0).standard_normal((1, 64, 256)).astype(np.float32)


def test_transformer_matmuls_run_on_xpu_and_match_cpu(model, x):
    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    ref = anychip.load(model, devices=["cpu"])
    np.testing.assert_allclose(
        sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4
    )
    rep = sess.placement()
    matmuls = [n for n in rep.nodes if n.op_type == "MatMul"]
    assert len(matmuls) == 8 and all(n.device == "xpu" for n in matmuls), rep
    ln = [n for n in rep.nodes if n.op_type == "LayerNormalization"]
    assert ln and all(n.device == "xpu" for n in ln)  # the XPU's LayerNormalization kernel
    # Every per-run copy counted exactly:
    assert rep.copy_count == len(rep.copies)
    assert {(c.src, c.dst) for c in rep.copies} == {("cpu", "xpu"), ("xpu", "cpu")}
    assert rep.copy_bytes == sum(c.bytes for c in rep.copies) > 0
    assert len(rep.load_copies) >= 6  # the weights, moved once at load


def test_pin_moves_a_node_to_cpu(model, x):
    sess = anychip.load(model, devices=["xpu", "cpu"], placement={"attn/scores": "cpu"})
    rep = sess.placement()
    node = [n for n in rep.nodes if n.name == "attn/scores"][0]
    assert node.device == "cpu" and node.reason == "pinned"
    ref = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-4, atol=1e-4)


def test_glob_and_op_type_pins(model):
    sess = anychip.load(model, devices=["xpu", "cpu"], placement={"ffn/*": "cpu", "Softmax": "cpu"})
    rep = sess.placement()
    assert all(n.device == "cpu" for n in rep.nodes if n.name.startswith("ffn/"))
    assert [n.device for n in rep.nodes if n.op_type == "Softmax"] == ["cpu"]


def _with_floors() -> bytes:
    """Tanh, two Floors (the XPU has no Floor kernel), Tanh."""
    from onnx import TensorProto, helper

    n = helper.make_node
    nodes = [
        n("Tanh", ["x"], ["a"]),
        n("Floor", ["a"], ["b"], name="floor1"),
        n("Floor", ["b"], ["c"], name="floor2"),
        n("Tanh", ["c"], ["y"]),
    ]
    io = [helper.make_tensor_value_info(v, TensorProto.FLOAT, [4, 8]) for v in ("x", "y")]
    g = helper.make_graph(nodes, "floors", io[:1], io[1:])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_strict_refuses_fallback():
    with pytest.raises(
        anychip.PlacementError, match=r"strict placement: 2 node\(s\) would fall back from xpu"
    ):
        anychip.load(_with_floors(), devices=["xpu", "cpu"], strict=True)


def test_impossible_pin_is_an_error():
    with pytest.raises(anychip.PlacementError, match="pinned to xpu.*no kernel"):
        anychip.load(_with_floors(), devices=["xpu", "cpu"], placement={"floor1": "xpu"})


def test_max_copies(model):
    with pytest.raises(anychip.PlacementError, match="max_copies=1"):
        anychip.load(model, devices=["xpu", "cpu"], max_copies=1, cost_model=False)


def test_tampering_with_device_memory_changes_the_result(model, x):
    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    before = sess.run(None, {"x": x})[0]
    xpu_part = [p for p in sess.partitions if p.device == "xpu"][0]
    runner = xpu_part.program.wrapped.__self__  # under the queue's synchronize
    program = getattr(runner, "program", runner)  # PartitionMemory.run with planned memory
    slot, weight = program.consts[0]
    weight.driver.poke(weight.handle, 0, np.full(16, 7.0, np.float32).tobytes())
    after = sess.run(None, {"x": x})[0]
    assert not np.allclose(before, after), "the XPU read a host copy, not its own memory"


def test_device_memory_is_returned_after_a_run(model, x):
    from anychip.backends.xpu_stub.driver import get_driver

    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    sess.run(None, {"x": x})
    used = get_driver().mem_info().used
    sess.run(None, {"x": x})
    assert get_driver().mem_info().used == used  # intermediates freed, only weights stay


def test_device_constants_are_freed_with_the_session(model, x):
    import gc

    from anychip.backends.xpu_stub.driver import get_driver

    gc.collect()
    before = get_driver().mem_info().used
    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    sess.run(None, {"x": x})
    assert get_driver().mem_info().used > before  # the weights live on the device
    del sess
    gc.collect()
    assert get_driver().mem_info().used == before


def test_memory_report_takes_the_driver_heap_figures(model, x):
    from anychip.backends.xpu_stub.driver import get_driver

    sess = anychip.load(model, devices=["xpu", "cpu"], cost_model=False)
    sess.run(None, {"x": x})
    rec = sess.memory()["xpu"]
    info = get_driver().mem_info()
    assert rec.source == "device pool"
    assert rec.reserved == info.capacity == rec.capacity
    # The weights and at least one [1, 64, 1024] activation were on the device at once.
    assert rec.peak == info.peak >= 256 * 1024 * 4 + 64 * 1024 * 4
    stats = sess.compiled.backends[
        [b.name for b in sess.compiled.backends].index("xpu")
    ].memory_stats()
    assert stats.in_use == info.used and stats.live_blocks >= 1
    assert 0.0 <= stats.fragmentation < 1.0
