"""What an IREE device claims, as data: the ONNX ops IREE's importer converts (torch-mlir's
ONNX-to-torch patterns, IREE 3.13) that anychip offers to it, and the dtypes.

A claim is where measurement starts, not a promise: every claim carries the declared
constraint ``measured`` (``probe.py``: the node's signature compiled on the device and matched
the CPU at bring-up), so a node IREE refuses or computes wrong is refused as declared, with
IREE's reason, and never reaches a user.
"""

from __future__ import annotations

from anychip.ir.dtypes import DType

__all__ = ["CPU_DTYPES", "GPU_DTYPES", "OPS"]

#: ONNX ops (default domain) offered to IREE; each node is measured before it is placed.
OPS = frozenset(
    """
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh AveragePool BatchNormalization
    Cast Ceil Celu Clip Concat Constant ConstantOfShape Conv ConvTranspose Cos Cosh CumSum
    DepthToSpace Div Einsum Elu Equal Erf Exp Expand Flatten Floor Gather GatherElements
    GatherND Gelu Gemm GlobalAveragePool GlobalMaxPool Greater GreaterOrEqual HardSigmoid
    HardSwish Identity InstanceNormalization LayerNormalization LeakyRelu Less LessOrEqual Log
    LogSoftmax MatMul Max MaxPool Mean Min Mish Mod Mul Neg Not Or PRelu Pad Pow Range
    Reciprocal ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin
    ReduceProd ReduceSum ReduceSumSquare Relu Reshape Round Selu Shape Sigmoid Sign Sin Sinh
    Size Slice Softmax Softplus Softsign SpaceToDepth Split Sqrt Squeeze Sub Sum Tan Tanh
    Tile Transpose Trilu Unsqueeze Where Xor
    """.split()
)

_COMMON = {
    DType.FLOAT,
    DType.FLOAT16,
    DType.INT8,
    DType.UINT8,
    DType.INT16,
    DType.INT32,
    DType.INT64,
    DType.BOOL,
}
#: Element types offered to ``iree-cpu`` (llvm-cpu computes float64 too).
CPU_DTYPES = frozenset(_COMMON | {DType.DOUBLE})
#: Element types offered to GPU targets (SPIR-V, CUDA, HIP, Metal): no float64, and no int64
#: tensors (int64 constants are fine): on lavapipe a vulkan partition of the ONNX suite's
#: test_attention_4d_causal_with_past_and_present_expanded computed an int64 shape as
#: [4371385962243811151, 4457325440330162226] where the probes and the partition check, on
#: other values, had matched.
GPU_DTYPES = frozenset(_COMMON - {DType.INT64})
