"""CPU kernels of the ONNX long tail (part 1), checked against onnx's conformance node cases.

Every bundled ``onnx.backend.test`` node case made of the ops below runs twice: once by
calling the registered CPU kernel directly (attributes decoded and schema defaults filled the
way the runtime does), and once through ``anychip.load``, together with the function-expanded
multi-node variants. The cases come from the onnx package itself, so each expected output is
the spec's. Hand-written tests at the end pin behaviour the suite does not reach.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from anychip.backends.cpu.kernels import load_all
from anychip.backends.cpu.table import CPU_KERNELS
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import attribute_defaults, resolve
from tests.node_cases import NodeCase, assert_outputs_close, load_case, node_cases, run_case

TAIL1_OPS = (
    "ArgMax ArgMin BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BitCast Round Sign "
    "Acos Acosh Asin Asinh Atan Atanh Cos Cosh Sin Sinh Tan Celu Mish Shrink Softsign "
    "ThresholdedRelu Swish SwiGLU PRelu Compress CumSum CumProd DepthToSpace SpaceToDepth "
    "Einsum EyeLike GatherElements GatherND Scatter ScatterElements ScatterND TensorScatter "
    "Hardmax InstanceNormalization GroupNormalization RMSNormalization LpNormalization "
    "MeanVarianceNormalization IsInf IsNaN Mod NonZero OneHot Resize Upsample ReverseSequence "
    "TopK Trilu Unique Det ConvTranspose ConvInteger MatMulInteger QuantizeLinear "
    "DequantizeLinear DynamicQuantizeLinear QLinearConv QLinearMatMul LpPool MaxUnpool Col2Im "
    "CenterCropPad AffineGrid GridSample RoiAlign DeformConv NonMaxSuppression"
).split()


# Ops of other families that the function-expanded ("_expanded") cases of our ops use.
SUPPORT_OPS = (
    "Add And Cast CastLike Clip Concat Constant ConstantOfShape Div Equal Expand Gather "
    "Identity Less LessOrEqual MatMul Max Min Mul Neg Not Pad Range ReduceMax ReduceMean "
    "ReduceMin ReduceSum Reshape Shape Slice Softmax Sqrt Squeeze Sub Tanh Transpose Unsqueeze "
    "Where"
).split()


@functools.lru_cache(maxsize=1)
def _session_cases() -> tuple[NodeCase, ...]:
    """Cases using at least one of our ops (and otherwise only SUPPORT_OPS)."""
    support_only = {c.name for c in node_cases(SUPPORT_OPS)}
    return tuple(c for c in node_cases(TAIL1_OPS + SUPPORT_OPS) if c.name not in support_only)


def _direct_cases() -> list[NodeCase]:
    """The cases made of our ops alone (what a kernel called directly can run)."""
    return node_cases(TAIL1_OPS)


class _Ctx:
    """The part of the executor's KernelContext a kernel of this family reads."""

    def __init__(self, node: onnx.NodeProto) -> None:
        self.node = node
        self.num_outputs = len(node.output)


def _attr_value(a: onnx.AttributeProto) -> Any:
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [x.decode() for x in v]
    return v


def _as_array(v: Any) -> Any:
    """onnx keeps tensors of types without a classic numpy dtype (float8, int4) as protos."""
    return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v


def _run_direct(model: onnx.ModelProto, inputs: list[Any]) -> list[Any]:
    load_all()
    graph = model.graph
    node = graph.node[0]
    opset = {o.domain: o.version for o in model.opset_import}.get(node.domain, 1)
    schema = resolve(node.op_type, node.domain, opset)
    attrs = dict(attribute_defaults(schema))
    attrs.update({a.name: _attr_value(a) for a in node.attribute})
    env = {i.name: x for i, x in zip(graph.input, inputs)}
    args = [env[n] if n else None for n in node.input]
    dt = DType.from_numpy(args[0].dtype)
    match = CPU_KERNELS.lookup(node.domain, node.op_type, schema.since_version, dt)
    assert match, match.reason
    k = match.kernel
    out = k.fn(_Ctx(node), *args, **attrs) if k.context else k.fn(*args, **attrs)
    outs = list(out) if isinstance(out, tuple) else [out]
    env.update({n: o for n, o in zip(node.output, outs) if n})
    return [env[o.name] for o in graph.output]


@pytest.mark.parametrize("case", _direct_cases(), ids=repr)
def test_conformance_direct(case: NodeCase) -> None:
    """Each kernel, called as the executor calls it, reproduces the spec's outputs."""
    model, sets = load_case(case)
    for inputs, expected in sets:
        got = _run_direct(model, [_as_array(v) for v in inputs])
        assert_outputs_close(got, [_as_array(v) for v in expected], case.rtol, case.atol)


@pytest.mark.parametrize("case", _session_cases(), ids=repr)
def test_conformance_session(case: NodeCase) -> None:
    """The same cases, plus the function-expanded multi-node ones, through anychip.load."""
    run_case(case, devices=["cpu"])


def _kernel(op: str, version: int, dtype: DType | None = None) -> Any:
    load_all()
    match = CPU_KERNELS.lookup("", op, version, dtype)
    assert match, match.reason
    return match.kernel.fn


