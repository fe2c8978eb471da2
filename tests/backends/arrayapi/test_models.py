"""Small CNN and transformer blocks (seeded random weights) on array-API backends against
onnxruntime: on the test-only ``strict`` device, and on NumPy's namespace wrapped as a backend
in one line (what the docs show for PyTorch on ``mps``). Every node must run on the device."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import anychip
from anychip.backends.arrayapi import ArrayAPIBackend, register_backend
from anychip.core.plugin.host import unregister_plugin

RNG = np.random.default_rng(11)


def _w(name: str, *shape: int, scale: float = 0.3) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(
        (RNG.standard_normal(shape) * scale).astype(np.float32), name
    )


def _i64(name: str, values: list[int]) -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.asarray(values, np.int64), name)


def cnn() -> tuple[bytes, dict[str, np.ndarray]]:
    """Conv 3x3 stride 2 + BN + Relu, 1x1 Conv, grouped Conv, MaxPool, AveragePool, global
    pool, Flatten, Gemm, Softmax."""
    var = onnx.numpy_helper.from_array(RNG.uniform(0.5, 1.5, 8).astype(np.float32), "var")
    nodes = [
        h.make_node(
            "Conv",
            ["x", "w1", "b1"],
            ["c1"],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        ),
        h.make_node("BatchNormalization", ["c1", "g", "be", "mu", "var"], ["n1"]),
        h.make_node("Relu", ["n1"], ["r1"]),
        h.make_node("Conv", ["r1", "w2"], ["c2"]),
        h.make_node(
            "Conv", ["c2", "w3"], ["c3"], group=4, kernel_shape=[3, 3], auto_pad="SAME_UPPER"
        ),
        h.make_node("MaxPool", ["c3"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1),
        h.make_node("AveragePool", ["p1"], ["p2"], kernel_shape=[2, 2], pads=[1, 1, 0, 0]),
        h.make_node("GlobalAveragePool", ["p2"], ["gp"]),
        h.make_node("Flatten", ["gp"], ["f"]),
        h.make_node("Gemm", ["f", "wf", "bf"], ["logits"], transB=1),
        h.make_node("Softmax", ["logits"], ["y"]),
    ]
    inits = [
        _w("w1", 8, 3, 3, 3),
        _w("b1", 8),
        _w("g", 8),
        _w("be", 8),
        _w("mu", 8),
        var,
        _w("w2", 8, 8, 1, 1),
        _w("w3", 8, 2, 3, 3),
        _w("wf", 5, 8),
        _w("bf", 5),
    ]
    g = h.make_graph(
        nodes,
        "cnn",
        [h.make_tensor_value_info("x", T.FLOAT, [2, 3, 17, 15])],
        [h.make_tensor_value_info("y", T.FLOAT, [2, 5])],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    return m.SerializeToString(), {"x": RNG.standard_normal((2, 3, 17, 15)).astype(np.float32)}


def encoder() -> tuple[bytes, dict[str, np.ndarray]]:
    """One attention head block: projections, scaled scores with a mask, Softmax, residual,
    LayerNormalization, Gelu MLP, Gather of embeddings, Slice, Concat, Where, Cast."""
    nodes = [
        h.make_node("Gather", ["emb", "ids"], ["e"]),
        h.make_node("MatMul", ["e", "wq"], ["q"]),
        h.make_node("MatMul", ["e", "wk"], ["k"]),
        h.make_node("MatMul", ["e", "wv"], ["v"]),
        h.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        h.make_node("MatMul", ["q", "kt"], ["s0"]),
        h.make_node("Mul", ["s0", "scale"], ["s1"]),
        h.make_node("Cast", ["mask"], ["mb"], to=T.BOOL),
        h.make_node("Where", ["mb", "s1", "neg"], ["s2"]),
        h.make_node("Softmax", ["s2"], ["p"], axis=-1),
        h.make_node("MatMul", ["p", "v"], ["a"]),
        h.make_node("Add", ["a", "e"], ["r"]),
        h.make_node("LayerNormalization", ["r", "ln_g", "ln_b"], ["n"], axis=-1),
        h.make_node("MatMul", ["n", "w1"], ["m1"]),
        h.make_node("Gelu", ["m1"], ["m2"]),
        h.make_node("Slice", ["m2", "st", "en", "ax"], ["m3"]),
        h.make_node("Concat", ["m3", "m3"], ["m4"], axis=-1),
        h.make_node("Reshape", ["m4", "shp"], ["y"]),
    ]
    inits = [
        _w("emb", 50, 16, scale=1.0),
        _w("wq", 16, 16),
        _w("wk", 16, 16),
        _w("wv", 16, 16),
        onnx.numpy_helper.from_array(np.float32(0.25), "scale"),
        onnx.numpy_helper.from_array(np.float32(-1e9), "neg"),
        _w("ln_g", 16),
        _w("ln_b", 16),
        _w("w1", 16, 32),
        _i64("st", [4]),
        _i64("en", [20]),
        _i64("ax", [2]),
        _i64("shp", [2, -1]),
    ]
    g = h.make_graph(
        nodes,
        "enc",
        [
            h.make_tensor_value_info("ids", T.INT64, [2, 7]),
            h.make_tensor_value_info("mask", T.INT64, [2, 1, 7]),
        ],
        [h.make_tensor_value_info("y", T.FLOAT, None)],
        inits,
    )
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 20)])
    mask = (RNG.uniform(size=(2, 1, 7)) > 0.3).astype(np.int64)
    return m.SerializeToString(), {"ids": RNG.integers(0, 50, (2, 7)), "mask": mask}


@pytest.fixture(scope="module")
def numpy_backend():
    """NumPy's namespace as a backend (used only when named, so no other test sees it)."""
    backend = ArrayAPIBackend("np-xp", np, host_link=1e10, auto_select=False)
    name = register_backend(backend, name="test-np-xp")
    yield "np-xp"
    unregister_plugin(name)


