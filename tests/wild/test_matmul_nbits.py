"""com.microsoft MatMulNBits (onnxruntime's runtime_optimization/matmulnbits_add.onnx) against
onnxruntime's kernel, on seeded random weights packed as its spec says."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

from tests.wild._compare import anychip_run, assert_same, ort_run


def _pack(values: np.ndarray, bits: int) -> np.ndarray:
    """Pack the last axis of ``values`` (< 2**bits) into bytes, low bits first."""
    per = 8 // bits
    v = values.astype(np.uint8).reshape(*values.shape[:-1], -1, per)
    return np.bitwise_or.reduce(v << (np.arange(per, dtype=np.uint8) * bits), axis=-1)


def _model(k: int, n: int, bits: int, block: int, zp: str, bias: bool, seed: int):
    rng = np.random.default_rng(seed)
    k_blocks = -(-k // block)
    q = rng.integers(0, 1 << bits, (n, k_blocks, block))
    b = _pack(q, bits)
    scales = rng.uniform(0.01, 0.1, (n, k_blocks)).astype(np.float32)
    inits = [nh.from_array(b, "B"), nh.from_array(scales.reshape(-1), "scales")]
    inputs = ["A", "B", "scales"]
    if zp == "packed":
        zps = rng.integers(0, 1 << bits, (n, k_blocks))
        per = 8 // bits
        zps = np.pad(zps, ((0, 0), (0, -k_blocks % per)))
        inits.append(nh.from_array(_pack(zps, bits).reshape(-1), "zp"))
        inputs.append("zp")
    elif zp == "float":
        inits.append(
            nh.from_array(rng.uniform(0, 1 << bits, (n * k_blocks,)).astype(np.float32), "zp")
        )
        inputs.append("zp")
    if bias:
        inputs += [""] * (4 - len(inputs)) + ["", "bias"]
        inits.append(nh.from_array(rng.standard_normal(n).astype(np.float32), "bias"))
    node = helper.make_node(
        "MatMulNBits", inputs, ["Y"], domain="com.microsoft", K=k, N=n, bits=bits, block_size=block
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3, n])],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets, ir_version=8)
    return model, rng.standard_normal((2, 3, k)).astype(np.float32)


@pytest.mark.parametrize(
    "k, n, bits, block, zp, bias",
    [
        (64, 8, 4, 32, "none", False),
        (40, 5, 4, 16, "packed", True),  # K not a multiple of the block; odd block count
        (64, 6, 4, 16, "float", False),
        (48, 4, 8, 16, "packed", True),
        (32, 3, 8, 32, "none", False),
    ],
)
def test_matmul_nbits_as_onnxruntime(k, n, bits, block, zp, bias) -> None:
    model, a = _model(k, n, bits, block, zp, bias, seed=k + n + bits)
    want = ort_run(model, {"A": a})
    got, _ = anychip_run(model, {"A": a})
    assert_same(got, want, rtol=1e-4, atol=1e-4)


def test_unsupported_width_refused_with_what_to_do() -> None:
    import anychip

    model, a = _model(32, 2, 4, 16, "none", False, seed=1)
    for attr in model.graph.node[0].attribute:
        if attr.name == "bits":
            attr.i = 3
    sess = anychip.load(model, devices=["cpu"])
    with pytest.raises(anychip.AnychipError, match="bits=3 is not supported"):
        sess.run(None, {"A": a})


def test_matmul_nbits_is_a_known_com_microsoft_op() -> None:
    from anychip.opsets.com_microsoft import com_microsoft_schemas

    names = {s.name: s for s in com_microsoft_schemas()}
    assert set(names["MatMulNBits"].attributes) >= {"K", "N", "bits", "block_size"}
