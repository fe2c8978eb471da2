"""Graph passes the CPU registers for its own partitions (``add_pass(..., backend="cpu")``).

They run per CPU partition, after placement, in this order: pattern fusions into single
kernels first (so the element-wise fusion does not swallow their parts), then the
element-wise chains. Two of them are the shared patterns of ``ir/passes/patterns``
(``"attention"`` and ``"elementwise"``), taken with ``patterns.get`` as any backend may; the
others are the CPU's own, here. Each pass fires only where the rewrite is provably the same
computation (intermediates with one reader and not graph outputs, constants where the kernel
needs them) and counts its firings in ``graph.meta["fusions"]``, which the placement report
shows per partition. A pass is disabled by name: ``anychip.load(..., device_options={"cpu":
{"disabled_passes": ["fuse_elementwise"]}})``, ``{"fusion": False}`` for all of them, or
``ANYCHIP_DISABLED_PASSES=fuse_gelu,fuse_elementwise`` (``all`` for every one), and
``anychip.load(..., optimize=False)`` runs none of them.
"""

from __future__ import annotations

from anychip.backends.cpu.passes.eliminate_layout import EliminateTransposeReshapePass
from anychip.backends.cpu.passes.fold_conv_affine import FoldConvAffinePass
from anychip.backends.cpu.passes.fold_gemm_reshapes import FoldGemmReshapesPass
from anychip.backends.cpu.passes.fold_pad import FoldPadIntoConvPass
from anychip.backends.cpu.passes.fuse_channel_shuffle import FuseChannelShufflePass
from anychip.backends.cpu.passes.fuse_column_products import FuseColumnProductsPass
from anychip.backends.cpu.passes.fuse_conv import FuseConvPass
from anychip.backends.cpu.passes.fuse_dynamic_quant_matmul import FuseDynamicQuantMatMulPass
from anychip.backends.cpu.passes.fuse_gemm import FuseGemmPass
from anychip.backends.cpu.passes.fuse_heads import FuseHeadsPass
from anychip.backends.cpu.passes.fuse_layer_norm import FuseLayerNormPass
from anychip.backends.cpu.passes.fuse_qdq_matmul import FuseQdqMatMulPass
from anychip.backends.cpu.passes.fuse_qlinear_matmul_add import FuseQLinearMatMulAddPass
from anychip.backends.cpu.passes.fuse_skip_layer_norm import FuseSkipLayerNormPass
from anychip.backends.cpu.passes.fuse_softmax_gelu import FuseGeluPass, FuseSoftmaxPass
from anychip.backends.cpu.passes.fuse_tree_group import FuseTreeGroupPass
from anychip.backends.cpu.passes.fuse_tree_stack import FuseTreeStackPass
from anychip.backends.cpu.passes.lower_batch_norm import LowerBatchNormPass
from anychip.backends.cpu.passes.memo_shapes import MemoShapesPass
from anychip.backends.cpu.passes.view_transposes import ViewTransposesPass
from anychip.ir.passes import Pass, patterns

__all__ = [
    "EliminateTransposeReshapePass",
    "FoldConvAffinePass",
    "FoldGemmReshapesPass",
    "FuseChannelShufflePass",
    "FuseColumnProductsPass",
    "FuseGeluPass",
    "FuseSoftmaxPass",
    "FoldPadIntoConvPass",
    "FuseConvPass",
    "FuseDynamicQuantMatMulPass",
    "FuseGemmPass",
    "FuseHeadsPass",
    "FuseQdqMatMulPass",
    "FuseQLinearMatMulAddPass",
    "FuseLayerNormPass",
    "FuseSkipLayerNormPass",
    "FuseTreeGroupPass",
    "FuseTreeStackPass",
    "LowerBatchNormPass",
    "MemoShapesPass",
    "ViewTransposesPass",
    "cpu_passes",
    "PASS_NAMES",
]


def cpu_passes() -> list[Pass]:
    """The CPU's passes, in the order they must run; each is an optimization
    (``anychip.load(..., optimize=False)`` leaves them out)."""
    passes = [
        MemoShapesPass(),
        FuseQdqMatMulPass(),
        FuseQLinearMatMulAddPass(),
        FuseDynamicQuantMatMulPass(),
        FoldPadIntoConvPass(),
        FoldConvAffinePass(),
        EliminateTransposeReshapePass(),
        FoldGemmReshapesPass(),
        FuseChannelShufflePass(),
        FuseLayerNormPass(),
        FuseSoftmaxPass(),
        patterns.get("attention"),
        ViewTransposesPass(),
        FuseGeluPass(),
        FuseConvPass(),
        FuseGemmPass(),
        FuseHeadsPass(),
        FuseSkipLayerNormPass(),
        FuseColumnProductsPass(),
        FuseTreeStackPass(),
        FuseTreeGroupPass(),
        LowerBatchNormPass(),
        MemoShapesPass(values=True),  # after the fusions that match shape nodes as written
        patterns.get("elementwise"),
    ]
    for p in passes:
        p.optimization = True
    return passes


#: The names ``disabled_passes`` accepts.
PASS_NAMES = tuple(p.name for p in cpu_passes())
