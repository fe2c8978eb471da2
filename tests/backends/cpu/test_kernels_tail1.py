"""CPU kernels of the ONNX long tail (part 1), checked against onnx's conformance node cases.

Every bundled ``onnx.backend.test`` node case whose graph uses only the ops below runs twice:
once by calling the registered CPU kernel directly (attributes decoded and schema defaults
filled the way the runtime does), and once through ``anychip.load`` when the session API is
available. The cases come from the onnx package itself, so each expected output is the spec's.
"""

from __future__ import annotations

import functools
from typing import Any

import onnx
import onnx.backend.test.loader as loader
import pytest
from onnx import numpy_helper

from anychip.backends.cpu.ops import load_all
from anychip.backends.cpu.table import CPU_KERNELS
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import attribute_defaults, resolve
from anychip.tests.node_cases import assert_outputs_close

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

# Cases whose expected output disagrees with the spec text, with the reason on the same line.
KNOWN_BAD: dict[str, str] = {}


@functools.lru_cache(maxsize=1)
def _cases() -> tuple[Any, ...]:
    """onnx's node cases made of exactly one node of one of our ops (in-memory models)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        every = loader.load_model_tests(kind="node")
    wanted = set(TAIL1_OPS)
    return tuple(
        c for c in every if len(c.model.graph.node) == 1 and c.model.graph.node[0].op_type in wanted
    )


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


def _params() -> list[Any]:
    return [pytest.param(c, id=c.name) for c in _cases()]


@pytest.mark.parametrize("case", _params())
def test_conformance_direct(case: Any) -> None:
    if case.name in KNOWN_BAD:
        pytest.xfail(KNOWN_BAD[case.name])
    for inputs, expected in case.data_sets:
        got = _run_direct(case.model, [_as_array(v) for v in inputs])
        want = [_as_array(v) for v in expected]
        assert_outputs_close(got, want, case.rtol, case.atol)