def test_topk_ties_keep_lower_index_for_unsigned_largest() -> None:
    x = np.array([3, 7, 7, 1, 7], dtype=np.uint64)
    values, indices = _kernel("TopK", 24)(x, np.array([3]), largest=1)
    assert values.tolist() == [7, 7, 7] and values.dtype == np.uint64
    assert indices.tolist() == [1, 2, 4]
    values, indices = _kernel("TopK", 24)(x, np.array([2]), largest=0)
    assert values.tolist() == [1, 3] and indices.tolist() == [3, 0]


def test_bitcast_4bit_reinterprets_the_nibble() -> None:
    import ml_dtypes

    x = np.array([-1, 7, -8], dtype=ml_dtypes.int4)
    y = _kernel("BitCast", 26)(x, to=int(DType.UINT4))
    assert y.dtype == np.dtype(ml_dtypes.uint4)
    assert y.astype(np.int32).tolist() == [15, 7, 8]


def test_hardmax_opset11_flattens_at_axis_but_opset13_does_not() -> None:
    x = np.array([[[1.0, 5.0], [9.0, 2.0]]], dtype=np.float32)  # [1, 2, 2]
    flat = _kernel("Hardmax", 11)(x, axis=1)  # one max over the 4 trailing values
    assert flat.tolist() == [[[0.0, 0.0], [1.0, 0.0]]]
    per_row = _kernel("Hardmax", 13)(x, axis=-1)
    assert per_row.tolist() == [[[0.0, 1.0], [1.0, 0.0]]]


def test_group_normalization_scale_is_per_group_in_18_and_per_channel_in_21() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 3)).astype(np.float32)
    per_group = _kernel("GroupNormalization", 18)(
        x, np.array([2.0, 3.0], np.float32), np.array([0.5, -1.0], np.float32), num_groups=2
    )
    per_channel = _kernel("GroupNormalization", 21)(
        x,
        np.array([2.0, 2.0, 3.0, 3.0], np.float32),
        np.array([0.5, 0.5, -1.0, -1.0], np.float32),
        num_groups=2,
    )
    np.testing.assert_allclose(per_group, per_channel, rtol=1e-6)
    g = x.reshape(2, 2, 6)
    ref = (g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)
    ref = ref.reshape(x.shape) * np.array([2, 2, 3, 3], np.float32)[:, None]
    ref = ref + np.array([0.5, 0.5, -1, -1], np.float32)[:, None]
    np.testing.assert_allclose(per_group, ref, rtol=1e-5, atol=1e-6)


def test_quantize_float8_saturate_flag() -> None:
    import ml_dtypes

    x = np.array([1000.0, -1000.0, 2.0], dtype=np.float32)
    zp = np.zeros((), dtype=ml_dtypes.float8_e4m3fn)
    sat = _kernel("QuantizeLinear", 21)(x, np.float32(1.0), zp, saturate=1)
    assert sat.astype(np.float32).tolist() == [448.0, -448.0, 2.0]
    raw = _kernel("QuantizeLinear", 21)(x, np.float32(1.0), zp, saturate=0)
    assert np.isnan(raw.astype(np.float32)[:2]).all()


def test_unique_unsorted_keeps_first_occurrence_order() -> None:
    class Ctx:
        num_outputs = 4

    y, first, inverse, counts = _kernel("Unique", 11)(Ctx(), np.array([4, 1, 4, 2, 1]), sorted=0)
    assert y.tolist() == [4, 1, 2]
    assert first.tolist() == [0, 1, 3]
    assert inverse.tolist() == [0, 1, 0, 2, 1]
    assert counts.tolist() == [2, 2, 1]


def test_tensor_scatter_circular_wraps() -> None:
    cache = np.zeros((1, 4, 1), dtype=np.float32)
    update = np.array([[[1.0], [2.0]]], dtype=np.float32)
    out = _kernel("TensorScatter", 24)(cache, update, np.array([3]), axis=1, mode="circular")
    assert out.reshape(-1).tolist() == [2.0, 0.0, 0.0, 1.0]


def test_resize_antialias_downsample_averages_integers() -> None:
    x = np.array([[[[0, 0, 100, 100]]]], dtype=np.uint8)
    y = _kernel("Resize", 19)(
        x, None, np.array([1, 1, 1, 0.5], np.float32), mode="linear", antialias=1
    )
    assert y.dtype == np.uint8 and y.shape == (1, 1, 1, 2)
    assert y[0, 0, 0, 0] < 50 < y[0, 0, 0, 1]  # each output mixes its two-pixel footprint


def test_user_errors_are_anychip_errors() -> None:
    from anychip.errors import AnychipError

    with pytest.raises(AnychipError, match="same shape"):
        _kernel("SwiGLU", 28)(np.zeros(3, np.float32), np.zeros(4, np.float32))
    with pytest.raises(AnychipError, match="cache length"):
        _kernel("TensorScatter", 24)(
            np.zeros((1, 2, 1), np.float32), np.zeros((1, 2, 1), np.float32), np.array([1]), axis=1
        )
    with pytest.raises(AnychipError, match="same bit width"):
        _kernel("BitCast", 26)(np.zeros(2, np.float32), to=int(DType.INT64))
    with pytest.raises(AnychipError, match="out of range"):
        _kernel("GatherElements", 13)(np.zeros((2, 2)), np.array([[0, 5]]), axis=1)
