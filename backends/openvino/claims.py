"""What OpenVINO devices claim, as data: the ONNX ops, opsets and dtypes the conformance kit
measured, with the constraints it found (``constraints.py``).

``MEASURED`` holds every op with a node case that ran on ``openvino:cpu`` and passed
(``anychip conformance --device openvino:cpu``, OpenVINO 2026.4, onnx 1.23: docs/perf/
openvino.md has the counts); ``TESTED`` the ops whose kit cases feed their int64 inputs from
the model's inputs (refused there by ``int64.py``), verified with constant ones against
onnxruntime in ``tests/backends/openvino/test_ops.py``. ``LEFT_OUT`` names the ops whose
cases OpenVINO computes wrong with no attribute to blame, with the case. Each claim covers every
opset and the dtypes of ``DTYPES`` (``F16_DTYPES`` at an opted-in lower precision; narrowed
per op by ``OP_DTYPES``), under the constraints
every claim carries (tensors only; int64 only where bounded) and its op's own. A node of an op
claimed here is still asked of OpenVINO itself (``capability.py``). GPU and NPU take the same
claims, never measured: ``Core.query_model`` is their only refinement.

``bench/openvino_claims.py`` runs the kit with every ONNX op claimed and prints these tables
again for another OpenVINO.
"""

from __future__ import annotations

import functools

from anychip.backends.openvino import constraints, int64
from anychip.core.plugin.claims import Constraint, OpClaim
from anychip.ir.dtypes import DType

__all__ = [
    "DOMAINS",
    "DTYPES",
    "F16_DTYPES",
    "LEFT_OUT",
    "MEASURED",
    "OP_DTYPES",
    "TESTED",
    "op_claims",
]

#: Element types OpenVINO computes exactly; float64 and uint64 are narrowed to 32 bits by its
#: CPU plugin (float64 ``1 + 1e-12`` comes back as 1.0), int64 too but is kept under the
#: bounded-values constraint (``int64.py``). float16 is in ``F16_DTYPES`` only: OpenVINO keeps
#: a float16 graph's intermediate values in float32 where ONNX rounds each op's output to
#: float16 (test_attention_4d_causal_fp16_expanded: two float16 ulps apart), so float16
#: tensors go to OpenVINO only at an opted-in lower precision.
DTYPES = frozenset(
    {
        DType.FLOAT,
        DType.INT8,
        DType.UINT8,
        DType.INT16,
        DType.UINT16,
        DType.INT32,
        DType.UINT32,
        DType.INT64,
        DType.BOOL,
    }
)
F16_DTYPES = DTYPES | {DType.FLOAT16}
#: The ONNX domains OpenVINO's ONNX frontend reads.
DOMAINS = {"": "", "ai.onnx": ""}

MEASURED = frozenset(
    """
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh Attention AveragePool
    BatchNormalization BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor BlackmanWindow
    Cast CastLike Ceil Celu Clip Compress Concat Constant Conv ConvInteger ConvTranspose Cos
    Cosh CumSum DepthToSpace DequantizeLinear Div Dropout Elu Equal Erf Exp EyeLike Flatten
    Floor GRU Gather GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool
    Greater GreaterOrEqual GridSample GroupNormalization HammingWindow HannWindow
    HardSigmoid HardSwish Hardmax Identity InstanceNormalization IsInf IsNaN LRN LSTM
    LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization LpPool
    MatMul MatMulInteger Max MaxPool Mean MeanVarianceNormalization Min Mish Mod Mul Neg
    NonZero Not OneHot Or PRelu Pow QLinearConv QLinearMatMul QuantizeLinear
    RMSNormalization RNN Range Reciprocal ReduceProd Relu Resize RotaryEmbedding Round
    Scatter ScatterElements ScatterND Selu Shape Shrink Sigmoid Sign Sin Sinh Size Softmax
    Softplus Softsign SpaceToDepth Split Sqrt Sub Sum Swish Tan Tanh ThresholdedRelu
    Transpose Unique Upsample Where Xor
    """.split()
)
TESTED = frozenset(
    """
    ConstantOfShape Expand Pad ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMean
    ReduceSum ReduceSumSquare Reshape Slice Squeeze Tile TopK Trilu Unsqueeze
    """.split()
)
#: op -> the case OpenVINO computes wrong, and how. Not here, and written down in
#: docs/perf/openvino.md: NaN inputs, where OpenVINO's Relu, Max, Min and MaxPool give a number
#: (Relu(NaN) = 0) and ONNX's reference NaN; no ONNX case has them, and a model whose
#: activations hold NaN has lost its results before these ops.
LEFT_OUT = {
    "DFT": "test_dft_opset19: errors of 6e-5 where 1e-7 is allowed; test_dft_rfft_opset19: "
    "an output of another shape",
    "DynamicQuantizeLinear": "test_dynamicquantizelinear: a tie rounded up (26, not 25)",
    "ReduceMax": "a row of -inf gives -3.4e38, not -inf (the ONNX suite's "
    "test_attention_23_boolmask_fullymasked_row_nan_robustness_expanded gets NaN for 0)",
    "ReduceMin": "a row of +inf gives 3.4e38, not +inf (as ReduceMax)",
}
#: op -> the dtypes it is claimed for where narrower than ``DTYPES``.
OP_DTYPES = {
    "Celu": frozenset({DType.FLOAT}),  # test_celu_float16 does not convert
}

_INT64 = Constraint(int64.REASON, lambda node: int64.refusal(node) is None)


@functools.cache
def op_claims(float16: bool = False) -> tuple[OpClaim, ...]:
    """One claim per measured or tested op: every opset, its dtypes (float16 among them only
    with ``float16``: a precision below f32 opted into) and its constraints."""
    ops = sorted((MEASURED | TESTED) - set(LEFT_OUT))
    dtypes = F16_DTYPES if float16 else DTYPES
    return tuple(
        OpClaim(
            "",
            op,
            1,
            None,
            OP_DTYPES.get(op, dtypes) & dtypes,
            0,
            (*constraints.ALL, _INT64, *constraints.BY_OP.get(op, ())),
        )
        for op in ops
    )


@functools.cache
def claims_by_op(float16: bool = False) -> dict[str, OpClaim]:
    """``op_claims`` by op name (one claim per op)."""
    return {c.op: c for c in op_claims(float16)}
