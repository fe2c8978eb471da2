"""QDQ MatMul/Gemm fused into an integer product (``passes/fuse_qdq_matmul.py``,
``kernels/op_dequant_matmul.py``): the same results as onnxruntime, which fuses them too."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn.int8 import exact_here

RNG = np.random.default_rng(5)


def _qdq_model(op: str, per_channel: bool, trans_b: bool, bias: bool) -> bytes:
    k, n = 256, 96
    wq = RNG.integers(-127, 128, (n, k) if trans_b else (k, n), dtype=np.int8)
    sw = (RNG.random(n) * 0.02 + 0.005).astype(np.float32) if per_channel else np.float32(0.01)
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(np.asarray(sw, np.float32), "sw"),
        numpy_helper.from_array(np.zeros(np.shape(sw), np.int8), "zw"),
        numpy_helper.from_array(np.array(0.05, np.float32), "sx"),
        numpy_helper.from_array(np.array(128, np.uint8), "zx"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"], axis=(0 if trans_b else 1)),
    ]
    if op == "MatMul":
        nodes.append(helper.make_node("MatMul", ["xd", "w"], ["y"]))
    else:
        ins = ["xd", "w"] + (["c"] if bias else [])
        if bias:
            inits.append(numpy_helper.from_array(RNG.standard_normal(n).astype(np.float32), "c"))
        nodes.append(helper.make_node("Gemm", ins, ["y"], transB=int(trans_b)))
    graph = helper.make_graph(
        nodes, "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, n])],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(
    "op,per_channel,trans_b,bias",
    [
        ("MatMul", False, False, False),
        ("MatMul", True, False, False),
        ("Gemm", False, True, True),
        ("Gemm", True, True, True),
        ("Gemm", True, False, False),
    ],
)
def test_qdq_products_match_onnxruntime(op, per_channel, trans_b, bias) -> None:
    model = _qdq_model(op, per_channel, trans_b, bias)
    x = RNG.standard_normal((64, 256)).astype(np.float32) * 2
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    sess = anychip.load(model, ["cpu"])
    (got,) = sess.run(None, {"x": x})
    fusions = {}
    for p in sess.placement().partitions:
        fusions.update(p.info.get("fusions") or {})
    fired = fusions.get("fuse_qdq_matmul", 0)
    assert fired == (1 if exact_here() and _lib.findable() else 0), fusions
    # the integer product is exact; the scaling's float32 rounding differs from onnxruntime's
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4 * np.abs(want).max())
    (unfused,) = anychip.load(model, ["cpu"], optimize=False).run(None, {"x": x})
    np.testing.assert_allclose(got, unfused, rtol=1e-5, atol=1e-4 * np.abs(want).max())


def test_the_folded_weights_keep_their_integers() -> None:
    sess = anychip.load(_qdq_model("MatMul", True, False, False), ["cpu"])
    found = [
        v for p in sess.compiled.partitions for v in p.graph.initializers.values()
        if "dequantized" in v.meta
    ]  # fmt: skip
    (w,) = found
    meta = w.meta["dequantized"]
    assert meta["q"].dtype == np.int8 and meta["axis"] == 1 and meta["scale"].shape == (96,)
    np.testing.assert_allclose(w.const, meta["q"].astype(np.float32) * meta["scale"], rtol=1e-6)
