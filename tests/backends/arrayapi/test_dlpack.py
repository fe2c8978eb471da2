"""Device arrays in and out of ``Session.run`` on the test-only ``strict`` device: a feed
already on the device stays there (no copy in), ``output_device`` hands back the device's
arrays (no copy out), and what cannot stay on the device takes one copy, correctly."""

from __future__ import annotations

import array_api_strict as xps
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import anychip
from anychip.errors import AnychipError

RNG = np.random.default_rng(7)
_STRICT_ARRAY = type(xps.asarray(0.0))
W = RNG.standard_normal((6, 4)).astype(np.float32)
X = RNG.standard_normal((3, 6)).astype(np.float32)


def _model() -> bytes:
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["y"]),
        h.make_node("Tanh", ["y"], ["z"]),
        h.make_node("Sigmoid", ["y"], ["s"]),
    ]
    g = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, [3, 6])],
        [
            h.make_tensor_value_info("z", T.FLOAT, [3, 4]),
            h.make_tensor_value_info("s", T.FLOAT, [3, 4]),
        ],
        [onnx.numpy_helper.from_array(W, "w")],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()


def _want() -> list[np.ndarray]:
    return ort.InferenceSession(_model(), providers=["CPUExecutionProvider"]).run(None, {"x": X})


class _Spy:
    def __init__(self, backend, monkeypatch) -> None:
        self.ins = self.outs = 0
        cin, cout = backend._copy_in, backend._copy_out

        def copy_in(a):
            self.ins += 1
            return cin(a)

        def copy_out(t):
            self.outs += 1
            return cout(t)

        monkeypatch.setattr(backend, "_copy_in", copy_in)
        monkeypatch.setattr(backend, "_copy_out", copy_out)


def test_device_feed_stays_and_outputs_come_back_on_the_device(strict, monkeypatch):
    sess = anychip.load(_model(), devices=["strict", "cpu"], cost_model=False)
    assert sess.placement().by_device() == {"strict": 3}
    spy = _Spy(strict, monkeypatch)
    z, s = sess.run(None, {"x": xps.asarray(X)}, output_device="strict")
    assert (spy.ins, spy.outs) == (0, 0)  # no copy either way
    assert isinstance(z, _STRICT_ARRAY) and isinstance(s, _STRICT_ARRAY)
    for got, want in zip((z, s), _want()):
        np.testing.assert_allclose(np.from_dlpack(got), want, rtol=1e-5, atol=1e-6)
    (s_host,) = sess.run(["s"], {"x": xps.asarray(X)})  # device feed, numpy outputs
    assert isinstance(s_host, np.ndarray) and spy.ins == 0 and spy.outs == 2  # z and s
    np.testing.assert_allclose(s_host, _want()[1], rtol=1e-5, atol=1e-6)
    before = strict.memory_stats().in_use
    sess.run(None, {"x": xps.asarray(X)}, output_device="strict")
    assert strict.memory_stats().in_use == before  # the handed-over arrays are the caller's


def test_a_device_feed_read_on_the_host_is_copied_once(strict, monkeypatch):
    sess = anychip.load(
        _model(), devices=["strict", "cpu"], cost_model=False, placement={"Sigmoid": "cpu"}
    )
    assert sess.placement().by_device() == {"strict": 2, "cpu": 1}
    spy = _Spy(strict, monkeypatch)
    z, s = sess.run(None, {"x": xps.asarray(X)}, output_device="strict")
    for got, want in zip((z, s), _want()):
        assert isinstance(got, _STRICT_ARRAY)
        np.testing.assert_allclose(np.from_dlpack(got), want, rtol=1e-5, atol=1e-6)
    assert spy.outs == 1  # y to the host for the CPU's Sigmoid; z handed over


def test_cpu_session_reads_a_host_resident_device_array():
    sess = anychip.load(_model(), devices=["cpu"])
    z, _ = sess.run(None, {"x": xps.asarray(X)})
    np.testing.assert_allclose(z, _want()[0], rtol=1e-5, atol=1e-6)


def test_bad_output_device_and_bad_feed_are_named(strict):
    sess = anychip.load(_model(), devices=["strict", "cpu"], cost_model=False)
    with pytest.raises(AnychipError, match="output_device='npu'"):
        sess.run(None, {"x": X}, output_device="npu")
    with pytest.raises(anychip.InputError, match="expects shape"):
        sess.run(None, {"x": xps.asarray(X[:2])})
    with pytest.raises(anychip.InputError, match="expects dtype"):
        sess.run(None, {"x": xps.asarray(X.astype(np.float64))})


def test_device_names_match_like_pytorchs():
    from anychip.backends.arrayapi.backend import _same_device

    assert _same_device("mps:0", "mps") and _same_device("cuda:1", "cuda:1")
    assert not _same_device("cuda:1", "cuda") and not _same_device("cpu", "mps")
