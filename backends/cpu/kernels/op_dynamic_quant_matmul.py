"""``anychip::DynamicQuantMatMul`` (``passes/fuse_dynamic_quant_matmul.py``): a layer of
onnxruntime's ``quantize_dynamic``, ``DynamicQuantizeLinear`` -> ``MatMulInteger`` -> ``Cast``
-> ``Mul`` by ``x_scale * B_scale`` (-> ``Add`` of a constant bias), in two C calls (the
activations' quantization, unless the graph keeps it for other readers, then the product
with its float32 epilogue,
``native/qlinear.Product`` mode 1 with ``smul``): the same float operations in the same
order as the ops it replaces; where the C does not take the form, those ops' kernels run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._qproduct import product_of, run_product
from anychip.backends.cpu.kernels.op_conv_integer import mat_mul_integer
from anychip.backends.cpu.kernels.op_quantize import dynamic_quantize_linear
from anychip.backends.cpu.native import qlinear
from anychip.backends.cpu.native.qlinear import Product, centered
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["dynamic_quant_matmul"]


@kernel("DynamicQuantMatMul", domain=ANYCHIP_DOMAIN, since=1, context=True)
def dynamic_quant_matmul(
    ctx: Any,
    x: np.ndarray,
    b: np.ndarray,
    b_zero_point: np.ndarray | None,
    b_scale: np.ndarray,
    c: np.ndarray | None = None,
    x_scale: np.ndarray | None = None,
    x_zero_point: np.ndarray | None = None,
) -> np.ndarray:
    """``x`` float32 (quantized here), or already quantized with ``x_scale`` and
    ``x_zero_point`` (the ``DynamicQuantizeLinear`` kept for its other readers)."""
    noted = True  # every call so far noted for a replay
    if x_scale is None:  # in C where it can (noted, not sealed: the product follows)
        done = qlinear.dynamic_quantize(x)
        noted = done is not None
        xq, xs, xz = done if done is not None else dynamic_quantize_linear(x)
    else:
        xq, xs, xz = x, x_scale, x_zero_point
    f32 = np.float32

    def build() -> Product | None:
        n = b.shape[-1]
        if b.ndim != 2 or b_scale.dtype != f32 or b_scale.size not in (1, n):
            return None
        if c is not None and (c.dtype != f32 or c.size != n or c.shape[-1:] != (n,)):
            return None
        return Product(centered(b, b_zero_point), n, 1, scale=b_scale, bias=c)

    prod = product_of(ctx, (1, 2, 3, 4), (b, b_zero_point, b_scale, c), build, "dynamic")
    y = None
    if prod is not None and xs.dtype == f32 and xs.size == 1:
        y = run_product(prod, xq, None, b, b_zero_point, dyn=(xs, xz), seal=noted)
    if y is not None:
        return y
    acc = mat_mul_integer(None, xq, b, xz, b_zero_point).astype(f32)
    _replay.unseal()  # mat_mul_integer seals its C call; the scaling here is not noted
    y = acc * (xs * b_scale)
    return y if c is None else y + c
