"""ONNX Attention (opset 23) in the array-API family: 3-D or 4-D Q/K/V, grouped-query heads,
a boolean or additive mask (padded to the total length), a past key/value cache (the present
outputs), bottom-right causal masking, softcap, and the ``qk_matmul_output`` modes, in the
order of the ONNX reference: Q and K scaled by sqrt(scale) each, QK^T, softcap, bias added,
softmax (a fully masked row gives zeros), times V.
"""

from __future__ import annotations

import math
from typing import Any

from anychip.backends.arrayapi.family._common import extra, kernel
from anychip.backends.arrayapi.tensor import Space

__all__ = ["attention_of"]


def _heads(s: Space, t: Any, heads: int) -> Any:
    """``[B, S, H*D]`` -> ``[B, H, S, D]``."""
    b, n, hidden = t.shape
    return s.xp.permute_dims(s.xp.reshape(t, (b, n, heads, hidden // heads)), (0, 2, 1, 3))


def _bias(s: Space, q: Any, mask: Any, is_causal: int, past: int, kv: int) -> Any:
    """The additive bias: mask (padded to ``kv`` keys) and the causal frontier."""
    xp = s.xp
    ninf = -math.inf
    bias = xp.zeros((q.shape[2], kv), dtype=q.dtype, device=s.device)
    if mask is not None:
        pad = kv - mask.shape[-1]
        if pad > 0:
            fill = False if mask.dtype == xp.bool else ninf
            widths = [(0, 0)] * (mask.ndim - 1) + [(0, pad)]
            mask = extra().pad(mask, widths, constant_values=fill, xp=xp)
        if mask.dtype == xp.bool:
            mask = xp.where(mask, xp.asarray(0.0, dtype=q.dtype), xp.asarray(ninf, dtype=q.dtype))
        bias = bias + xp.astype(mask, q.dtype)
    if is_causal:
        i = xp.reshape(xp.arange(q.shape[2], device=s.device), (-1, 1))
        j = xp.reshape(xp.arange(kv, device=s.device), (1, -1))
        zero, minus = xp.asarray(0.0, dtype=q.dtype), xp.asarray(ninf, dtype=q.dtype)
        bias = bias + xp.where(j <= i + past, zero, minus)
    return bias


def attention_of(s: Space, q: Any, k: Any, v: Any, mask: Any, pk: Any, pv: Any, a: dict) -> tuple:
    """(Y, present_key, present_value, qk_matmul_output) (module docstring)."""
    xp = s.xp
    rank3 = q.ndim == 3
    if rank3:
        q = _heads(s, q, int(a["q_num_heads"]))
        k, v = _heads(s, k, int(a["kv_num_heads"])), _heads(s, v, int(a["kv_num_heads"]))
    scale = a.get("scale") or 1.0 / math.sqrt(q.shape[3])
    root = math.sqrt(scale)
    past = 0 if pk is None else pk.shape[2]
    if pk is not None:
        k, v = xp.concat([pk, k], axis=2), xp.concat([pv, v], axis=2)
    present_k, present_v = k, v
    bias = _bias(s, q, mask, int(a.get("is_causal", 0)), past, k.shape[2])
    if q.shape[1] != k.shape[1]:  # grouped-query heads: each K/V head serves a group
        g = q.shape[1] // k.shape[1]
        b, hk, n, d = k.shape
        k = xp.reshape(
            xp.broadcast_to(xp.reshape(k, (b, hk, 1, n, d)), (b, hk, g, n, d)), (b, hk * g, n, d)
        )
        dv = v.shape[3]
        v = xp.reshape(
            xp.broadcast_to(xp.reshape(v, (b, hk, 1, n, dv)), (b, hk, g, n, dv)), (b, hk * g, n, dv)
        )
    qk = xp.matmul(q * root, xp.matrix_transpose(k * root))
    softcap = float(a.get("softcap") or 0.0)
    if softcap > 0:
        qk = xp.tanh(qk / softcap) * softcap
    with_bias = qk + bias
    mode = int(a.get("qk_matmul_output_mode") or 0)
    top = xp.max(with_bias, axis=-1, keepdims=True)
    e = xp.exp(with_bias - xp.where(xp.isinf(top), xp.zeros_like(top), top))
    total = xp.sum(e, axis=-1, keepdims=True)
    p = e / xp.where(total == 0, xp.ones_like(total), total)
    masked = xp.isinf(xp.max(bias, axis=-1, keepdims=True))
    p = xp.where(masked, xp.zeros_like(p), p)
    qk_out = with_bias if mode == 2 else p if mode == 3 else qk
    y = xp.matmul(p, v)
    if rank3:
        y = xp.permute_dims(y, (0, 2, 1, 3))
        y = xp.reshape(y, (y.shape[0], y.shape[1], -1))
    return y, present_k, present_v, qk_out


@kernel("Attention", since=23, until=23, context=True)
def attention(
    ctx: Any, s: Space, q: Any, k: Any, v: Any, mask: Any = None, pk: Any = None,
    pv: Any = None, **attrs: Any,
) -> Any:  # fmt: skip
    outs = attention_of(s, q, k, v, mask, pk, pv, attrs)[: ctx.num_outputs]
    if len(outs) == 1:
        return outs[0]
    return tuple(o if used else None for o, used in zip(outs, ctx.outputs_used))
