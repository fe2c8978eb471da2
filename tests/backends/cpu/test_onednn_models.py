"""oneDNN on whole models: the light ResNet-50 against onnxruntime, the numpy kernels with
oneDNN hidden (same answers), and the weight cache never serving stale weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.kernels.op_conv import conv as numpy_conv
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn.conv import conv as onednn_conv
from anychip.backends.cpu.onednn.kernels import RUNS
from tests.models import light

F = TensorProto.FLOAT


def _outputs(session: anychip.Session, feeds: dict) -> list[np.ndarray]:
    got = session.run(None, feeds)
    return [np.asarray(g) for g in (got.values() if isinstance(got, dict) else got)]


def _mixed_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Conv -> Relu -> MaxPool -> depthwise Conv -> GlobalAveragePool, and an LSTM and a GRU."""
    rng = np.random.default_rng(11)

    def r(*s: int, scale: float = 0.3) -> np.ndarray:
        return (rng.standard_normal(s) * scale).astype(np.float32)

    w = {
        "W1": r(16, 3, 3, 3),
        "B1": r(16),
        "W2": r(16, 1, 3, 3),
        "LW": r(1, 32, 8),
        "LR": r(1, 32, 8),
        "GW": r(2, 24, 8),
        "GR": r(2, 24, 8),
        "GB": r(2, 48),
    }
    nodes = [
        helper.make_node("Conv", ["X", "W1", "B1"], ["a"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["c", "W2"], ["d"], group=16, pads=[1, 1, 1, 1]),
        helper.make_node("GlobalAveragePool", ["d"], ["Y"]),
        helper.make_node("LSTM", ["S", "LW", "LR"], ["L", "Lh"], hidden_size=8),
        helper.make_node(
            "GRU", ["S", "GW", "GR", "GB"], ["G"], hidden_size=8, direction="bidirectional"
        ),
    ]
    feeds = {"X": r(1, 3, 16, 16, scale=1.0), "S": r(5, 2, 8, scale=1.0)}
    graph = helper.make_graph(
        nodes,
        "mixed",
        [helper.make_tensor_value_info(k, F, list(v.shape)) for k, v in feeds.items()],
        [helper.make_tensor_value_info(o, F, None) for o in ("Y", "L", "Lh", "G")],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return model, feeds


def test_hidden_onednn_runs_the_numpy_kernels_with_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    model, feeds = _mixed_model()
    so = ort.SessionOptions()
    want = ort.InferenceSession(model.SerializeToString(), so).run(None, feeds)
    assert _lib.available(), _lib.unavailable_reason()
    before = dict(RUNS)
    with_onednn = _outputs(anychip.load(model, devices=["cpu"]), feeds)
    used = {k: v - before.get(k, 0) for k, v in RUNS.items()}
    # a lone Conv read by other nodes runs as FusedConv (fuse_conv.FuseConvPass.lone)
    used["Conv", "onednn"] = used.get(("Conv", "onednn"), 0) + used.get(("FusedConv", "onednn"), 0)
    for op in ("Conv", "MaxPool", "GlobalAveragePool", "LSTM", "GRU"):
        assert used.get((op, "onednn"), 0) >= 1 and not used.get((op, "numpy")), op
    monkeypatch.setenv("ANYCHIP_ONEDNN", "0")
    _lib.reset()
    try:
        assert not _lib.available()
        assert "ANYCHIP_ONEDNN" in _lib.unavailable_reason()
        before = dict(RUNS)
        hidden = _outputs(anychip.load(model, devices=["cpu"]), feeds)
        used = {k: v - before.get(k, 0) for k, v in RUNS.items()}
        for op in ("Conv", "MaxPool", "GlobalAveragePool", "LSTM", "GRU"):
            assert used.get((op, "numpy"), 0) >= 1 and not used.get((op, "onednn")), op
    finally:
        monkeypatch.delenv("ANYCHIP_ONEDNN")
        _lib.reset()
    for a, b, c in zip(with_onednn, hidden, want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(a, c, rtol=1e-4, atol=1e-5)


def test_light_resnet50_matches_onnxruntime() -> None:
    model = light("resnet50", seed=1)
    name = model.graph.input[0].name
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {name: x})[0]
    before = RUNS["Conv", "onednn"] + RUNS["FusedConv", "onednn"]
    got = _outputs(anychip.load(model, devices=["cpu"]), {name: x})[0]
    # every one of the 53 convolutions through oneDNN, most fused with their Relu/residual
    assert RUNS["Conv", "onednn"] + RUNS["FusedConv", "onednn"] - before == 53
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)


def test_changed_weights_are_never_served_stale() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 8, 9, 9)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1]}
    for _ in range(2):  # a new array of the same shape each time
        w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
        got = onednn_conv(x, w, None, None, None, attrs)
        np.testing.assert_allclose(got, numpy_conv(x, w, **attrs), rtol=1e-4, atol=1e-4)
    w[...] = rng.standard_normal(w.shape)  # the same array changed in place
    got = onednn_conv(x, w, None, None, None, attrs)
    np.testing.assert_allclose(got, numpy_conv(x, w, **attrs), rtol=1e-4, atol=1e-4)


def test_a_missing_library_is_reported_with_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    missing = f"{tmp_path}/libdnnl.so.3"
    monkeypatch.setenv("ANYCHIP_ONEDNN_LIB", missing)
    _lib.reset()
    saved = _lib._state.pop("loaded", None)  # as in a process that never loaded it
    try:
        assert not _lib.findable() and not _lib.available()
        reason = _lib.unavailable_reason()
        assert missing in reason and "anychip[onednn]" in reason
    finally:
        monkeypatch.delenv("ANYCHIP_ONEDNN_LIB")
        _lib.reset()
        if saved is not None:
            _lib._state["loaded"] = saved
    assert _lib.available()


