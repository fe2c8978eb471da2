"""0-d tensors keep rank 0 through every backend's compile and copies (issue 47): a Gather with
a scalar index (every pooler's ``x[:, 0]``, BART's ``x[..., -1]``), a 0-d graph input and a
reduction to a 0-d output that cross between the device and the host."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip

F = TensorProto.FLOAT
#: Each device with the CPU for what it does not run (the xpu has no Gather, the NPU no
#: ReduceSum over every axis); failover off, so a device that fails is an error.
DEVICE_SETS = ["cpu", "npu,cpu", "opencl,cpu", "xpu,cpu", "ort:cpu,cpu", "openvino:cpu,cpu"]


def _model(index: int, axis: int) -> onnx.ModelProto:
    """``y = (x + k)[index along axis] * s``, ``total = ReduceSum(x + k)`` (0-d) and
    ``twice = s + s`` (0-d in, 0-d out)."""
    rng = np.random.default_rng(100 + axis)
    k = rng.standard_normal((2, 5, 8)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["x", "k"], ["a"]),
        helper.make_node("Gather", ["a", "i"], ["g"], axis=axis),
        helper.make_node("Mul", ["g", "s"], ["y"]),
        helper.make_node("ReduceSum", ["a"], ["total"], keepdims=0),
        helper.make_node("Add", ["s", "s"], ["twice"]),
    ]
    inits = [numpy_helper.from_array(k, "k"), numpy_helper.from_array(np.array(index), "i")]
    graph = helper.make_graph(
        nodes,
        "pool",
        [
            helper.make_tensor_value_info("x", F, [2, 5, 8]),
            helper.make_tensor_value_info("s", F, []),
        ],
        [helper.make_tensor_value_info(n, F, None) for n in ("y", "total", "twice")],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("devices", DEVICE_SETS)
@pytest.mark.parametrize(
    ("index", "axis"), [(0, 1), (-1, 2), (1, 0)], ids=["x[:,0]", "x[...,-1]", "x[1]"]
)
def test_scalar_gather_and_0d_values_keep_rank_0(devices: str, index: int, axis: int) -> None:
    ort = pytest.importorskip("onnxruntime")
    names = devices.split(",")
    available = {d.name for d in anychip.devices() if d.available}
    if not set(names) <= available:
        pytest.skip(f"{devices} not available here")
    model = _model(index, axis)
    rng = np.random.default_rng(axis)
    feeds = {
        "x": rng.standard_normal((2, 5, 8)).astype(np.float32),
        "s": np.array(rng.standard_normal(), np.float32),
    }
    want = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    sess = anychip.load(
        model,
        devices=names,
        failover=False,
        cost_model=False,
        background_compile=False,
    )
    placed = {n.name: n.device for n in sess.placement().nodes}
    if names[0] != "xpu":
        assert placed["Gather_1"] == names[0], str(sess.placement())
    assert names[0] in placed.values(), str(sess.placement())
    for _ in range(2):
        got = sess.run(None, feeds)
        for g, w, name in zip(got, want, ("y", "total", "twice"), strict=True):
            assert g.shape == w.shape, f"{name} on {devices}: {g.shape} != {w.shape}"
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5, err_msg=f"{name} on {devices}")


def test_helpers_that_copy_keep_rank_0() -> None:
    """``np.ascontiguousarray`` makes a 0-d array 1-d: the pass helper that makes constants
    and the ``OrtValue`` made of a host array kept shape (1,) for a scalar."""
    from anychip.ir.graph import Graph
    from anychip.ir.passes.rewrite import Names, constant

    graph = Graph(name="g")
    made = constant(graph, Names(graph), "c", np.array(2.5, np.float32))
    assert made.const.shape == () and made.shape == ()
    pytest.importorskip("onnxruntime")
    from anychip.backends.ort.values import to_ort_value

    assert to_ort_value(np.array(7, np.int64)).shape() == []
