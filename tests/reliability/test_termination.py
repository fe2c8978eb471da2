"""Every pass terminates (issue 47): the NPU's NHWC conversion on ``Mul(const[C,1,1], x)``
with the constant first (ConvNeXt's layer norm), and the bound on every fixed-point rewrite."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import anychip
from anychip.backends.npu_stub.passes.convert_to_nhwc import ConvertToNhwcPass
from anychip.errors import AnychipError, PassLoopError
from anychip.ir.passes.base import fixed_point


def _layer_norm_scale(const_first: bool) -> onnx.ModelProto:
    """Conv, then ConvNeXt's channels-first scale and shift: ``g[C,1,1] * x + b[C,1,1]``."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    g = rng.standard_normal((8, 1, 1)).astype(np.float32)
    b = rng.standard_normal((8, 1, 1)).astype(np.float32)
    mul = ["g", "c"] if const_first else ["c", "g"]
    add = ["b", "m"] if const_first else ["m", "b"]
    nodes = [
        helper.make_node("Conv", ["x", "W"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Mul", mul, ["m"]),
        helper.make_node("Add", add, ["a"]),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((w, "W"), (g, "g"), (b, "b"))]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("const_first", [True, False], ids=["const-first", "const-second"])
def test_nhwc_conversion_ends_on_a_constant_first_mul(const_first: bool) -> None:
    """Before the fix the load never returned (the pass made and dropped a permuted constant
    every round); now the whole chain runs channels-last on the NPU, as onnxruntime computes."""
    ort = pytest.importorskip("onnxruntime")
    model = _layer_norm_scale(const_first)
    x = np.random.default_rng(5).standard_normal((1, 4, 8, 8)).astype(np.float32)
    sess = anychip.load(model, devices=["npu"], strict=True, background_compile=False)
    assert {n.device for n in sess.placement().nodes} == {"npu"}
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-4, atol=1e-4)


def test_fixed_point_names_the_pass_that_never_settles() -> None:
    rounds = []
    with pytest.raises(PassLoopError, match="'spin'.*after 5 rounds"):
        fixed_point("spin", lambda: rounds.append(1) or True, 5)
    assert len(rounds) == 5
    assert fixed_point("settles", iter([True, True, False]).__next__, 5) == 2


def test_a_pass_that_never_settles_moves_its_partition_to_the_cpu(
    monkeypatch: pytest.MonkeyPatch, no_compile_cache: None
) -> None:
    """A pass stuck in a loop (here the NHWC pass's cancel step always claiming a change) ends
    at its bound: the partition goes to the CPU with the pass named as the reason, and a
    strict session gets the error."""
    monkeypatch.setattr(ConvertToNhwcPass, "_cancel", staticmethod(lambda graph: True))
    model = _layer_norm_scale(True)
    x = np.random.default_rng(6).standard_normal((1, 4, 8, 8)).astype(np.float32)
    sess = anychip.load(model, devices=["npu", "cpu"], background_compile=False, cost_model=False)
    report = str(sess.placement())
    assert "convert_to_nhwc" in report, report
    assert {n.device for n in sess.placement().nodes} == {"cpu"}
    want = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(AnychipError, match="convert_to_nhwc"):
        anychip.load(model, devices=["npu"], strict=True, background_compile=False)