def test_dynamic_batch_alternating_planned_and_unplanned_runs() -> None:
    """A symbolic batch: a new shape runs before its memory plan exists (outputs unplanned, so
    a Conv feeding Relu -> GlobalAveragePool may write channels-last), the same shape later
    runs planned (NCHW into the plan). The cached reorders must not mix the two layouts (they
    did: the third run was off by 0.2)."""
    rng = np.random.default_rng(4)
    w = {"W": (rng.standard_normal((16, 3, 3, 3)) * 0.3).astype(np.float32)}
    nodes = [
        helper.make_node("Conv", ["X", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["Y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "dyn",
        [helper.make_tensor_value_info("X", F, ["N", 3, 12, 12])],
        [helper.make_tensor_value_info("Y", F, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = rng.random((9, 3, 12, 12), dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"X": x})[0]
    session = anychip.load(model, devices=["cpu"])
    for n in (9, 4, 9, 1, 4, 9):
        got = _outputs(session, {"X": x[:n]})[0]
        np.testing.assert_allclose(got, want[:n], rtol=1e-4, atol=1e-5, err_msg=f"batch {n}")


def test_a_node_remembers_its_simple_convolution_and_sees_rewritten_weights() -> None:
    """A channels-last convolution on one primitive is remembered by its node (``conv._Fast``):
    later calls give the first call's result, a new source gives the new answer, and the
    weights rewritten in place are prepared again."""
    from anychip.backends.cpu.onednn import conv as conv_mod
    from anychip.backends.cpu.onednn._prim import from_channels_last

    rng = np.random.default_rng(4)
    x = from_channels_last(rng.standard_normal((1, 9, 9, 8)).astype(np.float32))
    w = rng.standard_normal((4, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1]}
    memo: dict = {}
    first = onednn_conv(x, w, b, None, None, attrs, channels_last=True, memo=memo)
    assert isinstance(memo.get("fast"), conv_mod._Fast)
    want = numpy_conv(np.ascontiguousarray(x), w, b, **attrs)
    np.testing.assert_allclose(first, want, rtol=1e-4, atol=1e-4)
    again = onednn_conv(x, w, b, None, None, attrs, channels_last=True, memo=memo)
    np.testing.assert_array_equal(again, first)
    x2 = from_channels_last(rng.standard_normal((1, 9, 9, 8)).astype(np.float32))
    got = onednn_conv(x2, w, b, None, None, attrs, channels_last=True, memo=memo)
    want2 = numpy_conv(np.ascontiguousarray(x2), w, b, **attrs)
    np.testing.assert_allclose(got, want2, rtol=1e-4, atol=1e-4)
    w[...] = rng.standard_normal(w.shape)  # the same array changed in place
    got = onednn_conv(x2, w, b, None, None, attrs, channels_last=True, memo=memo)
    want3 = numpy_conv(np.ascontiguousarray(x2), w, b, **attrs)
    np.testing.assert_allclose(got, want3, rtol=1e-4, atol=1e-4)
    assert not np.allclose(want3, want2)


def test_a_remembered_convolution_adds_each_calls_residual() -> None:
    """A FusedConv with a residual Z on the remembered path adds the Z of each call (the sum
    post-op reads the destination the call fills with Z)."""
    from anychip.backends.cpu.onednn import conv as conv_mod
    from anychip.backends.cpu.onednn._prim import from_channels_last

    rng = np.random.default_rng(6)
    w = rng.standard_normal((5, 8, 3, 3)).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1]}
    x = from_channels_last(rng.standard_normal((1, 9, 9, 8)).astype(np.float32))
    memo: dict = {}
    for k in range(3):
        z = rng.standard_normal((1, 5, 9, 9)).astype(np.float32)
        got = onednn_conv(x, w, None, z, None, attrs, channels_last=True, memo=memo)
        assert isinstance(memo.get("fast"), conv_mod._Fast), k
        want = numpy_conv(np.ascontiguousarray(x), w, **attrs) + z
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("helper", [True, False])
def test_a_node_remembers_its_grouped_1x1_product_with_the_bias_pass(monkeypatch, helper) -> None:
    """ShuffleNet's grouped 1x1 convolution with bias and Relu into an NCHW buffer, read from a
    channels-last source, is remembered by its node (``conv1x1.Fast``, the bias and Relu as
    the generated pass looked up once, the primitive called directly where the C helper
    builds): every call equals the numpy kernel's result."""
    from anychip.backends.cpu.onednn import _parallel, conv1x1

    if not helper:
        monkeypatch.setattr(_parallel, "_helper", lambda: None)
    from anychip.backends.cpu.onednn._lib import C
    from anychip.backends.cpu.onednn._prim import from_channels_last

    rng = np.random.default_rng(5)
    w = (rng.standard_normal((24, 6, 1, 1)) * 0.3).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    attrs = {"group": 4}
    relu = (C.eltwise_relu, 0.0, 0.0)
    memo: dict = {}
    for k in range(3):  # the first call remembers; the next two take the remembered path
        x = from_channels_last(rng.standard_normal((1, 7, 9, 24)).astype(np.float32))
        out = np.full((1, 24, 7, 9), np.nan, np.float32)
        got = onednn_conv(x, w, b, None, relu, attrs, out=out, memo=memo)
        assert got is out and isinstance(memo.get("fast"), conv1x1.Fast), k
        assert (memo["fast"].direct is not None) is (helper and _parallel._helper() is not None)
        want = np.maximum(numpy_conv(np.ascontiguousarray(x), w, b, **attrs), 0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
