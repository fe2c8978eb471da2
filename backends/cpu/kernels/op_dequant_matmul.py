"""``anychip::DequantMatMul`` (``passes/fuse_qdq_matmul.py``): a QDQ model's
``DequantizeLinear(A) @ DequantizeLinear(W)`` (+ bias) as one integer product.

The weights' ``DequantizeLinear`` was folded at load; its integers, scale and zero point are in
``B``'s ``meta["dequantized"]`` (``ir/passes/fold_constants.py``). The product
``(A - za) @ (Wq - zw)`` runs exactly in int32, then ``* (sa * sw)`` in float32 (per output
column where the weights are quantized per channel) and ``+ C``: what onnxruntime's QDQ
fusion computes, in one C call (``_qproduct.py``: the C's own sums for small products,
oneDNN's int8 matmul for large ones). Where neither applies, the unfused graph's
computation runs: ``A`` dequantized in float32 times the folded float32 ``B``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._qproduct import product_of, run_product
from anychip.backends.cpu.native.qlinear import Product, centered
from anychip.backends.cpu.onednn.int8 import int_matmul
from anychip.backends.cpu.table import kernel
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["dequant_matmul", "column_scale"]


def column_scale(meta: dict[str, Any], trans_b: bool, n: int) -> np.ndarray | None:
    """The weights' scale per output column (``[N]`` or one value), None where it is along
    another axis (the fusion pass does not fire then)."""
    scale = np.asarray(meta["scale"], np.float32)
    if scale.size == 1:
        return scale.reshape(())
    axis = int(meta["axis"]) % 2
    if scale.size != n or axis != (0 if trans_b else 1):
        return None
    return scale.reshape(-1)


def _zero_point(meta: dict[str, Any]) -> np.ndarray | None:
    zp = meta.get("zero_point")
    return None if zp is None else np.asarray(zp).reshape(-1)


@kernel("DequantMatMul", domain=ANYCHIP_DOMAIN, since=1, context=True)
def dequant_matmul(
    ctx: Any,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    transB: int = 0,
) -> np.ndarray:
    meta = ctx.node.inputs[3].meta["dequantized"]
    trans = bool(transB)
    n = b.shape[0] if trans else b.shape[1]
    sw = column_scale(meta, trans, n)
    if sw is not None and np.asarray(a_scale).size == 1:  # one C call (_qproduct)
        arrays = (meta["q"], a_scale, c)

        def build() -> Product:
            scale = np.float32(np.asarray(a_scale, np.float32).reshape(())) * sw
            bc = centered(meta["q"], _zero_point(meta), trans)
            return Product(bc, n, 1, scale=scale, bias=c)

        prod = product_of(ctx, (1, 4), arrays, build)
        zps = (a_zero_point, meta["q"], _zero_point(meta), trans)
        y = None if prod is None else run_product(prod, a, *zps, seal=True)
        if y is not None:
            return y
    y = int_matmul(a, meta["q"], a_zero_point, _zero_point(meta), trans)
    if y is not None and sw is not None:
        scale = np.float32(np.asarray(a_scale, np.float32).reshape(())) * sw
        out = y.astype(np.float32)
        out *= scale
    else:  # the unfused computation: A dequantized, times the folded weights
        x = (a.astype(np.float32) - np.asarray(a_zero_point).astype(np.float32)) * np.asarray(
            a_scale, np.float32
        )
        out = np.matmul(x, b.T if trans else b)
    if c is not None:
        out += c.astype(np.float32, copy=False)
    return out
