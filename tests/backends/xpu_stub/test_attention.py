"""The XPU's attention kernel (driver/kernels_attention.c, launch_attention.py) and the fusion
that uses it: against numpy in float64 and onnxruntime, on seeded random data, odd sizes
(rows not a multiple of the 48-row block, heads not of the 16 lanes), one to three threads with
the same bits, and the unfused launches it falls back to (mask, broadcast batches)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.xpu_stub.driver import XpuDriver, set_num_threads
from anychip.backends.xpu_stub.driver.launch_attention import xpu_attention
from anychip.errors import KernelError

pytestmark = pytest.mark.skipif(
    not any(d.name == "xpu" and d.available for d in anychip.devices()),
    reason="the XPU driver could not be built here (no C compiler)",
)

#: (batch shape, S, D, T, E)
SIZES = [
    ((1,), 1, 1, 1, 1),
    ((3,), 7, 5, 13, 3),
    ((2, 3), 50, 32, 97, 33),
    ((1,), 49, 64, 600, 64),
    ((2,), 97, 17, 48, 31),
]


@pytest.fixture(scope="module")
def drv():
    driver = XpuDriver(heap_bytes=64 << 20, name="xpu-attention-test")
    yield driver
    driver.close()


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _want(q, kt, v, scale, divide, mask=None) -> np.ndarray:
    s = np.matmul(q.astype(np.float64), kt.astype(np.float64))
    s = s / scale if divide else s * scale
    if mask is not None:
        s = s + mask
    e = np.exp(s - s.max(-1, keepdims=True))
    return np.matmul(e / e.sum(-1, keepdims=True), v.astype(np.float64))


def _run(drv: XpuDriver, arrays, **kw) -> np.ndarray:
    tensors = [None if a is None else drv.upload(a) for a in arrays]
    out = xpu_attention(*tensors, **kw)
    try:
        return out.numpy()
    finally:
        for t in (*tensors, out):
            if t is not None:
                t.free()


@pytest.mark.parametrize("batch,s,d,t,e", SIZES)
@pytest.mark.parametrize("divide", [0, 1])
def test_fused_kernel_matches_float64_on_any_thread_count(drv, batch, s, d, t, e, divide):
    rng = np.random.default_rng(s * 1000 + t)
    q, kt, v = _rand(rng, *batch, s, d), _rand(rng, *batch, d, t), _rand(rng, *batch, t, e)
    scale = 0.125 if not divide else 8.0
    outs = []
    try:
        for threads in (1, 2, 3):
            set_num_threads(threads)
            outs.append(_run(drv, (q, kt, v), scale=scale, divide=divide))
    finally:
        set_num_threads(None)
    assert outs[0].shape == (*batch, s, e) and outs[0].dtype == np.float32
    np.testing.assert_allclose(outs[0], _want(q, kt, v, scale, divide), rtol=1e-4, atol=1e-5)
    for other in outs[1:]:
        np.testing.assert_array_equal(other, outs[0])


def test_mask_and_broadcast_batches_run_unfused(drv):
    rng = np.random.default_rng(7)
    q, kt, v = _rand(rng, 2, 3, 9, 8), _rand(rng, 1, 3, 8, 11), _rand(rng, 2, 3, 11, 5)
    got = _run(drv, (q, kt, v), scale=0.3, divide=0)
    np.testing.assert_allclose(got, _want(q, kt, v, 0.3, 0), rtol=1e-4, atol=1e-5)
    mask = (rng.standard_normal((2, 1, 1, 11)) * 3).astype(np.float32)
    kt2 = _rand(rng, 2, 3, 8, 11)
    got = _run(drv, (q, kt2, v, mask), scale=2.0, divide=1)
    np.testing.assert_allclose(got, _want(q, kt2, v, 2.0, 1, mask), rtol=1e-4, atol=1e-5)


def test_operands_that_do_not_chain_are_a_kernel_error(drv):
    rng = np.random.default_rng(1)
    with pytest.raises(KernelError, match="do not chain"):
        _run(drv, (_rand(rng, 2, 4, 3), _rand(rng, 2, 5, 6), _rand(rng, 2, 6, 2)), scale=1.0)


def _attention_model(b: int, h: int, s: int, dh: int, seed: int, mask: bool) -> bytes:
    """q, k, v [b, s, h*dh] -> heads split, softmax(q kt * c [+ mask]) v, heads joined."""
    n = helper.make_node
    nodes = [
        n("Reshape", ["q", "shape4"], ["q4"]),
        n("Transpose", ["q4"], ["qh"], perm=[0, 2, 1, 3]),
        n("Reshape", ["k", "shape4"], ["k4"]),
        n("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        n("Reshape", ["v", "shape4"], ["v4"]),
        n("Transpose", ["v4"], ["vh"], perm=[0, 2, 1, 3]),
        n("MatMul", ["qh", "kt"], ["scores"]),
        n("Mul", ["scores", "c"], ["scaled"]),
    ]
    probs_in = "scaled"
    if mask:
        nodes.append(n("Add", ["scaled", "mask"], ["masked"]))
        probs_in = "masked"
    nodes += [
        n("Softmax", [probs_in], ["probs"], axis=-1),
        n("MatMul", ["probs", "vh"], ["ctx"]),
    ]
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.array([b, s, h, dh], np.int64), "shape4"),
        numpy_helper.from_array(np.array(rng.uniform(0.1, 0.3), np.float32), "c"),
    ]
    if mask:
        m = np.where(rng.random((b, 1, 1, s)) < 0.2, -1e4, 0.0).astype(np.float32)
        inits.append(numpy_helper.from_array(m, "mask"))
    inputs = [helper.make_tensor_value_info(x, TensorProto.FLOAT, [b, s, h * dh]) for x in "qkv"]
    out = helper.make_tensor_value_info("ctx", TensorProto.FLOAT, [b, h, s, dh])
    model = helper.make_model(
        helper.make_graph(nodes, "attention", inputs, [out], inits),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    model.ir_version = 8
    return model.SerializeToString()


@pytest.mark.parametrize("mask", [False, True])
def test_fused_on_the_xpu_matches_onnxruntime(mask):
    ort = pytest.importorskip("onnxruntime")
    model = _attention_model(2, 3, 53, 16, seed=5, mask=mask)
    rng = np.random.default_rng(11)
    feeds = {x: _rand(rng, 2, 53, 48) for x in "qkv"}
    sess = anychip.load(model, devices=["xpu"], strict=True, cost_model=False)
    fusions = {k: v for p in sess.partitions for k, v in p.info.get("fusions", {}).items()}
    assert fusions.get("fuse_attention") == 1
    got = sess.run(None, feeds)[0]
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert onnx.load_from_string(model).graph.node[6].op_type == "MatMul"  # the input unfused
