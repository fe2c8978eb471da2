"""oneDNN's int8 matmul for MatMulInteger, QLinearMatMul and QGemm (``onednn/int8.py``):
exact against int64 products and onnxruntime, declined where the sums could saturate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.cpu.onednn import _lib
from anychip.backends.cpu.onednn.int8 import exact_here, int_matmul

pytestmark = pytest.mark.skipif(not _lib.available(), reason="oneDNN is not installed")
RNG = np.random.default_rng(11)


def _ints(dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape, dtype=dtype)


def _onednn_exact() -> bool:
    """Whether oneDNN gives its int8 product here: the CPU has VNNI or AMX and oneDNN may use
    them (``ONEDNN_MAX_CPU_ISA=AVX2`` caps it below: every product is declined then)."""
    probe = int_matmul(np.ones((64, 1024), np.uint8), np.ones((1024, 64), np.int8))
    return exact_here() and probe is not None


def _reference(a, b, za, zb, trans_b=False) -> np.ndarray:
    b = b.T if trans_b else b
    za = 0 if za is None else np.asarray(za).astype(np.int64)
    zb = 0 if zb is None else np.asarray(zb).astype(np.int64)
    if np.ndim(za) == 1:
        za = za.reshape(-1, 1)
    return (a.astype(np.int64) - za) @ (b.astype(np.int64) - zb)


@pytest.mark.parametrize("adt", [np.uint8, np.int8])
@pytest.mark.parametrize("bdt", [np.int8, np.uint8])
@pytest.mark.parametrize("zps", ["none", "common", "per-row-and-column"])
@pytest.mark.parametrize("trans_b", [False, True])
def test_int_matmul_is_exact(adt, bdt, zps, trans_b) -> None:
    m, k, n = 48, 320, 96
    a, b = _ints(adt, (m, k)), _ints(bdt, (n, k) if trans_b else (k, n))
    za = zb = None
    if zps == "common":
        za, zb = np.array(_ints(adt, ())), np.array(_ints(bdt, ()))
    elif zps == "per-row-and-column":
        za, zb = _ints(adt, (m,)), _ints(bdt, (n,))
    y = int_matmul(a, b, za, zb, trans_b)
    if not _onednn_exact():  # no VNNI/AMX (or capped): declined, the caller's path runs
        assert y is None
        return
    assert y is not None and y.dtype == np.int32
    np.testing.assert_array_equal(y, _reference(a, b, za, zb, trans_b))
    again = int_matmul(a, b, za, zb, trans_b)  # the packed weights, from the cache
    np.testing.assert_array_equal(again, y)


def test_leading_axes_fold_into_rows_and_small_products_are_declined() -> None:
    a, b = _ints(np.uint8, (2, 3, 40, 256)), _ints(np.int8, (256, 64))
    y = int_matmul(a, b)
    if _onednn_exact():
        np.testing.assert_array_equal(y, a.astype(np.int64) @ b.astype(np.int64))
    assert int_matmul(_ints(np.uint8, (2, 8)), _ints(np.int8, (8, 4))) is None
    assert int_matmul(a.astype(np.int16), b) is None  # not 8-bit


def test_a_capped_isa_without_vnni_is_declined() -> None:
    """oneDNN capped at AVX-512 without VNNI would sum u8 x s8 pairs through a saturating
    16-bit add: the primitive it picks is refused, so the product goes to the float path."""
    code = (
        "import numpy as np; from anychip.backends.cpu.onednn.int8 import int_matmul;"
        "a = np.full((64, 512), 255, np.uint8); b = np.full((512, 64), 127, np.int8);"
        "print(int_matmul(a, b) is None)"
    )
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX512_CORE")
    root = Path(__file__).resolve().parents[3]
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
        cwd=str(root.parent),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def _model(nodes, inputs, outputs, inits, domain_ms=False) -> bytes:
    opsets = [helper.make_opsetid("", 17)]
    if domain_ms:
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    graph = helper.make_graph(nodes, "q", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def _compare(model: bytes, feeds: dict) -> None:
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = anychip.load(model, ["cpu"]).run(None, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
        else:  # requantized: at most one step where the float rounding ties differ
            assert np.abs(g.astype(np.int64) - w.astype(np.int64)).max() <= 1


def test_matmul_integer_against_onnxruntime() -> None:
    b = _ints(np.int8, (256, 128))
    model = _model(
        [helper.make_node("MatMulInteger", ["a", "b", "za"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [64, 128])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(131, np.uint8), "za")],
    )
    a = _ints(np.uint8, (64, 256))
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"a": a})
    (got,) = anychip.load(model, ["cpu"]).run(None, {"a": a})
    np.testing.assert_array_equal(got, want[0])


def test_qlinear_matmul_and_qgemm_against_onnxruntime() -> None:
    b = _ints(np.int8, (256, 128))
    scalars = {
        "sa": np.array(0.02, np.float32), "za": np.array(120, np.uint8),
        "sb": np.array(0.01, np.float32), "zb": np.array(0, np.int8),
        "sy": np.array(0.5, np.float32), "zy": np.array(128, np.uint8),
    }  # fmt: skip
    inits = [numpy_helper.from_array(v, k) for k, v in scalars.items()]
    inits.append(numpy_helper.from_array(b, "b"))
    a = _ints(np.uint8, (64, 256))
    qmm = _model(
        [helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [64, 128])],
        inits,
    )
    _compare(qmm, {"a": a})
    bt = np.ascontiguousarray(b.T)
    inits[-1] = numpy_helper.from_array(bt, "b")
    qgemm = _model(
        [
            helper.make_node(
                "QGemm", ["a", "sa", "za", "b", "sb", "zb"], ["y"], domain="com.microsoft",
                transB=1,
            )
        ],
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])],
        inits,
        domain_ms=True,
    )  # fmt: skip
    _compare(qgemm, {"a": a})
