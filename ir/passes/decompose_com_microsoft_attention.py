"""Attention and MultiHeadAttention (``com.microsoft``) written in standard ONNX ops, for the
decomposition mechanism of ``com_microsoft_decompose.py`` (which registers these builders).

Scaled dot-product attention over heads, as the CPU kernel computes it
(``backends/cpu/kernels/op_contrib_attention.py``)::

    proj = x @ W (+ bias)                      Attention only: Q, K, V from one projection
    q, k, v = Slice(proj) along the last axis  (MultiHeadAttention: its inputs, + bias slices)
    qh = Transpose(Reshape(q, [0, 0, N, h]), [0, 2, 1, 3])      [B, N, S, h]
    kt = Transpose(Reshape(k, [0, 0, N, h]), [0, 2, 3, 1])      [B, N, h, T]
    scores = MatMul(qh, kt) * scale (+ mask)
    out = Reshape(Transpose(MatMul(Softmax(scores), vh), [0, 2, 1, 3]), [0, 0, N * h])

The mask: no mask, or a raw ``[B, T]`` mask of integers (``mask_index`` /
``key_padding_mask``), as ``(1 - clip(float(m), 0, 1)) * mask_filter_value`` reshaped to
``[B, 1, 1, T]``: for integers that is the kernel's ``where(m > 0, 0, fill)``, in ops every
device here has (Cast, Min, Max, Sub, Mul; no comparison). Not decomposed (the node stays
whole on a device that runs it): past state or a present output that is read, an
``attention_bias``, ``unidirectional``, ``qkv_hidden_sizes``, rotary or shared buffers, the
other mask formats, packed or 4-D key/value, a hidden size that is not static or not a
multiple of ``num_heads``, or an input whose rank is not 3.

EmbedLayerNormalization (opset >= 17, for LayerNormalization)::

    s = Gather(word, ids) + P (+ Gather(segment, segment_ids))
    output = LayerNormalization(s, gamma, beta, axis=-1, epsilon); embedding_sum = s

with ``P = Gather(position, position_ids)``, or without position ids the first S rows of
the position table (``Slice``; S must be static). Not decomposed when its ``mask_index``
output is read (a count of non-zero mask entries, which no op here gives exactly).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.ir.dtypes import DType
from anychip.ir.value import Value

__all__ = ["attention", "multi_head_attention", "attention_shape", "embed_layer_norm"]


def _i64(b: Any, values: list[int], tag: str) -> Value:
    v = Value(b.names.fresh(f"{b.node.name}_{tag}"), const=np.array(values, np.int64))
    b.constants.append(v)
    return v


def _shaped(v: Value, shape: tuple | None, dtype: DType | None = None) -> Value:
    v.shape = shape
    if dtype is not None:
        v.dtype = dtype
    return v


def _slice_last(b: Any, x: Value, start: int, end: int) -> Value:
    ins = [x, _i64(b, [start], "s"), _i64(b, [end], "e"), _i64(b, [-1], "ax")]
    return _shaped(b.op("Slice", ins), (*x.shape[:-1], end - start))


def _heads(b: Any, x: Value, n: int, perm: list[int]) -> Value:
    bsz, s, d = x.shape
    split = _shaped(b.op("Reshape", [x, _i64(b, [0, 0, n, d // n], "heads")]), (bsz, s, n, d // n))
    shape = tuple(split.shape[i] for i in perm)
    return _shaped(b.op("Transpose", [split], perm=perm), shape)


def _mask_add(b: Any, mask: Value, fill: float) -> Value:
    """A raw ``[B, T]`` integer mask as the additive ``[B, 1, 1, T]`` float bias."""
    bsz, t = mask.shape
    m = _shaped(b.op("Cast", [mask], to=int(b.like.dtype)), (bsz, t), b.like.dtype)
    m = _shaped(b.op("Min", [m, b.const(1.0)]), (bsz, t))
    m = _shaped(b.op("Max", [m, b.const(0.0)]), (bsz, t))
    m = _shaped(b.op("Sub", [b.const(1.0), m]), (bsz, t))
    m = _shaped(b.op("Mul", [m, b.const(fill)]), (bsz, t))
    return _shaped(b.op("Reshape", [m, _i64(b, [0, 1, 1, -1], "mask")]), (bsz, 1, 1, t))


def _sdpa(b: Any, q: Value, k: Value, v: Value, mask: Value | None, out: Value) -> bool:
    """Attention over ``[B, S, D]`` q, k, v into ``out`` (``[B, S, D]``)."""
    n = int(b.node.attr("num_heads", 0))
    if n <= 0 or any(not isinstance(x.shape[-1], int) or x.shape[-1] % n for x in (q, k, v)):
        return False
    h = q.shape[-1] // n
    qh, kt = _heads(b, q, n, [0, 2, 1, 3]), _heads(b, k, n, [0, 2, 3, 1])
    vh = _heads(b, v, n, [0, 2, 1, 3])
    bsz, _, s, _ = qh.shape
    t = kt.shape[-1]
    scale = float(b.node.attr("scale", 0.0) or 0.0) or 1.0 / float(np.sqrt(h))
    scores = _shaped(b.op("MatMul", [qh, kt]), (bsz, n, s, t))
    scores = _shaped(b.op("Mul", [scores, b.const(scale)]), (bsz, n, s, t))
    if mask is not None:
        fill = float(b.node.attr("mask_filter_value", -10000.0))
        scores = _shaped(b.op("Add", [scores, _mask_add(b, mask, fill)]), (bsz, n, s, t))
    probs = _shaped(b.op("Softmax", [scores], axis=-1), (bsz, n, s, t))
    ctx = _shaped(b.op("MatMul", [probs, vh]), (bsz, n, s, vh.shape[-1]))
    ctx = _shaped(b.op("Transpose", [ctx], perm=[0, 2, 1, 3]), (bsz, s, n, vh.shape[-1]))
    b.op("Reshape", [ctx, _i64(b, [0, 0, n * vh.shape[-1]], "merge")], out)
    return True


def _plain(b: Any, mask: Value | None, outputs_read: list[Value | None]) -> bool:
    """Whether the node is in the decomposable form (see the module docstring)."""
    node = b.node
    if node.attr("unidirectional", 0) or any(
        o is not None and (o.uses or o in node.graph.outputs) for o in outputs_read
    ):
        return False
    if mask is not None and (mask.shape is None or len(mask.shape) != 2):
        return False
    return b.like.dtype == DType.FLOAT and b.like.shape is not None and len(b.like.shape) == 3


def _given(node: Any, i: int) -> Value | None:
    return node.inputs[i] if len(node.inputs) > i else None


def attention(b: Any) -> bool:
    """``com.microsoft::Attention``: one packed projection, then attention."""
    node = b.node
    x, w, bias, mask = (_given(node, i) for i in range(4))
    if any(_given(node, i) is not None for i in range(4, 7)) or node.attr("qkv_hidden_sizes"):
        return False  # past, attention_bias, past_sequence_length
    if node.attr("do_rotary", 0) or node.attr("past_present_share_buffer", 0):
        return False
    if not _plain(b, mask, list(node.outputs[1:])) or w.shape is None or len(w.shape) != 2:
        return False
    d3 = w.shape[1]
    if not isinstance(d3, int) or d3 % 3:
        return False
    proj = _shaped(b.op("MatMul", [x, w]), (*x.shape[:2], d3))
    if bias is not None:
        proj = _shaped(b.op("Add", [proj, bias]), proj.shape)
    d = d3 // 3
    q, k, v = (_slice_last(b, proj, i * d, (i + 1) * d) for i in range(3))
    return _sdpa(b, q, k, v, mask, b.outputs[0])


def multi_head_attention(b: Any) -> bool:
    """``com.microsoft::MultiHeadAttention`` with separate ``[B, L, D]`` query, key, value."""
    node = b.node
    q, k, v, bias, mask = (_given(node, i) for i in range(5))
    if any(_given(node, i) is not None for i in range(5, 10)):
        return False  # attention_bias, past key/value, past_sequence_length, cache
    if k is None or v is None or k.shape is None or v.shape is None:
        return False
    if len(k.shape) != 3 or len(v.shape) != 3 or not _plain(b, mask, list(node.outputs[1:])):
        return False
    if bias is not None:
        dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
        if not all(isinstance(d, int) for d in (dq, dk, dv)):
            return False
        parts = [(q, 0, dq), (k, dq, dq + dk), (v, dq + dk, dq + dk + dv)]
        q, k, v = (
            _shaped(b.op("Add", [x, _slice_last(b, bias, lo, hi)]), x.shape) for x, lo, hi in parts
        )
    return _sdpa(b, q, k, v, mask, b.outputs[0])


def attention_shape(node: Any) -> tuple | None:
    """Output 0's shape of an Attention or MultiHeadAttention node, where it can be told."""
    x = node.inputs[0]
    if x is None or x.shape is None or len(x.shape) != 3:
        return None
    if node.op_type == "Attention":
        w = _given(node, 1)
        if w is None or w.shape is None or not isinstance(w.shape[-1], int):
            return None
        sizes = node.attr("qkv_hidden_sizes")
        dv = sizes[2] if sizes else w.shape[-1] // 3
        return (*x.shape[:2], dv)
    v = _given(node, 2)
    if v is None or v.shape is None or len(v.shape) != 3:
        return None
    return (*x.shape[:2], v.shape[-1])


