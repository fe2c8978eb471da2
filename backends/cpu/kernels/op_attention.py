"""Attention family: Attention (opset 23/24/25), RotaryEmbedding, LinearAttention,
CausalConvWithState, and ai.onnx.preview FlexAttention.

Scores and softmax compute in float32 (float64 for double inputs, or the requested
``softmax_precision``) and results are cast back to the input type. A query row whose keys are
all masked gives a zero row, as the Attention spec requires, never NaN.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError, ModelError
from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph

__all__ = [
    "attention",
    "rotary_embedding",
    "linear_attention",
    "causal_conv_with_state",
    "flex_attention",
]

_FLOATS = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE, DType.BFLOAT16})


def _compute_dtype(*arrays: np.ndarray, precision: int | None = None) -> np.dtype:
    if precision:
        dt = DType(precision).numpy
        return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)
    if any(np.asarray(a).dtype == np.float64 for a in arrays if a is not None):
        return np.dtype(np.float64)
    return np.dtype(np.float32)


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; rows that are entirely -inf become zeros."""
    zero, one = scores.dtype.type(0), scores.dtype.type(1)
    m = np.max(scores, axis=-1, keepdims=True)
    dead = np.isneginf(m)
    m = np.where(dead, zero, m)
    e = np.exp(scores - m)
    s = np.sum(e, axis=-1, keepdims=True)
    return np.where(dead, zero, e / np.where(s == zero, one, s))


