"""Quantized linear layers fused into one kernel (``passes/fuse_qlinear_matmul_add.py``,
``kernels/op_qlinear_matmul_add.py``): onnxruntime's quantizer's QOperator and QDQ MLPs, the
same bits as the ops run one by one, within one step of onnxruntime."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import anychip
from anychip.backends.cpu.kernels import op_qlinear_matmul_add as fused_kernel
from anychip.backends.cpu.native import qlinear
from bench._wild_cases import _quantize_static
from bench._wild_models import mlp

pytestmark = pytest.mark.skipif(not qlinear.available(), reason="no C compiler here")
_PASS = "fuse_qlinear_matmul_add"


def _fusions(sess) -> dict:
    out: dict = {}
    for p in sess.placement().partitions:
        out.update(p.info.get("fusions") or {})
    return out


def _unfused(model):
    return anychip.load(model, ["cpu"], device_options={"cpu": {"disabled_passes": [_PASS]}})


@pytest.mark.parametrize("fmt", ["qoperator", "qdq"])
@pytest.mark.parametrize("act", ["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_mlp_layers_fuse(fmt, act, per_channel) -> None:
    model = _quantize_static(mlp(), fmt, act, per_channel)
    rng = np.random.default_rng(43)
    x = (rng.standard_normal((16, 32)) * 3).astype(np.float32)  # wide: saturates some codes
    sess = anychip.load(model, ["cpu"])
    (got,) = sess.run(None, {"x": x})
    if fmt == "qdq" and not _fusions(sess).get("fuse_qdq_matmul"):
        pytest.skip("no DequantMatMul here (fuse_qdq_matmul needs VNNI or AMX)")
    assert _fusions(sess).get(_PASS) == 3, _fusions(sess)
    (again,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(again, got)  # the node's kept Product
    (one_by_one,) = _unfused(model).run(None, {"x": x})
    np.testing.assert_array_equal(got, one_by_one)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ref = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    (want,) = ref.run(None, {"x": x})
    step = 2 * max(  # the output's quantization step (a few codes may round the other way)
        float(np.abs(np.diff(np.unique(want))).min(initial=1.0)), 1e-6
    )
    assert np.abs(got - want).max() <= step
    assert np.mean(got == want) > 0.97


def test_fallback_without_the_c_is_the_same(monkeypatch) -> None:
    """The fused kernel with the C hidden after the fusion ran the replaced ops' kernels."""
    model = _quantize_static(mlp(), "qoperator", "u8", False)
    x = np.random.default_rng(1).standard_normal((16, 32)).astype(np.float32)
    sess = anychip.load(model, ["cpu"])
    assert _fusions(sess).get(_PASS) == 3
    (got,) = sess.run(None, {"x": x})
    monkeypatch.setattr(fused_kernel, "run_product", lambda *a, **k: None)
    (fallback,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(got, fallback)


def test_the_pass_leaves_other_readers_alone() -> None:
    """A QLinearMatMul whose output is also a graph output is not fused."""
    import onnx

    model = _quantize_static(mlp(), "qoperator", "u8", False)
    first = next(n for n in model.graph.node if n.op_type == "QLinearMatMul")
    out = onnx.helper.make_tensor_value_info(first.output[0], onnx.TensorProto.UINT8, None)
    model.graph.output.append(out)
    sess = anychip.load(model, ["cpu"])
    assert _fusions(sess).get(_PASS) == 2
    x = np.random.default_rng(2).standard_normal((16, 32)).astype(np.float32)
    got = sess.run(None, {"x": x})
    want = _unfused(model).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
