"""Small models for the fusion tests: built with onnx.helper, seeded random weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import anychip

F = TensorProto.FLOAT


def model(nodes, inputs, outputs, inits=(), opset=17) -> onnx.ModelProto:
    """A checked model; ``inputs``/``outputs``: ``(name, shape)``; ``inits``: ``(name, array)``."""
    graph = helper.make_graph(
        nodes,
        "fusion_case",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, F, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m, full_check=True)
    return m


def rand(seed: int, *shape: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check(m: onnx.ModelProto, seed: int = 0, **device_options) -> dict:
    """Run ``m`` fused, unfused and on onnxruntime; assert equal results; return the fused
    session's fusion counts (partition info)."""
    data = m.SerializeToString()
    feeds = {
        i.name: rand(seed + k, *[d.dim_value for d in i.type.tensor_type.shape.dim])
        for k, i in enumerate(m.graph.input)
    }
    fused = anychip.load(
        data, "cpu", device_options={"cpu": device_options} if device_options else None
    )
    plain = anychip.load(data, "cpu", device_options={"cpu": {"fusion": False}})
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    got_fused, got_plain = fused.run(None, feeds), plain.run(None, feeds)
    assert "fusions" not in plain.partitions[0].info
    for a, b, r in zip(got_fused, got_plain, want):
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    counts = {}
    for p in fused.partitions:
        for k, v in p.info.get("fusions", {}).items():
            counts[k] = counts.get(k, 0) + v
    return counts


def ops(m: onnx.ModelProto, **device_options) -> list[str]:
    """The op types of the compiled CPU partition."""
    s = anychip.load(m.SerializeToString(), "cpu", device_options={"cpu": device_options} or None)
    return [n.op_type for p in s.partitions for n in p.graph.nodes]


def heads_nodes(scale_op: str = "Div", mask: bool = True, out: str = "o3") -> list:
    """An exporter's multi-head attention from ``q4``, ``k4``, ``v4`` (``[B, S, H, D]``): the
    heads split (``[0, 2, 1, 3]``, the keys ``[0, 2, 3, 1]``), scaled by ``c``, masked by
    ``mask``, softmax, times the values, the heads merged by ``shape3`` into ``out``."""
    h = helper.make_node
    nodes = [
        h("Transpose", ["q4"], ["q"], perm=[0, 2, 1, 3]),
        h("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
        h("Transpose", ["v4"], ["v"], perm=[0, 2, 1, 3]),
        h("MatMul", ["q", "kt"], ["s"]),
        h(scale_op, ["s", "c"], ["ss"]),
    ]
    nodes += [h("Add", ["ss", "mask"], ["sm"])] if mask else []
    return nodes + [
        h("Softmax", ["sm" if mask else "ss"], ["p"], axis=-1),
        h("MatMul", ["p", "v"], ["o"]),
        h("Transpose", ["o"], ["o2"], perm=[0, 2, 1, 3]),
        h("Reshape", ["o2", "shape3"], [out]),
    ]


def force_fuse_conv(monkeypatch) -> None:
    """FusedConv fusion on even with the numpy FusedConv kernel (``require_fast_kernel``)."""
    from anychip.backends.cpu.passes.fuse_conv import FuseConvPass

    monkeypatch.setattr(FuseConvPass, "require_fast_kernel", False)


def force_fuse_gemm(monkeypatch) -> None:
    """FusedGemm fusion on even with the numpy FusedGemm kernel (``require_fast_kernel``)."""
    from anychip.backends.cpu.passes.fuse_gemm import FuseGemmPass

    monkeypatch.setattr(FuseGemmPass, "require_fast_kernel", False)
