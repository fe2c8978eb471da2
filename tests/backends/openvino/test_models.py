"""Models on ``openvino:cpu`` against onnxruntime: wholly on OpenVINO (strict), mixed with the
CPU backend, dynamic shapes compiled once, bf16 opted into, runs from several threads."""

from __future__ import annotations

import os
import threading

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import anychip
from tests.backends.openvino.conftest import DEVICE, cnn, model, reference, weight
from tests.models import transformer_layer

pytestmark = pytest.mark.usefixtures("ov_cpu")
DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data")


def _close(got, ref, rtol=1e-4, atol=1e-5) -> None:
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


def _partitions(sess, device=DEVICE):
    return [p for p in sess.placement().partitions if p.device == device]


def test_cnn_wholly_on_openvino():
    m = cnn()
    x = np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype(np.float32)
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    _close(sess.run(None, {"x": x}), reference(m, {"x": x}))
    assert set(sess.placement().by_device()) == {DEVICE}
    (part,) = _partitions(sess)
    assert part.info["precision"] == "f32" and part.info["device"] == "CPU"
    assert part.info["openvino"].startswith("20")


def test_transformer_layer_wholly_on_openvino():
    m = transformer_layer(seq=16, hidden=64, heads=4, ffn=128)
    x = np.random.default_rng(2).standard_normal((1, 16, 64)).astype(np.float32)
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    _close(sess.run(None, {"x": x}), reference(m, {"x": x}), rtol=1e-4, atol=1e-4)
    assert set(sess.placement().by_device()) == {DEVICE}


def test_hf_bert_mixed_with_the_cpu():
    """int64 token ids and mask: the ids reach OpenVINO as Gather indices; the mask's own
    int64 arithmetic stays on the CPU (int64.py), with the reason."""
    path = os.path.join(DATA, "hf_bert_tiny.onnx")
    rng = np.random.default_rng(0)
    feeds = {
        "input_ids": rng.integers(0, 100, (2, 12)).astype(np.int64),
        "attention_mask": np.ones((2, 12), np.int64),
    }
    feeds["attention_mask"][1, 8:] = 0
    sess = anychip.load(path, devices=[DEVICE, "cpu"], cost_model=False)
    names = [i.name for i in sess.inputs]
    feeds = {k: v for k, v in feeds.items() if k in names}
    ref = ort.InferenceSession(path).run(None, feeds)
    _close(sess.run(None, feeds), ref, rtol=1e-4, atol=1e-4)
    report = sess.placement()
    by = report.by_device()
    assert by[DEVICE] > 3 * by.get("cpu", 0), by
    on_cpu = [n for n in report.nodes if n.device == "cpu"]
    assert any("int64" in n.reason for n in on_cpu), [n.reason for n in on_cpu]


def test_an_op_left_out_is_placed_on_the_cpu_and_matches():
    """ReduceMax (left out: OpenVINO gives -3.4e38 for a row of -inf) between two OpenVINO
    partitions, on a masked row: three partitions, -inf where onnxruntime has it."""
    rng = np.random.default_rng(3)
    f = TensorProto.FLOAT
    n = helper.make_node
    m = model(
        [
            n("MatMul", ["x", "w1"], ["a"]),
            n("Add", ["a", "mask"], ["b"]),
            n("ReduceMax", ["b"], ["c"], axes=[1], keepdims=1),
            n("Sub", ["b", "c"], ["y"]),
        ],
        [("x", f, [4, 8]), ("mask", f, [4, 8])],
        [("c", f, [4, 1]), ("y", f, [4, 8])],
        [weight(rng, "w1", 8, 8)],
        opset=13,
    )
    mask = np.zeros((4, 8), np.float32)
    mask[2] = -np.inf
    feeds = {"x": rng.standard_normal((4, 8)).astype(np.float32), "mask": mask}
    sess = anychip.load(m, devices=[DEVICE, "cpu"], cost_model=False)
    got = sess.run(None, feeds)
    ref = reference(m, feeds)
    assert got[0][2, 0] == -np.inf == ref[0][2, 0]
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    report = sess.placement()
    (rmax,) = [r for r in report.nodes if r.op_type == "ReduceMax"]
    assert rmax.device == "cpu" and "not among the ops claimed" in rmax.reason
    assert len(_partitions(sess)) == 2


