"""``com.microsoft`` ops of onnxruntime's transformer optimizer, except attention.

Gelu, FastGelu, BiasGelu, QuickGelu, FusedMatMul, FusedGemm, LayerNormalization (the pre-17
contrib op), SimplifiedLayerNormalization, SkipLayerNormalization,
SkipSimplifiedLayerNormalization and EmbedLayerNormalization. Each is the composition of
standard ops its onnxruntime spec states; statistics run in float32 (float64 for double), as
onnxruntime's CPU kernels do.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.kernels.op_activations import gelu
from anychip.backends.cpu.kernels.op_layer_normalization import layer_normalization
from anychip.backends.cpu.kernels.op_rnn import make_activation
from anychip.backends.cpu.native.rows import skip_layer_norm_rows
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = [
    "ms_gelu",
    "fast_gelu",
    "bias_gelu",
    "quick_gelu",
    "fused_matmul",
    "fused_gemm",
    "ms_layer_normalization",
    "simplified_layer_normalization",
    "skip_layer_normalization",
    "skip_simplified_layer_normalization",
    "embed_layer_normalization",
]


def _work(x: np.ndarray) -> np.dtype:
    return np.dtype(np.float64) if x.dtype == np.float64 else np.dtype(np.float32)


@kernel("Gelu", domain=MS_DOMAIN, since=1)
def ms_gelu(x: np.ndarray) -> np.ndarray:
    return gelu(x)


@kernel("BiasGelu", domain=MS_DOMAIN, since=1)
def bias_gelu(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return gelu(a + b)


@kernel("FastGelu", domain=MS_DOMAIN, since=1)
def fast_gelu(x: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """The tanh approximation of Gelu, of ``x + bias``."""
    v = (x if bias is None else x + bias).astype(_work(x))
    y = 0.5 * v * (1.0 + np.tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))
    return y.astype(x.dtype)


@kernel("QuickGelu", domain=MS_DOMAIN, since=1)
def quick_gelu(x: np.ndarray, *, alpha: float = 1.702) -> np.ndarray:
    v = x.astype(_work(x))
    return (v / (1.0 + np.exp(-alpha * v))).astype(x.dtype)


def _swap_last(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2) if a.ndim >= 2 else a


def _trans_batch(a: np.ndarray) -> np.ndarray:
    """onnxruntime's transBatch: ``[B, M, K]`` (batch dims first) read as ``[M, B, K]``."""
    if a.ndim < 3:
        return a
    return np.moveaxis(a, 0, -2)


@kernel("FusedMatMul", domain=MS_DOMAIN, since=1)
def fused_matmul(
    a: np.ndarray,
    b: np.ndarray,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    transBatchA: int = 0,
    transBatchB: int = 0,
) -> np.ndarray:
    """``alpha * op(A) @ op(B)``: transposes of the last two axes and of the batch axes."""
    if transBatchA:
        a = _trans_batch(a)
    if transBatchB:
        b = _trans_batch(b)
    if transA:
        a = _swap_last(a)
    if transB:
        b = _swap_last(b)
    y = np.matmul(a, b)
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype)
    return y.astype(a.dtype, copy=False)


_ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid", "Elu", "Softsign")


def _activate(y: np.ndarray, name: str, a: float | None, b: float | None) -> np.ndarray:
    """A fused op's activation: the recurrent ops' table (``op_rnn.make_activation``)."""
    if name not in _ACTIVATIONS:
        raise KernelError(
            f"FusedGemm: activation {name!r} is not supported (supported: {list(_ACTIVATIONS)})"
        )
    return make_activation(name, a, b)(y)


def _lean_gemm(a, b, c, alpha, beta, trans_a, trans_b, activation, out) -> np.ndarray | None:
    if alpha != 1.0 or beta != 1.0 or activation not in (None, "Relu"):
        return None
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype or a.dtype.kind != "f":
        return None
    aa, bb = (a.T if trans_a else a), (b.T if trans_b else b)
    shape = (aa.shape[0], bb.shape[1])
    if aa.shape[1] != bb.shape[0]:
        return None  # the general path words the error
    if c is not None and (c.dtype != a.dtype or c.ndim > 2 or _widens(c.shape, shape)):
        return None
    y = out if fits(out, shape, a.dtype) else _replay.empty(shape, a.dtype)
    _gemm_into(aa, bb, c, y, bool(activation))
    if _replay.ACTIVE:  # its one call: all the node does (a replay makes it again)
        _replay.note(_gemm_into, (aa, bb, c, y, bool(activation)))
        _replay.seal()
    return y


