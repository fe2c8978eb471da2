"""``com.microsoft`` Attention and MultiHeadAttention (onnxruntime's fused BERT/GPT attention).

Both are scaled dot-product attention over heads, ``softmax(Q K^T * scale + bias + mask) V``,
computed in float32 (float64 for double). Masks follow onnxruntime's CPU kernels: a masked
position gets ``mask_filter_value`` added to its score; ``unidirectional`` masks the future.
Mask formats: ``[B]`` (valid key length per batch row, right padding), ``[2B]`` (end and
start), ``[B, T]`` raw 0/1 masks, ``[B, S, T]`` and ``[B, 1, M, M]`` (a larger causal buffer
cut to the shapes). Packed QKV/KV inputs of MultiHeadAttention are refused, as by
onnxruntime's CPU kernel. Rotary
embedding inside Attention (``do_rotary``) and beam-search cache indirection are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.plugin.claims import Constraint
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["ms_attention", "multi_head_attention"]


def _heads(x: np.ndarray, n: int) -> np.ndarray:
    """``[B, S, N*H]`` -> ``[B, N, S, H]``."""
    b, s, d = x.shape
    if d % n:
        raise KernelError(f"attention: hidden size {d} is not a multiple of num_heads {n}")
    return x.reshape(b, s, n, d // n).transpose(0, 2, 1, 3)


def _mask_bias(mask: np.ndarray | None, b: int, s: int, t: int, fill: float) -> np.ndarray:
    """The additive mask ``[B, 1, S, T]`` (0 where allowed, ``fill`` where masked)."""
    if mask is None:
        return np.zeros((1, 1, 1, 1), np.float32)
    m = np.asarray(mask)
    if m.ndim == 1 and m.shape[0] in (b, 2 * b):
        pos = np.arange(t)[None, :]
        allowed = pos < m[:b, None]
        if m.shape[0] == 2 * b:
            allowed &= pos >= m[b:, None]
        keep = allowed[:, None, None, :]
    elif m.ndim == 2 and m.shape == (b, t):
        keep = (m > 0)[:, None, None, :]
    elif m.ndim == 3 and m.shape == (b, s, t):
        keep = (m > 0)[:, None, :, :]
    elif m.ndim == 4 and m.shape[0] == b and m.shape[2] >= t and m.shape[3] >= t:
        keep = (m[:, :, t - s : t, :t] > 0)[:, :1]
    else:
        raise KernelError(
            f"attention: mask of shape {list(m.shape)} fits none of the formats [B], [2B], "
            f"[B, T], [B, S, T], [B, 1, M, M] for B={b}, S={s}, T={t}"
        )
    return np.where(keep, np.float32(0), np.float32(fill))


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    scale: float,
    bias: np.ndarray,
    causal: bool,
    fill: float,
) -> np.ndarray:
    """``q [B,N,S,H], k [B,N,T,H], v [B,N,T,Hv]`` -> ``[B, S, N*Hv]``."""
    s, t = q.shape[2], k.shape[2]
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    scores = scores + bias
    if causal:
        future = np.arange(t)[None, :] > (np.arange(s)[:, None] + (t - s))
        scores = scores + np.where(future, np.float32(fill), np.float32(0))
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    probs = e / e.sum(axis=-1, keepdims=True)
    out = np.matmul(probs, v)
    b, n, _, hv = out.shape
    return out.transpose(0, 2, 1, 3).reshape(b, s, n * hv)


def _work(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


@kernel("Attention", domain=MS_DOMAIN, since=1)
def ms_attention(
    x: np.ndarray,
    weights: np.ndarray,
    bias: np.ndarray | None = None,
    mask_index: np.ndarray | None = None,
    past: np.ndarray | None = None,
    attention_bias: np.ndarray | None = None,
    past_sequence_length: np.ndarray | None = None,
    *,
    num_heads: int,
    qkv_hidden_sizes: list[int] | None = None,
    unidirectional: int = 0,
    mask_filter_value: float = -10000.0,
    scale: float = 0.0,
    do_rotary: int = 0,
    past_present_share_buffer: int = 0,
    rotary_embedding_dim: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Self-attention with the Q, K, V projections fused into one ``weights`` matrix."""
    if do_rotary or past_present_share_buffer:
        raise KernelError(
            "Attention: do_rotary and past_present_share_buffer are not supported on the CPU; "
            "export without the rotary/shared-buffer fusion"
        )
    w = _work(x)
    proj = np.matmul(x.astype(w), weights.astype(w))
    if bias is not None:
        proj = proj + bias.astype(w)
    sizes = list(qkv_hidden_sizes or [proj.shape[-1] // 3] * 3)
    q, k, v = np.split(proj, np.cumsum(sizes)[:2], axis=-1)
    q, k, v = _heads(q, num_heads), _heads(k, num_heads), _heads(v, num_heads)
    if past is not None and past.size:
        k = np.concatenate([past[0].astype(w), k], axis=2)
        v = np.concatenate([past[1].astype(w), v], axis=2)
    present = np.stack([k, v]).astype(x.dtype)
    b, _, s, h = q.shape
    t = k.shape[2]
    add = _mask_bias(mask_index, b, s, t, mask_filter_value)
    if attention_bias is not None:
        add = add + attention_bias.astype(np.float32)
    out = _attend(q, k, v, scale or 1.0 / np.sqrt(h), add, bool(unidirectional), mask_filter_value)
    return out.astype(x.dtype), present


def _mha_inputs(
    query: np.ndarray,
    key: np.ndarray | None,
    value: np.ndarray | None,
    bias: np.ndarray | None,
    n: int,
    w: np.dtype,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
    """Q, K, V as ``[B, N, ., H]``; the flag says K/V came already in that layout."""
    if key is None or value is None or key.ndim == 5:
        raise KernelError(
            "MultiHeadAttention: packed QKV or KV inputs are not supported on the CPU (nor by "
            "onnxruntime's CPU kernel); give query, key and value separately"
        )
    q = query.astype(w)
    if bias is not None:
        d = q.shape[-1]
        q = q + bias[:d].astype(w)
    if key.ndim == 4:  # already [B, N, L, H] (cross attention with cached key/value)
        return _heads(q, n), key.astype(w), value.astype(w), True
    k, v = key.astype(w), value.astype(w)
    if bias is not None:
        d, dk = q.shape[-1], k.shape[-1]
        k = k + bias[d : d + dk].astype(w)
        v = v + bias[d + dk :].astype(w)
    return _heads(q, n), _heads(k, n), _heads(v, n), False


def _no_cache_indirection(node: Any) -> bool:
    return len(node.inputs) < 10 or node.inputs[9] is None


# beam search's reordered KV cache: onnxruntime's BeamSearch feeds it; refused at load
_NO_BEAMS = Constraint(
    "no cache_indirection (beam search's reordered cache: use onnxruntime for generation loops)",
    _no_cache_indirection,
)


@kernel("MultiHeadAttention", domain=MS_DOMAIN, since=1, constraints=(_NO_BEAMS,))
def multi_head_attention(
    query: np.ndarray,
    key: np.ndarray | None = None,
    value: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    key_padding_mask: np.ndarray | None = None,
    attention_bias: np.ndarray | None = None,
    past_key: np.ndarray | None = None,
    past_value: np.ndarray | None = None,
    past_sequence_length: np.ndarray | None = None,
    cache_indirection: np.ndarray | None = None,
    *,
    num_heads: int,
    unidirectional: int = 0,
    mask_filter_value: float = -10000.0,
    scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Attention over separate (or packed) Q, K, V projections, with an optional KV cache."""
    if cache_indirection is not None:
        raise KernelError(
            "MultiHeadAttention: cache_indirection (beam search) is not supported on the CPU"
        )
    w = _work(query)
    q, k, v, _ = _mha_inputs(query, key, value, bias, num_heads, w)
    if past_key is not None and past_value is not None:
        k = np.concatenate([past_key.astype(w), k], axis=2)
        v = np.concatenate([past_value.astype(w), v], axis=2)
    b, _, s, h = q.shape
    t = k.shape[2]
    add = _mask_bias(key_padding_mask, b, s, t, mask_filter_value)
    if attention_bias is not None:
        add = add + attention_bias.astype(np.float32)
    out = _attend(q, k, v, scale or 1.0 / np.sqrt(h), add, bool(unidirectional), mask_filter_value)
    dt = query.dtype
    return out.astype(dt), k.astype(dt), v.astype(dt)
