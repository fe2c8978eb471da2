"""``com.microsoft`` QAttention and QEmbedLayerNormalization: what onnxruntime's dynamic
quantizer makes of a fused BERT's Attention and EmbedLayerNormalization. Both dequantize their
integer inputs and run the float op (``op_contrib_attention``, ``op_contrib_transformer``);
onnxruntime's integer GEMM accumulates exactly, so results agree to float rounding."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_contrib_attention import ms_attention
from anychip.backends.cpu.kernels.op_contrib_transformer import embed_layer_normalization
from anychip.backends.cpu.table import kernel
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["q_attention", "q_embed_layer_normalization"]


def _deq(
    q: np.ndarray | None, scale: np.ndarray | None, zp: np.ndarray | None
) -> np.ndarray | None:
    if q is None:
        return None
    v = q.astype(np.float32)
    if zp is not None:
        v = v - zp.astype(np.float32)
    return v * (np.float32(1) if scale is None else scale.astype(np.float32))


@kernel("QAttention", domain=MS_DOMAIN, since=1)
def q_attention(
    x: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    input_scale: np.ndarray,
    weight_scale: np.ndarray,
    mask_index: np.ndarray | None = None,
    input_zero_point: np.ndarray | None = None,
    weight_zero_point: np.ndarray | None = None,
    past: np.ndarray | None = None,
    *,
    num_heads: int,
    unidirectional: int = 0,
    do_rotary: int = 0,
    past_present_share_buffer: int = 0,
    mask_filter_value: float = -10000.0,
    scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Attention over the dequantized input and weights (weight scale per tensor or per
    output column)."""
    w_zp = None if weight_zero_point is None else weight_zero_point.reshape(1, -1)
    w_scale = weight_scale.reshape(1, -1) if weight_scale.size > 1 else weight_scale
    return ms_attention(
        _deq(x, input_scale, input_zero_point),
        _deq(weight, w_scale, w_zp),
        bias,
        mask_index,
        past,
        num_heads=num_heads,
        unidirectional=unidirectional,
        do_rotary=do_rotary,
        past_present_share_buffer=past_present_share_buffer,
        mask_filter_value=mask_filter_value,
        scale=scale,
    )


@kernel("QEmbedLayerNormalization", domain=MS_DOMAIN, since=1)
def q_embed_layer_normalization(
    input_ids: np.ndarray,
    segment_ids: np.ndarray | None,
    word_embedding: np.ndarray,
    position_embedding: np.ndarray,
    segment_embedding: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mask: np.ndarray | None,
    word_embedding_scale: np.ndarray,
    position_embedding_scale: np.ndarray,
    segment_embedding_scale: np.ndarray | None,
    gamma_scale: np.ndarray,
    beta_scale: np.ndarray,
    word_embedding_zero_point: np.ndarray,
    position_embedding_zero_point: np.ndarray,
    segment_embedding_zero_point: np.ndarray | None,
    gamma_zero_point: np.ndarray,
    beta_zero_point: np.ndarray,
    *,
    epsilon: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray]:
    """EmbedLayerNormalization over dequantized tables, gamma and beta."""
    out, mask_index, _ = embed_layer_normalization(
        input_ids,
        segment_ids,
        _deq(word_embedding, word_embedding_scale, word_embedding_zero_point),
        _deq(position_embedding, position_embedding_scale, position_embedding_zero_point),
        _deq(segment_embedding, segment_embedding_scale, segment_embedding_zero_point),
        _deq(gamma, gamma_scale, gamma_zero_point),
        _deq(beta, beta_scale, beta_zero_point),
        mask,
        epsilon=epsilon,
    )
    return out, mask_index
