"""Graph passes the NPU registers for its own partitions (``add_pass(..., backend="npu")``),
run in this order: fold BatchNormalization into Conv, fuse Conv + activation, go NHWC.

Each pass is a small class whose ``__call__(graph)`` rewrites the partition graph in place
and returns whether it changed it; the graph verifies after every pass.
"""

from __future__ import annotations

from anychip.backends.npu_stub.passes.convert_to_nhwc import ConvertToNhwcPass
from anychip.backends.npu_stub.passes.fold_batch_norm import FoldBatchNormPass
from anychip.backends.npu_stub.passes.fuse_conv_activation import FuseConvActivationPass

__all__ = ["FoldBatchNormPass", "FuseConvActivationPass", "ConvertToNhwcPass", "npu_passes"]


def npu_passes() -> list:
    """The NPU's passes, in the order they must run."""
    return [FoldBatchNormPass(), FuseConvActivationPass(), ConvertToNhwcPass()]