def _gemm_into(
    a: np.ndarray, b: np.ndarray, c: np.ndarray | None, y: np.ndarray, relu: bool
) -> None:
    """``y = relu?(a @ b + c)`` in ``y``: the lean FusedGemm, noted whole for a replay."""
    np.matmul(a, b, out=y)
    if c is not None:
        np.add(y, c, out=y)
    if relu:
        np.maximum(y, 0, out=y)


def _widens(c_shape: tuple[int, ...], shape: tuple[int, int]) -> bool:
    """Whether a bias of ``c_shape`` does not broadcast into ``shape`` without growing it."""
    pad = (1,) * (2 - len(c_shape)) + tuple(c_shape)
    return any(d not in (1, s) for d, s in zip(pad, shape))


@kernel("FusedGemm", domain=MS_DOMAIN, since=1)
def fused_gemm(
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    activation: str | None = None,
    activation_alpha: float | None = None,
    activation_beta: float | None = None,
    activation_gamma: float | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``activation(alpha * op(A) @ op(B) + beta * C)`` (Gemm followed by an activation).

    The fusion pass's form (alpha = beta = 1, 2-D float operands, a bias of at most two axes
    that does not widen the product) runs in place in the planned ``out``: the product, the
    bias add and a Relu, each the value the unfused MatMul, Add and Relu give."""
    lean = _lean_gemm(a, b, c, alpha, beta, transA, transB, activation, out)
    if lean is not None:
        return lean
    y = np.matmul(a.T if transA else a, b.T if transB else b) * np.asarray(alpha, a.dtype)
    if c is not None:
        y = y + np.asarray(beta, a.dtype) * c
    if activation:
        y = _activate(y, activation, activation_alpha, activation_beta)
    return y.astype(a.dtype, copy=False)


@kernel("LayerNormalization", domain=MS_DOMAIN, since=1)
def ms_layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """onnxruntime's LayerNormalization before ONNX opset 17: the same op, but Y has the
    scale's type (onnxruntime's type ``V``: float16 X with float32 scale gives float32 Y)."""
    if scale.dtype != x.dtype and scale.dtype.itemsize > x.dtype.itemsize:
        x = x.astype(scale.dtype)
    y, mean, inv = layer_normalization(
        x, scale, b, axis=axis, epsilon=epsilon, stash_type=stash_type
    )
    return y.astype(scale.dtype, copy=False), mean, inv


def _rms_norm(v: np.ndarray, gamma: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + eps)
    return v * inv * gamma.astype(v.dtype), inv


@kernel("SimplifiedLayerNormalization", domain=MS_DOMAIN, since=1)
def simplified_layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """RMS normalisation over the last axes from ``axis``: ``x / rms(x) * scale``."""
    a = axis + x.ndim if axis < 0 else axis
    lead = x.shape[:a]
    v = x.astype(_work(x)).reshape(*lead, -1)
    y, inv = _rms_norm(v, scale.reshape(-1), epsilon)
    inv_shape = lead + (1,) * (x.ndim - a)
    # Y has the scale's type (onnxruntime's type V)
    return y.reshape(x.shape).astype(scale.dtype), inv.reshape(inv_shape).astype(np.float32)


def _layer_norm_last(
    v: np.ndarray, gamma: np.ndarray, beta: np.ndarray | None, eps: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = v.mean(axis=-1, keepdims=True)
    centered = v - mean
    inv = 1.0 / np.sqrt(np.mean(centered * centered, axis=-1, keepdims=True) + eps)
    y = centered * inv * gamma.astype(v.dtype)
    if beta is not None:
        y = y + beta.astype(v.dtype)
    return y, mean, inv


@kernel("SkipLayerNormalization", domain=MS_DOMAIN, since=1, context=True)
def skip_layer_normalization_node(ctx: Any, *args: np.ndarray | None, **attrs: Any) -> Any:
    """``skip_layer_normalization`` for a node: the statistics and the sum made only where
    the node uses them (None in the others' places; Y alone for a node of one output)."""
    used = ctx.outputs_used
    stats, total = any(used[1:3]), any(used[3:4])
    done = skip_layer_normalization(*args, stats=stats, total=total, **attrs)
    return done[0] if len(used) == 1 else done


def skip_layer_normalization(
    x: np.ndarray,
    skip: np.ndarray,
    gamma: np.ndarray,
    beta: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    epsilon: float = 1e-12,
    stats: bool = True,
    total: bool = True,
) -> tuple[np.ndarray | None, ...]:
    """LayerNormalization over the last axis of ``input + skip (+ bias)``; the sum is the
    fourth output. Float32 without ``bias`` (what ``passes/fuse_skip_layer_norm.py`` writes
    for an Add and a LayerNormalization): one C call, the unfused nodes' roundings, the
    statistics and the sum left out (None) where ``stats`` / ``total`` are false."""
    if bias is None and x.dtype == np.float32:
        done = skip_layer_norm_rows(x, skip, gamma, beta, epsilon, stats=stats, total=total)
        if done is not None:
            _replay.seal()  # the one C call, noted there: all the node does
            return done
    s = x.astype(_work(x)) + skip.astype(_work(x))
    if bias is not None:
        s = s + bias.astype(s.dtype)
    y, mean, inv = _layer_norm_last(s, gamma, beta, epsilon)
    f32 = np.float32
    return y.astype(x.dtype), mean.astype(f32), inv.astype(f32), s.astype(x.dtype)


@kernel("SkipSimplifiedLayerNormalization", domain=MS_DOMAIN, since=1)
def skip_simplified_layer_normalization(
    x: np.ndarray,
    skip: np.ndarray,
    gamma: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    epsilon: float = 1e-12,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    s = x.astype(_work(x)) + skip.astype(_work(x))
    if bias is not None:
        s = s + bias.astype(s.dtype)
    y, inv = _rms_norm(s, gamma, epsilon)
    mean = np.zeros_like(inv, dtype=np.float32)
    return y.astype(x.dtype), mean, inv.astype(np.float32), s.astype(x.dtype)


def _lookup(table: np.ndarray, idx: np.ndarray, name: str) -> np.ndarray:
    if idx.size and (idx.min() < 0 or idx.max() >= table.shape[0]):
        raise KernelError(
            f"EmbedLayerNormalization: {name} has indices outside [0, {table.shape[0]})"
        )
    return table[idx]


@kernel("EmbedLayerNormalization", domain=MS_DOMAIN, since=1)
def embed_layer_normalization(
    input_ids: np.ndarray,
    segment_ids: np.ndarray | None,
    word_embedding: np.ndarray,
    position_embedding: np.ndarray,
    segment_embedding: np.ndarray | None,
    gamma: np.ndarray,
    beta: np.ndarray,
    mask: np.ndarray | None = None,
    position_ids: np.ndarray | None = None,
    *,
    epsilon: float = 1e-12,
    mask_index_type: int = 1,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Word + position (+ segment) embeddings, then LayerNormalization over the hidden axis.

    ``mask_index`` (when ``mask_index_type`` is 1) is the count of non-zero mask entries per
    batch row, as int32 (zeros without a mask), as onnxruntime computes it.
    """
    ids = input_ids.astype(np.int64)
    batch, seq = ids.shape
    if position_ids is None:
        pos = np.broadcast_to(np.arange(seq), (batch, seq))
    else:
        pos = np.broadcast_to(position_ids.astype(np.int64), (batch, seq))
    # the sum in float32 (float64 for double), as onnxruntime adds float16 tables
    work = _work(word_embedding)
    v = _lookup(word_embedding, ids, "input_ids").astype(work)
    v += _lookup(position_embedding, pos, "positions").astype(work)
    if segment_embedding is not None and segment_ids is not None:
        v += _lookup(segment_embedding, segment_ids.astype(np.int64), "segment_ids").astype(work)
    y, _, _ = _layer_norm_last(v, gamma, beta, epsilon)
    s = v.astype(word_embedding.dtype)
    if mask is not None and mask_index_type == 1:
        mask_index = np.count_nonzero(mask, axis=-1).astype(np.int32)
    else:
        mask_index = np.zeros((batch,), np.int32)
    return y.astype(word_embedding.dtype), mask_index, s


# The fusion pass (``passes/fuse_gemm.py``) makes FusedGemm only where this kernel is fast:
# its lean form writes into planned memory as the unfused MatMul did, one dispatch fewer.
fused_gemm.fast = True  # type: ignore[attr-defined]