def test_dynamic_batch_compiles_once(monkeypatch):
    from anychip.backends.openvino import compiler

    calls = []
    real = compiler.compile_partition

    def counting(*args, **kwargs):
        calls.append(args[0].name)
        return real(*args, **kwargs)

    monkeypatch.setattr(compiler, "compile_partition", counting)
    m = cnn(batch="N")
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    rng = np.random.default_rng(4)
    for batch in (1, 3, 5, 3):
        x = rng.standard_normal((batch, 3, 16, 16)).astype(np.float32)
        got = sess.run(None, {"x": x})
        assert got[0].shape == (batch, 10)
        _close(got, reference(m, {"x": x}))
    assert len(calls) == 1


def test_bf16_is_opt_in_reported_and_within_bf16_tolerance(ov_cpu):
    m = transformer_layer(seq=16, hidden=64, heads=4, ffn=128)
    x = np.random.default_rng(5).standard_normal((1, 16, 64)).astype(np.float32)
    ref = reference(m, {"x": x})[0]
    f32 = anychip.load(m, devices=[DEVICE], strict=True)
    # device names and their device_options keys are case-insensitive
    bf16 = anychip.load(
        m,
        devices=["openvino:CPU"],
        strict=True,
        device_options={"openvino:CPU": {"precision": "bf16"}},
    )
    err32 = np.abs(f32.run(None, {"x": x})[0] - ref).max()
    err16 = np.abs(bf16.run(None, {"x": x})[0] - ref).max()
    (p32,) = _partitions(f32)
    (p16,) = _partitions(bf16)
    assert p32.info["precision"] == "f32" and err32 < 1e-4
    from anychip.backends.openvino import driver

    caps = driver.properties("CPU")["OPTIMIZATION_CAPABILITIES"]
    if "BF16" not in caps:
        pytest.skip(f"this CPU computes no bf16 (OpenVINO lists {caps}); f32 was checked")
    assert p16.info["precision"] == "bf16"
    assert err16 > err32  # it really computed in bf16...
    np.testing.assert_allclose(bf16.run(None, {"x": x})[0], ref, rtol=0.05, atol=0.05)


def test_runs_from_several_threads_each_get_their_own_request():
    m = cnn(batch="N")
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    rng = np.random.default_rng(6)
    inputs = [rng.standard_normal((b, 3, 16, 16)).astype(np.float32) for b in (1, 2, 3, 4)]
    expected = [reference(m, {"x": x}) for x in inputs]
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for _ in range(15):
                _close(sess.run(None, {"x": inputs[i]}), expected[i])
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_feeds_are_not_written():
    f = TensorProto.FLOAT
    n = helper.make_node
    m = model(
        [n("Relu", ["x"], ["r"]), n("Add", ["r", "x"], ["y"])], [("x", f, [64])], [("y", f, [64])]
    )
    x = np.random.default_rng(7).standard_normal(64).astype(np.float32)
    kept = x.copy()
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    for _ in range(3):
        _close(sess.run(None, {"x": x}), reference(m, {"x": kept}))
    assert np.array_equal(x, kept)


def test_scalar_and_strided_inputs():
    f = TensorProto.FLOAT
    n = helper.make_node
    m = model([n("Mul", ["x", "s"], ["y"])], [("x", f, [3, 4]), ("s", f, [])], [("y", f, [3, 4])])
    base = np.random.default_rng(8).standard_normal((4, 6)).astype(np.float32)
    feeds = {"x": base.T[::2, ::1][:3, :4], "s": np.array(1.5, np.float32)}
    sess = anychip.load(m, devices=[DEVICE], strict=True)
    _close(
        sess.run(None, feeds), reference(m, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    )