@pytest.mark.parametrize("build", [cnn, encoder])
@pytest.mark.parametrize("device", ["strict", "np-xp"])
def test_model_runs_on_the_device_like_onnxruntime(build, device, strict, numpy_backend):
    model, feeds = build()
    backend = anychip.core.plugin.host.get_registry().backends[device]
    stats = backend.memory_stats()
    before = stats.in_use if stats is not None else 0
    sess = anychip.load(model, devices=[device, "cpu"], cost_model=False, optimize=False)
    counts = sess.placement().by_device()
    assert set(counts) == {device}, str(sess.placement())
    (got,) = sess.run(None, feeds)
    (want,) = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    del sess
    gc.collect()
    assert backend.memory_stats().in_use == before  # every device tensor released


def _block(dtype: int, np_dtype: type) -> bytes:
    """MatMul + Add + LayerNormalization + Gelu + Softmax in ``dtype``, weights seeded."""
    rng = np.random.default_rng(5)

    def w(name: str, *shape: int) -> onnx.TensorProto:
        return onnx.numpy_helper.from_array(
            (rng.standard_normal(shape) * 0.3).astype(np.float16).astype(np_dtype), name
        )

    nodes = [
        h.make_node("MatMul", ["x", "w"], ["a"]),
        h.make_node("Add", ["a", "b"], ["c"]),
        h.make_node("LayerNormalization", ["c", "g", "be"], ["n"], axis=-1),
        h.make_node("Gelu", ["n"], ["e"]),
        h.make_node("Softmax", ["e"], ["y"], axis=-1),
    ]
    g = h.make_graph(
        nodes,
        "blk",
        [h.make_tensor_value_info("x", dtype, [4, 8])],
        [h.make_tensor_value_info("y", dtype, [4, 16])],
        [w("w", 8, 16), w("b", 16), w("g", 16), w("be", 16)],
    )
    return h.make_model(g, opset_imports=[h.make_opsetid("", 20)]).SerializeToString()


def test_float16_block_on_numpys_namespace(numpy_backend):
    """float16 end to end (array-api-strict has no float16; NumPy's namespace has), against
    onnxruntime on the same weights in float32, within float16's precision."""
    x = np.random.default_rng(6).standard_normal((4, 8)).astype(np.float32)
    sess = anychip.load(
        _block(T.FLOAT16, np.float16), devices=[numpy_backend, "cpu"], cost_model=False
    )
    assert sess.placement().by_device() == {numpy_backend: 5}
    (got,) = sess.run(None, {"x": x.astype(np.float16)})
    ref = ort.InferenceSession(_block(T.FLOAT, np.float32), providers=["CPUExecutionProvider"])
    (want,) = ref.run(None, {"x": x.astype(np.float16).astype(np.float32)})
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=2e-3)
