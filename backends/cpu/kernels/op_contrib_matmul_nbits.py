"""``com.microsoft`` MatMulNBits: ``A @ dequantize(B).T + bias`` with B quantized block-wise
along K to ``bits`` bits (onnxruntime's weight-only quantization of LLM exports).

B is ``uint8 [N, k_blocks, blob]``, values packed low bits first within each byte; the zero
points are packed the same way per row (``uint8 [N, ceil(k_blocks * bits / 8)]``) or given
unpacked in A's type (``[N, k_blocks]``), 2^(bits-1) when absent; ``g_idx`` (deprecated) maps
each k to its block. The weight is dequantized on each call (a reference kernel: no cache) and
the product runs in float32 (float64 for double scales), cast to A's type.
Widths whose values cross byte edges (3, 5, 6, 7 bits) are refused.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["matmul_nbits", "dequantize_nbits"]


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The ``count`` values of ``bits`` bits along the last axis of ``packed`` (uint8)."""
    per = 8 // bits
    shifts = (np.arange(per, dtype=np.uint8) * bits).astype(np.uint8)
    vals = (packed[..., None] >> shifts) & np.uint8((1 << bits) - 1)
    return vals.reshape(*packed.shape[:-1], -1)[..., :count]


def dequantize_nbits(
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None,
    g_idx: np.ndarray | None,
    *,
    K: int,
    N: int,
    bits: int,
    block_size: int,
) -> np.ndarray:
    """The float weight ``[N, K]`` (in the scales' type) of MatMulNBits' packed ``b``."""
    if bits not in (2, 4, 8):
        raise KernelError(
            f"MatMulNBits: bits={bits} is not supported (2, 4 and 8 are); requantize the "
            "weights to one of those or run the model with onnxruntime"
        )
    k_blocks = -(-K // block_size)
    b = np.asarray(b, np.uint8).reshape(N, k_blocks, -1)
    q = _unpack(b, bits, block_size).reshape(N, k_blocks * block_size)[:, :K]
    work = np.float64 if scales.dtype == np.float64 else np.float32
    scale = np.asarray(scales, work).reshape(N, k_blocks)
    if zero_points is None:
        zp = np.full((N, k_blocks), 1 << (bits - 1), work)
    elif zero_points.dtype == np.uint8:
        zp = _unpack(zero_points.reshape(N, -1), bits, k_blocks).astype(work)
    else:
        zp = np.asarray(zero_points, work).reshape(N, k_blocks)
    block = (np.arange(K) // block_size) if g_idx is None else np.asarray(g_idx, np.int64)
    return (q.astype(work) - zp[:, block]) * scale[:, block]


@kernel("MatMulNBits", domain=MS_DOMAIN, since=1)
def matmul_nbits(
    a: np.ndarray,
    b: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray | None = None,
    g_idx: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    K: int,
    N: int,
    bits: int = 4,
    block_size: int,
    accuracy_level: int = 0,
) -> np.ndarray:
    """``Y = A @ W.T (+ bias)``, W the dequantized ``[N, K]`` weight."""
    if a.shape[-1] != K:
        raise KernelError(f"MatMulNBits: A's last axis is {a.shape[-1]}, the node's K is {K}")
    w = dequantize_nbits(b, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    work = w.dtype
    y = np.matmul(a.astype(work, copy=False), w.T)
    if bias is not None:
        y = y + np.asarray(bias, work)
    return y.astype(a.dtype, copy=False)
