"""Graph passes the NPU registers for its own partitions (``add_pass(..., backend="npu")``),
run in this order: lower 1-D Conv to 2-D, fold BatchNormalization into Conv, fuse Conv +
activation, go NHWC.

Each pass is an ``ir.passes.Pass``: ``call(graph)`` rewrites the partition graph in place and
returns ``PassResult(graph, modified)``; calling the pass verifies the graph and records its
name in ``graph.meta["passes"]``, which the compile report lists. The BatchNormalization fold
is the shared one (``ir/passes/fold_batch_norm.py``) with the NPU's options.
"""

from __future__ import annotations

from anychip.backends.npu_stub.passes.convert_to_nhwc import ConvertToNhwcPass
from anychip.backends.npu_stub.passes.fuse_conv_activation import FuseConvActivationPass
from anychip.backends.npu_stub.passes.lower_conv1d import LowerConv1dPass
from anychip.ir.passes import Pass
from anychip.ir.passes.fold_batch_norm import FoldBatchNormPass

__all__ = [
    "FoldBatchNormPass",
    "FuseConvActivationPass",
    "ConvertToNhwcPass",
    "LowerConv1dPass",
    "npu_fold_batch_norm",
    "npu_passes",
]


#: The convolutions the NPU folds BatchNormalization into: ONNX Conv and its unfused NpuConv.
NPU_CONVS = (("", "Conv"), ("anychip", "NpuConv"))


def npu_fold_batch_norm() -> FoldBatchNormPass:
    """The shared fold, into Conv or an unfused ``NpuConv``: a BatchNormalization after a
    fused activation is not affine in the conv's output."""
    return FoldBatchNormPass(NPU_CONVS, accept=lambda conv, _bn: not conv.attr("activation", ""))


def npu_passes() -> list[Pass]:
    """The NPU's passes, in the order they must run."""
    return [
        LowerConv1dPass(),
        npu_fold_batch_norm(),
        FuseConvActivationPass(),
        ConvertToNhwcPass(),
    ]