def embed_layer_norm(b: Any) -> bool:
    """``com.microsoft::EmbedLayerNormalization`` (see the module docstring)."""
    node = b.node
    ids, seg_ids, word, pos, seg, gamma, beta, _mask, pos_ids = (_given(node, i) for i in range(9))
    outs = list(node.outputs) + [None] * (3 - len(node.outputs))
    if b.opset < 17 or (outs[1] is not None and (outs[1].uses or outs[1] in node.graph.outputs)):
        return False
    if ids.shape is None or len(ids.shape) != 2 or word.shape is None or word.dtype != DType.FLOAT:
        return False
    bsz, seq = ids.shape
    d = word.shape[-1]
    like, b.like = b.like, word  # the constants and fresh values are of the table's type
    try:
        total = _shaped(b.op("Gather", [word, ids], axis=0), (bsz, seq, d))
        if pos_ids is not None:
            p = _shaped(b.op("Gather", [pos, pos_ids], axis=0), (*pos_ids.shape, d))
        elif isinstance(seq, int):
            p = _shaped(b.op("Slice", [pos, *(_i64(b, [v], "p") for v in (0, seq, 0))]), (seq, d))
        else:
            return False
        total = _shaped(b.op("Add", [total, p]), (bsz, seq, d))
        if seg is not None and seg_ids is not None:
            g = _shaped(b.op("Gather", [seg, seg_ids], axis=0), (bsz, seq, d))
            total = _shaped(b.op("Add", [total, g]), (bsz, seq, d), None)
        if outs[2] is not None:
            total = b.op("Identity", [total], b.outputs[2])
        eps = float(node.attr("epsilon", 1e-12))
        b.op("LayerNormalization", [total, gamma, beta], b.outputs[0], axis=-1, epsilon=eps)
        return True
    finally:
        b.like = like
