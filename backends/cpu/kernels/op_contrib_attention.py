"""``com.microsoft`` Attention and MultiHeadAttention (onnxruntime's fused BERT/GPT attention).

Both are scaled dot-product attention over heads, ``softmax(Q K^T * scale + bias + mask) V``,
computed in float32 (float64 for double). Masks follow onnxruntime's CPU kernels: a masked
position gets ``mask_filter_value`` added to its score; ``unidirectional`` masks the future.
Mask formats: ``[B]`` (valid key length per batch row, right padding), ``[2B]`` (end and
start), ``[B, T]`` raw 0/1 masks, ``[B, S, T]`` and ``[B, 1, M, M]`` (a larger causal buffer
cut to the shapes). Packed QKV/KV inputs of MultiHeadAttention are refused, as by
onnxruntime's CPU kernel. Rotary embedding inside Attention (``do_rotary``) is refused.

MultiHeadAttention's decoding inputs follow onnxruntime's CPU kernel (decision 048): with
``past_key`` and ``past_sequence_length`` the past and present share one buffer of
``max_sequence_length`` M (the new keys written at ``P = past_sequence_length``, attention
over the first ``P + L``); with ``cache_indirection`` ``[B / W, W, M]`` as well, a one-token
step (``S = 1``, ``P > 0``, no mask or a 2-D one) reads past position ``j`` of beam ``b``
from beam ``cache_indirection[b, j]`` of its batch (beam search's reordered cache); in every
other case the indirection is not read, as in onnxruntime. Output 3 (``qk``) is the scaled,
biased and masked ``Q K^T`` before the softmax; positions in the causal future are the
lowest float there (onnxruntime's fill), padded ones get ``mask_filter_value``.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
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


def _scores(
    q: np.ndarray, k: np.ndarray, scale: float, bias: np.ndarray, causal: bool
) -> np.ndarray:
    """``Q K^T * scale + bias`` ``[B, N, S, T]``, the causal future at the lowest float."""
    s, t = q.shape[2], k.shape[2]
    scores = np.matmul(q, np.swapaxes(k, -1, -2)) * np.asarray(scale, q.dtype)
    scores = scores + bias
    if causal and s > 1:
        future = np.arange(t)[None, :] > (np.arange(s)[:, None] + (t - s))
        scores = np.where(future, np.finfo(np.float32).min, scores).astype(scores.dtype)
    return scores


def _attend(scores: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``softmax(scores) V`` for ``scores [B,N,S,T], v [B,N,T,Hv]`` -> ``[B, S, N*Hv]``."""
    scores = scores - scores.max(axis=-1, keepdims=True)
    e = np.exp(scores)
    probs = e / e.sum(axis=-1, keepdims=True)
    out = np.matmul(probs, v)
    b, n, s, hv = out.shape
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
    scores = _scores(q, k, scale or 1.0 / np.sqrt(h), add, bool(unidirectional))
    return _attend(scores, v).astype(x.dtype), present


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


def _shared_cache(
    past_key: np.ndarray,
    past_value: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    past_sequence_length: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, int]:
    """onnxruntime's shared past/present buffer ``[B, N, M, H]``: the presents (the pasts with
    the new ``L`` keys and values written at ``P``) and ``P``."""
    m, n_new = past_key.shape[2], k.shape[2]
    p = int(np.asarray(past_sequence_length).reshape(-1)[0])
    if not 0 <= p < m or p + n_new > m:
        raise KernelError(
            f"MultiHeadAttention: past_sequence_length {p} plus {n_new} new positions does not "
            f"fit the shared cache of max_sequence_length {m} (past_key's dimension 2); "
            f"give 0 <= past_sequence_length <= {m - n_new}"
        )
    present_k = past_key.astype(k.dtype)  # a copy: the caller's past is never written
    present_v = past_value.astype(v.dtype)
    present_k[:, :, p : p + n_new] = k
    present_v[:, :, p : p + n_new] = v
    return present_k, present_v, p


def _beam_sources(cache_indirection: np.ndarray, b: int, m: int, p: int) -> np.ndarray:
    """For batch-beam row ``r`` and past position ``j < p``, the row the past is read from:
    beam ``cache_indirection[r, j]`` of ``r``'s batch (``[B, p]``)."""
    ci = np.asarray(cache_indirection)
    if ci.ndim != 3 or ci.shape[0] * ci.shape[1] != b or ci.shape[2] != m:
        raise KernelError(
            f"MultiHeadAttention: cache_indirection of shape {list(ci.shape)}; expected "
            f"[batch, beams, max_sequence_length] with batch * beams = {b} (query's batch) "
            f"and max_sequence_length = {m} (past_key's dimension 2)"
        )
    w = ci.shape[1]
    beams = ci.reshape(b, m)[:, :p].astype(np.int64)
    if beams.size and (beams.min() < 0 or beams.max() >= w):
        raise KernelError(
            f"MultiHeadAttention: cache_indirection holds beam {int(beams.max())} or "
            f"{int(beams.min())}, outside [0, {w}) beams"
        )
    return (np.arange(b)[:, None] // w) * w + beams


def _beam_step(present: np.ndarray, new: np.ndarray, rows: np.ndarray, p: int) -> np.ndarray:
    """Keys (or values) ``[B, N, p + 1, H]`` of a one-token step: the past through the beam
    rows, then the new token's."""
    past = present[rows, :, np.arange(p)[None, :]]  # [B, p, N, H]
    return np.concatenate([past.transpose(0, 2, 1, 3), new], axis=2)


@kernel("MultiHeadAttention", domain=MS_DOMAIN, since=1)
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
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Attention over separate Q, K, V projections, with an optional KV cache (appended, or
    a shared buffer of ``max_sequence_length`` read through a beam search's indirection)."""
    w = _work(query)
    q, k, v, cross = _mha_inputs(query, key, value, bias, num_heads, w)
    b, _, s, h = q.shape
    has_past = past_key is not None and past_value is not None
    if has_past and past_sequence_length is not None and not cross:  # one shared buffer
        present_k, present_v, p = _shared_cache(past_key, past_value, k, v, past_sequence_length)
        t = p + k.shape[2]
        mask = None if key_padding_mask is None else np.asarray(key_padding_mask)
        beams = (
            cache_indirection is not None
            and s == 1
            and p > 0
            and h == v.shape[-1]
            and (mask is None or mask.shape == (b, t))
        )
        if beams:
            if attention_bias is not None and attention_bias.shape[0] != 1:
                raise KernelError(
                    "MultiHeadAttention: an attention_bias with a batch dimension together "
                    "with cache_indirection: onnxruntime's CPU kernel reads it per batch, not "
                    "per beam; give a bias of batch dimension 1, or no cache_indirection"
                )
            rows = _beam_sources(cache_indirection, b, present_k.shape[2], p)
            k, v = _beam_step(present_k, k, rows, p), _beam_step(present_v, v, rows, p)
        else:
            k, v = present_k[:, :, :t], present_v[:, :, :t]
    elif has_past:
        k = np.concatenate([past_key.astype(w), k], axis=2)
        v = np.concatenate([past_value.astype(w), v], axis=2)
        present_k, present_v = k, v
    else:
        present_k, present_v = k, v
    t = k.shape[2]
    add = _mask_bias(key_padding_mask, b, s, t, mask_filter_value)
    if attention_bias is not None:
        add = add + attention_bias.astype(np.float32)
    scores = _scores(q, k, scale or 1.0 / np.sqrt(h), add, bool(unidirectional))
    dt = query.dtype
    out = _attend(scores, v)
    return out.astype(dt), present_k.astype(dt), present_v.astype(dt), scores.astype(dt)