def _matmul(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """A product accumulated in at least float32 and rounded to ``dtype``."""
    if dtype == np.float64:
        return a @ b
    return (a.astype(np.float32) @ b.astype(np.float32)).astype(dtype)


def _split_heads(x: np.ndarray, heads: int | None, name: str) -> np.ndarray:
    """(B, S, H*D) -> (B, H, S, D); 4D inputs pass through."""
    if x.ndim == 4:
        return x
    if x.ndim != 3:
        raise KernelError(f"Attention: {name} must be 3D or 4D, got shape {list(x.shape)}")
    if not heads:
        raise ModelError(f"Attention: 3D {name} needs the q_num_heads/kv_num_heads attributes")
    b, s, hidden = x.shape
    if hidden % heads:
        raise KernelError(f"Attention: {name} hidden size {hidden} is not divisible by {heads}")
    return x.reshape(b, s, heads, hidden // heads).transpose(0, 2, 1, 3)


def _repeat_kv(x: np.ndarray, q_heads: int) -> np.ndarray:
    kv_heads = x.shape[1]
    if q_heads == kv_heads:
        return x
    if q_heads % kv_heads:
        raise KernelError(
            f"Attention: q_num_heads {q_heads} is not a multiple of kv_num_heads {kv_heads}"
        )
    return np.repeat(x, q_heads // kv_heads, axis=1)


@kernel("Attention", since=23, dtypes=_FLOATS)
def attention(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    attn_mask: Any = None,
    past_key: Any = None,
    past_value: Any = None,
    nonpad_kv_seqlen: Any = None,
    *,
    is_causal: int = 0,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    qk_matmul_output_mode: int = 0,
    scale: float | None = None,
    softcap: float = 0.0,
    softmax_precision: int | None = None,
    left_window_size: int = -1,
    right_window_size: int = -1,
) -> tuple[np.ndarray, ...]:
    out_dtype = np.asarray(q).dtype
    three_d = np.asarray(q).ndim == 3
    # The spec computes in the input type T1; softmax_precision only changes the softmax's.
    t1 = out_dtype
    qh = _split_heads(np.asarray(q), q_num_heads, "Q")
    kh = _split_heads(np.asarray(k), kv_num_heads, "K")
    vh = _split_heads(np.asarray(v), kv_num_heads, "V")
    if (past_key is None) != (past_value is None):
        raise KernelError("Attention: past_key and past_value must be given together")
    past_len = 0
    if past_key is not None:
        past_len = np.asarray(past_key).shape[2]
        kh = np.concatenate([np.asarray(past_key), kh.astype(np.asarray(past_key).dtype)], 2)
        vh = np.concatenate([np.asarray(past_value), vh.astype(np.asarray(past_value).dtype)], 2)
    present_k, present_v = kh, vh
    batch, q_heads, sq, head = qh.shape
    total = kh.shape[2]
    sc = 1.0 / np.sqrt(head) if not scale else float(scale)
    # Q and K are each scaled by sqrt(scale) before the product, as the spec's diagram shows.
    root = t1.type(np.sqrt(sc))
    qc = qh.astype(t1) * root
    kc = _repeat_kv(kh, q_heads).astype(t1) * root
    vc = _repeat_kv(vh, q_heads).astype(t1)
    scores = _matmul(qc, np.swapaxes(kc, -1, -2), t1)
    qk = scores
    if softcap and softcap > 0:
        cap = t1.type(softcap)
        scores = cap * np.tanh(scores / cap)
    qk_soft = scores
    bias = np.zeros((batch, 1, sq, total), dtype=t1)
    if attn_mask is not None:
        m = np.asarray(attn_mask)
        if m.shape[-1] < total:
            pad_value = False if m.dtype == bool else -np.inf
            pad = np.full((*m.shape[:-1], total - m.shape[-1]), pad_value, dtype=m.dtype)
            m = np.concatenate([m, pad], axis=-1)
        elif m.shape[-1] > total:
            m = m[..., :total]
        mb = np.where(m, 0, -np.inf).astype(t1) if m.dtype == bool else m.astype(t1)
        bias = bias + mb
    rows = np.arange(sq)[:, None]
    cols = np.arange(total)[None, :]
    if nonpad_kv_seqlen is not None:
        lens = np.asarray(nonpad_kv_seqlen, dtype=np.int64).reshape(-1)
        offsets = lens - sq if past_key is None else np.full(batch, past_len)
        keep_len = cols[None] < lens[:, None, None]
        bias = bias + np.where(keep_len, 0, -np.inf)[:, None].astype(t1)
    else:
        offsets = np.full(batch, past_len)
    pos = rows[None] + offsets[:, None, None]  # absolute query positions, (B, Sq, 1)
    allowed = np.ones((batch, sq, total), dtype=bool)
    if is_causal:
        allowed &= cols[None] <= pos
    if left_window_size is not None and left_window_size >= 0:
        allowed &= cols[None] >= pos - left_window_size
    if right_window_size is not None and right_window_size >= 0:
        allowed &= cols[None] <= pos + right_window_size
    bias = bias + np.where(allowed, 0, -np.inf)[:, None].astype(t1)
    sm_dtype = DType(softmax_precision).numpy if softmax_precision else t1
    with np.errstate(invalid="ignore", over="ignore"):
        scores = scores + bias
        probs = _softmax_rows(scores.astype(sm_dtype))
    # A row whose bias masks every key is zero even if its raw scores were inf or NaN.
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    probs = np.where(dead, sm_dtype.type(0), probs).astype(t1)
    y = _matmul(probs, vc, t1)
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    mode_out = {0: qk, 1: qk_soft, 2: scores, 3: probs}.get(qk_matmul_output_mode)
    if mode_out is None:
        raise ModelError(
            f"Attention: qk_matmul_output_mode must be 0..3, got {qk_matmul_output_mode}"
        )
    return (
        y.astype(out_dtype),
        present_k,
        present_v,
        np.broadcast_to(mode_out, (batch, q_heads, sq, total)).astype(out_dtype),
    )


@kernel("RotaryEmbedding", since=23, dtypes=_FLOATS)
def rotary_embedding(
    x: np.ndarray,
    cos_cache: np.ndarray,
    sin_cache: np.ndarray,
    position_ids: Any = None,
    *,
    interleaved: int = 0,
    num_heads: int = 0,
    rotary_embedding_dim: int = 0,
) -> np.ndarray:
    x = np.asarray(x)
    out_dtype = x.dtype
    cdt = _compute_dtype(x)
    if x.ndim == 4:  # (B, H, S, D) -> (B, S, H, D)
        xs = x.transpose(0, 2, 1, 3)
    elif x.ndim == 3:
        if not num_heads:
            raise ModelError("RotaryEmbedding: a 3D input needs the num_heads attribute")
        b, s, hidden = x.shape
        xs = x.reshape(b, s, num_heads, hidden // num_heads)
    else:
        raise KernelError(f"RotaryEmbedding: input must be 3D or 4D, got {list(x.shape)}")
    xs = xs.astype(cdt)
    head = xs.shape[-1]
    rot = rotary_embedding_dim or head
    cos, sin = np.asarray(cos_cache).astype(cdt), np.asarray(sin_cache).astype(cdt)
    if position_ids is not None:
        ids = np.asarray(position_ids, dtype=np.int64)
        cos, sin = cos[ids], sin[ids]
    if cos.shape[-1] != rot // 2 or sin.shape[-1] != rot // 2:
        raise KernelError(
            f"RotaryEmbedding: cos/sin caches end in {cos.shape[-1]}/{sin.shape[-1]}, expected "
            f"rotary_embedding_dim/2 = {rot // 2}"
        )
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    part, rest = xs[..., :rot], xs[..., rot:]
    if interleaved:
        x1, x2 = part[..., 0::2], part[..., 1::2]
    else:
        x1, x2 = part[..., : rot // 2], part[..., rot // 2 :]
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rotated = np.stack([real, imag], axis=-1).reshape(part.shape)
    else:
        rotated = np.concatenate([real, imag], axis=-1)
    out = np.concatenate([rotated, rest], axis=-1)
    out = out.reshape(x.shape) if x.ndim == 3 else out.transpose(0, 2, 1, 3)
    return out.astype(out_dtype)


_LA_TYPES = frozenset({DType.FLOAT16, DType.FLOAT, DType.BFLOAT16})


@kernel("LinearAttention", since=27, dtypes=_LA_TYPES)
def linear_attention(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    past_state: Any = None,
    decay: Any = None,
    beta: Any = None,
    *,
    chunk_size: int = 64,
    kv_num_heads: int | None = None,
    q_num_heads: int | None = None,
    scale: float = 0.0,
    update_rule: str = "gated_delta",
) -> tuple[np.ndarray, np.ndarray]:
    if not q_num_heads or not kv_num_heads:
        raise ModelError("LinearAttention: q_num_heads and kv_num_heads are required")
    if q_num_heads % kv_num_heads:
        raise ModelError(
            f"LinearAttention: q_num_heads {q_num_heads} is not a multiple of kv_num_heads "
            f"{kv_num_heads}"
        )
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ModelError(f"LinearAttention: unknown update_rule {update_rule!r}")
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gated and decay is None:
        raise KernelError(f"LinearAttention: update_rule {update_rule!r} needs the decay input")
    if delta and beta is None:
        raise KernelError(f"LinearAttention: update_rule {update_rule!r} needs the beta input")
    out_dtype = np.asarray(query).dtype
    f32 = np.float32
    b, t, _ = np.asarray(query).shape
    q = np.asarray(query).astype(f32).reshape(b, t, q_num_heads, -1)
    k = np.asarray(key).astype(f32).reshape(b, t, kv_num_heads, -1)
    v = np.asarray(value).astype(f32).reshape(b, t, kv_num_heads, -1)
    dk, dv = k.shape[-1], v.shape[-1]
    group = q_num_heads // kv_num_heads
    sc = float(scale) if scale else 1.0 / np.sqrt(q.shape[-1])
    state_dtype = np.asarray(past_state).dtype if past_state is not None else out_dtype
    s = (
        np.zeros((b, kv_num_heads, dk, dv), f32)
        if past_state is None
        else np.asarray(past_state).astype(f32).copy()
    )
    if gated:
        g = np.asarray(decay).astype(f32)
        # Per-key-dimension decay (B, T, H*dk) or per-head scalar decay (B, T, H).
        g = g.reshape(b, t, kv_num_heads, dk if g.shape[-1] == kv_num_heads * dk else 1)
    if delta:
        bt = np.broadcast_to(np.asarray(beta).astype(f32), (b, t, kv_num_heads))
    out = np.zeros((b, t, q_num_heads, dv), f32)
    for step in range(t):
        kt, vt = k[:, step], v[:, step]  # (B, H, dk), (B, H, dv)
        if gated:
            s = np.exp(g[:, step])[..., None] * s
        if delta:
            pred = np.einsum("bhkv,bhk->bhv", s, kt)
            upd = bt[:, step][..., None] * (vt - pred)
            s = s + kt[..., None] * upd[:, :, None, :]
        else:
            s = s + kt[..., None] * vt[:, :, None, :]
        sq = np.repeat(s, group, axis=1)
        out[:, step] = sc * np.einsum("bhk,bhkv->bhv", q[:, step], sq)
    return out.reshape(b, t, -1).astype(out_dtype), s.astype(state_dtype)


_CC_TYPES = frozenset({DType.FLOAT16, DType.FLOAT, DType.BFLOAT16})


@kernel("CausalConvWithState", since=27, dtypes=_CC_TYPES)
def causal_conv_with_state(
    x: np.ndarray,
    weight: np.ndarray,
    bias: Any = None,
    past_state: Any = None,
    *,
    activation: str = "none",
) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x)
    out_dtype = x.dtype
    xf = x.astype(np.float32)
    w = np.asarray(weight).astype(np.float32)
    if x.ndim != 3 or w.ndim != 3 or w.shape[1] != 1 or w.shape[0] != x.shape[1]:
        raise KernelError(
            f"CausalConvWithState: expected input (B, C, L) and weight (C, 1, k), got "
            f"{list(x.shape)} and {list(w.shape)}"
        )
    batch, ch, length = x.shape
    ksize = w.shape[2]
    past = (
        np.zeros((batch, ch, ksize - 1), np.float32)
        if past_state is None
        else np.asarray(past_state).astype(np.float32)
    )
    padded = np.concatenate([past, xf], axis=2)
    out = np.zeros((batch, ch, length), np.float32)
    for j in range(ksize):
        out += w[None, :, 0, j, None] * padded[:, :, j : j + length]
    if bias is not None:
        out += np.asarray(bias).astype(np.float32)[None, :, None]
    act = activation.lower()
    if act in ("silu", "swish"):
        out = out / (1 + np.exp(-out))
    elif act != "none":
        raise ModelError(f"CausalConvWithState: unknown activation {activation!r}")
    present = padded[:, :, padded.shape[2] - (ksize - 1) :]
    return out.astype(out_dtype), present.astype(out_dtype)


@kernel("FlexAttention", domain="ai.onnx.preview", since=1, context=True)
def flex_attention(
    ctx: KernelContext,
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    *,
    prob_mod: Graph | None = None,
    score_mod: Graph | None = None,
    scale: float | None = None,
    softmax_precision: int | None = None,
) -> np.ndarray:
    q, k, v = np.asarray(q), np.asarray(k), np.asarray(v)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise KernelError("FlexAttention: Q, K and V must be rank-4 tensors")
    out_dtype = q.dtype
    cdt = _compute_dtype(q, precision=softmax_precision)
    sc = float(scale) if scale else 1.0 / np.sqrt(q.shape[-1])
    kc = _repeat_kv(k, q.shape[1]).astype(cdt)
    vc = _repeat_kv(v, q.shape[1]).astype(cdt)
    scores = (q.astype(cdt) @ np.swapaxes(kc, -1, -2)) * cdt.type(sc)
    if score_mod is not None:
        (scores,) = ctx.run_graph(score_mod, [scores])
        scores = np.asarray(scores).astype(cdt)
    with np.errstate(invalid="ignore", over="ignore"):
        probs = _softmax_rows(scores)
    if prob_mod is not None:
        (probs,) = ctx.run_graph(prob_mod, [probs.astype(cdt)])
        probs = np.asarray(probs).astype(cdt)
    return (probs @ vc).astype(out_dtype)
