"""Fused element-wise chains on array-API devices: the CPU's fusion pass on the ``strict``
device's partitions (the family's FusedElementwise evaluated with standard functions), and
the CUDA path's launch (one generated kernel) with a stand-in for CuPy's RawKernel."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from tests.backends.opencl.test_fused import _chain


@pytest.mark.parametrize("bshape", [(2, 8, 5, 6), (8, 1, 1), (1,), (2, 1, 5, 1)])
def test_a_chain_is_one_fused_node_on_the_strict_device(strict, bshape):
    model = _chain(bshape)
    rng = np.random.default_rng(0)
    feeds = {
        "x": (rng.standard_normal((2, 8, 5, 6)) * 3).astype(np.float32),
        "z": rng.standard_normal(6).astype(np.float32),
    }
    feeds["x"][0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    (ref,) = ort.InferenceSession(model).run(None, feeds)
    sess = anychip.load(model, devices=["strict"], strict=True)
    (got,) = sess.run(None, feeds)
    # erf is the family's float32 approximation (below 2 ulp)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    (part,) = sess.compiled.partitions
    assert part.device == "strict" and part.info["fusions"] == {"fuse_elementwise": 1}
    assert [n.op_type for n in part.graph.nodes] == ["FusedElementwise"]


def test_a_comparison_and_select_on_the_strict_device(strict):
    g = helper.make_graph(
        [
            helper.make_node("LeakyRelu", ["x"], ["l"], alpha=0.1),
            helper.make_node("Mul", ["l", "x"], ["m"]),
            helper.make_node("Add", ["m", "c"], ["y"]),
        ],
        "leaky",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
        [numpy_helper.from_array(np.float32([0.5] * 7).reshape(7), "c")],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    (ref,) = ort.InferenceSession(model).run(None, {"x": x})
    sess = anychip.load(model, devices=["strict"], strict=True)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref, rtol=1e-6, atol=1e-7)


class _RecordingKernel:
    """Stands in for ``cupy.RawKernel``: records the source and the launch."""

    made: list = []

    def __init__(self, source: str, name: str) -> None:
        self.source, self.name, self.calls = source, name, []
        _RecordingKernel.made.append(self)

    def __call__(self, grid, block, args) -> None:
        self.calls.append((grid, block, args))


def test_the_cuda_launch_builds_one_kernel_per_layout_and_passes_the_layout():
    """What ``backends/cuda/fused.launch`` hands CuPy: the CUDA emitter's source, a grid over
    every output element, ``outer``/``inner``, the inputs, one modulus per per-channel input
    and the output (numpy stands in for CuPy's arrays; the kernel itself needs a GPU)."""
    from types import SimpleNamespace

    from anychip.backends.cuda import fused

    cp = SimpleNamespace(
        RawKernel=_RecordingKernel,
        ascontiguousarray=np.ascontiguousarray,
        broadcast_to=np.broadcast_to,
        empty=np.empty,
    )
    x = np.zeros((2, 8, 5, 6), np.float32)
    b = np.zeros((8, 1, 1), np.float32)
    expr = "add(mul(in0, sigmoid(in0)), in1)"
    _RecordingKernel.made.clear()
    for _ in range(2):
        out = fused.launch(cp, expr, (x, b))
    (k,) = _RecordingKernel.made  # built once
    assert k.name == "anychip_fused" and "__global__" in k.source and "r1 = in1[o % m1]" in k.source
    assert len(k.calls) == 2
    grid, block, args = k.calls[-1]
    n = x.size
    assert block == (fused.BLOCK,) and grid == (-(-n // fused.BLOCK),)
    outer, inner, a0, a1, m1, o = args
    assert (int(outer), int(inner), int(m1)) == (16, 30, 8)
    assert a0 is x and a1 is b and o is out and out.shape == x.shape


def test_the_cuda_table_runs_chains_as_one_generated_kernel_and_others_use_the_family(strict):
    """The CUDA backend overrides the family's FusedElementwise in its own table (no CuPy
    test in the family kernel); every other array-API backend keeps the family's."""
    from anychip.backends.cuda.backend import CudaBackend
    from anychip.backends.cuda.probe import GpuInfo
    from anychip.ir import DType

    def fused_module(backend) -> str:
        k = backend.kernel_table().lookup("anychip", "FusedElementwise", 1, DType.FLOAT).kernel
        return k.fn.__wrapped__.__module__

    cuda = CudaBackend("cuda:0", GpuInfo(0, "x", 1 << 30, 10, 1_000_000, 1_000_000, 256, (8, 0)))
    assert fused_module(cuda) == "anychip.backends.cuda.fused"
    assert fused_module(strict) == "anychip.backends.arrayapi.family.op_fused"
