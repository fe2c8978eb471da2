"""The precision policy on the CPU (``SessionOptions.precision``, ``onednn/_math.py``):
bf16 products where the CPU has the instructions, float32 elsewhere, and never a primitive
shared between a float32 and a bf16 session of one process."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.features import bf16_math, summary
from anychip.backends.cpu.onednn import _lib
from anychip.errors import AnychipError

pytestmark = pytest.mark.skipif(not _lib.available(), reason="oneDNN is not installed")


def _mlp(seed: int = 0) -> tuple[bytes, dict[str, np.ndarray]]:
    """Two large MatMuls and a Gemm: products oneDNN takes (above its MIN_MACS)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((256, 512)).astype(np.float32) * 0.05
    w2 = rng.standard_normal((512, 256)).astype(np.float32) * 0.05
    w3 = rng.standard_normal((128, 256)).astype(np.float32) * 0.05
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["r1"]),
        helper.make_node("MatMul", ["r1", "w2"], ["h2"]),
        helper.make_node("Gemm", ["h2", "w3"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [128, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [128, 128])],
        [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.standard_normal((128, 256)).astype(np.float32)
    return model.SerializeToString(), {"x": x}


def _conv(seed: int = 1) -> tuple[bytes, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32) * 0.1
    b = rng.standard_normal(64).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"])],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64, 28, 28])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model.SerializeToString(), {"x": rng.standard_normal((2, 32, 28, 28), np.float32)}


def _rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("make", [_mlp, _conv])
def test_bf16_runs_bf16_where_the_cpu_can_and_stays_close(make) -> None:
    model, feeds = make()
    (ref,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    (fp32,) = anychip.load(model, ["cpu"]).run(None, feeds)
    sess = anychip.load(model, ["cpu"], precision="bf16")
    (bf16,) = sess.run(None, feeds)
    (again,) = sess.run(None, feeds)  # the replayed run: the same primitives
    np.testing.assert_array_equal(bf16, again)
    assert _rel_err(fp32, ref) < 1e-5
    info = " ".join(str(p.info.get("precision", "")) for p in sess.placement().partitions)
    able, _ = bf16_math()
    if able:  # bfloat16's 8-bit mantissa: ~4e-3 per product, far above float32's rounding
        assert "bf16 products" in info, info
        assert 1e-4 < _rel_err(bf16, ref) < 3e-2, (summary(), _rel_err(bf16, ref))
    else:
        assert info.startswith("fp32"), info
        assert _rel_err(bf16, ref) < 1e-5


def test_float32_and_bf16_sessions_share_no_primitive() -> None:
    model, feeds = _mlp(3)
    (first,) = anychip.load(model, ["cpu"]).run(None, feeds)
    anychip.load(model, ["cpu"], precision="bf16").run(None, feeds)
    (after,) = anychip.load(model, ["cpu"]).run(None, feeds)
    np.testing.assert_array_equal(first, after)


def test_the_default_is_float32_and_the_environment_sets_it(monkeypatch) -> None:
    model, feeds = _mlp(4)
    monkeypatch.setenv("ANYCHIP_PRECISION", "bf16")
    sess = anychip.load(model, ["cpu"])
    info = " ".join(str(p.info.get("precision", "")) for p in sess.placement().partitions)
    assert "bf16" in info
    monkeypatch.setenv("ANYCHIP_PRECISION", "fp64")
    with pytest.raises(AnychipError, match="ANYCHIP_PRECISION"):
        anychip.load(model, ["cpu"])


def test_an_unknown_precision_is_refused_by_name() -> None:
    model, _ = _mlp()
    with pytest.raises(AnychipError, match="precision must be one of fp32, bf16"):
        anychip.load(model, ["cpu"], precision="int4")
    with pytest.raises(AnychipError, match="precision"):
        anychip.SessionOptions(precision="half")


def test_the_features_name_the_cpu() -> None:
    text = summary()
    assert text.split(":")[0].strip()
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        flags = next((ln for ln in f if ln.startswith("flags")), "")
    assert ("amx_bf16" in flags) == bf16_math()[0]  # AVX-512 BF16 alone: oneDNN kept fp32


def test_an_onnx_model_round_trip_keeps_float32_tensors() -> None:
    model, feeds = _conv(5)
    out = anychip.load(model, ["cpu"], precision="bf16").run(None, feeds)
    assert out[0].dtype == np.float32
    assert onnx.load_from_string(model).graph.output[0].type.tensor_type.elem_type == 1
