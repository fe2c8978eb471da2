"""``anychip::QLinearMatMulAdd`` (``passes/fuse_qlinear_matmul_add.py``): a quantized linear
layer, the product, its requantization, the bias and the second requantization in one C call
(``native/qlinear.Product`` with ``then_add``), the same float operations as the ops it
replaces. Two forms (``opsets/anychip_ops.py``):

* ``qdq=0``: ``QLinearMatMul(a, sa, za, b, sb, zb, s1, z1)`` then ``QLinearAdd`` of that
  (``ds``, ``dz``) and an 8-bit bias (``bias``, ``bs``, ``bz``) to ``s2``, ``z2``;
* ``qdq=1``: ``DequantMatMul(a, sa, za, B)``, ``QuantizeLinear(s1, z1)``,
  ``DequantizeLinear(ds, dz)``, ``Add`` of a float32 bias, ``QuantizeLinear(s2, z2)``.

Where the C does not take the node's form, the replaced ops' kernels run one after another.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._qproduct import product_of, run_product
from anychip.backends.cpu.kernels.op_contrib_quantize import qlinear_add
from anychip.backends.cpu.kernels.op_conv_integer import qlinear_mat_mul, qlinear_product
from anychip.backends.cpu.kernels.op_dequant_matmul import _zero_point, column_scale, dequant_matmul
from anychip.backends.cpu.kernels.op_quantize import dequantize_linear, quantize_linear
from anychip.backends.cpu.native.qlinear import Product, centered
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["qlinear_matmul_add"]

_KEY = "qlinear-add"


def _one(*values: np.ndarray | None) -> bool:
    return all(v is not None and np.asarray(v).size == 1 for v in values)


def _qoperator(ctx: Any, a, sa, za, b, sb, zb, s1, z1, ds, dz, bias, bs, bz, s2, z2) -> np.ndarray:
    arrays = (b, sa, sb, zb, s1, z1, ds, dz, bias, bs, bz, s2, z2)

    def build() -> Product | None:
        n = b.shape[-1]
        fits = b.ndim == 2 and b.dtype.itemsize == 1 and bias.shape[-1:] == (n,)
        if not (fits and bias.size == n and _one(ds, dz, bs, bz, s2, z2)):
            return None
        biasf = (bias.astype(np.float32) - bz.astype(np.float32)) * bs.astype(np.float32)
        then = (biasf, ds.astype(np.float32), dz, s2.astype(np.float32), z2)
        return qlinear_product(b, sa, sb, zb, s1, z1, then_add=then)

    prod = product_of(ctx, range(1, 15), arrays, build, _KEY)
    y = None if prod is None else run_product(prod, a, za, b, zb, seal=True)
    if y is not None:
        return y
    mid = qlinear_mat_mul(None, a, sa, za, b, sb, zb, s1, z1)
    y = qlinear_add(mid, ds, dz, bias, bs, bz, s2, z2)
    _replay.unseal()  # the kernels above seal their own calls; not all of them were noted
    return y


def _qdq(ctx: Any, trans: bool, a, sa, za, b, s1, z1, ds, dz, bias, s2, z2) -> np.ndarray:
    meta = ctx.node.inputs[3].meta["dequantized"]
    f32 = np.float32

    def build() -> Product | None:
        n = b.shape[0] if trans else b.shape[1]
        sw = column_scale(meta, trans, n)
        per_tensor = _one(sa, s1, z1, ds, dz, s2, z2) and s1.dtype == s2.dtype == f32
        fits = bias.size == n and bias.shape[-1:] == (n,) and bias.dtype == f32
        if sw is None or not per_tensor or not fits:
            return None
        scale = f32(np.asarray(sa, f32).reshape(())) * sw
        then = (bias, ds.astype(f32), dz, s2, z2)
        bc = centered(meta["q"], _zero_point(meta), trans)
        ys = float(s1.item())
        return Product(bc, n, 2, scale=scale, ys=ys, yzp=z1, out_dtype=z1.dtype, then_add=then)

    prod = product_of(ctx, range(1, 11), (meta["q"], sa, s1, z1, ds, dz, bias, s2, z2), build, _KEY)
    zps = (za, meta["q"], _zero_point(meta), trans)
    y = None if prod is None else run_product(prod, a, *zps, seal=True)
    if y is not None:
        return y
    mid = dequant_matmul(ctx, a, sa, za, b, transB=int(trans))
    w = dequantize_linear(quantize_linear(mid, s1, z1), ds, dz)
    y = quantize_linear(np.add(w, bias, dtype=np.float32), s2, z2)
    _replay.unseal()  # the kernels above seal their own calls; the Add was not noted
    return y


@kernel("QLinearMatMulAdd", domain=ANYCHIP_DOMAIN, since=1, context=True)
def qlinear_matmul_add(ctx: Any, *inputs: np.ndarray, qdq: int = 0, transB: int = 0) -> np.ndarray:
    if len(inputs) != (11 if qdq else 15):
        raise KernelError(
            f"QLinearMatMulAdd: {len(inputs)} inputs for qdq={qdq}; the fusion pass gives "
            f"{11 if qdq else 15}"
        )
    if qdq:
        return _qdq(ctx, bool(transB), *inputs)
    return _qoperator(ctx, *inputs)
