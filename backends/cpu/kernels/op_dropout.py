"""Dropout: the identity at inference; random masking in training mode.

Opsets 1-6 train unless ``is_test=1``; opsets 7-11 always infer; from opset 12 the optional
``training_mode`` input decides and ``ratio`` is an input. The mask output is bool from opset
10 and of the data type before. At inference the mask is all ones from opset 12 and all zeros
in opsets 7-11, as onnxruntime fills it (its opset 7-11 Dropout is its identity kernel, which
zeroes the mask; onnx's reference evaluator gives ones there: onnxruntime is the reference).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["dropout_legacy", "dropout_v7", "dropout_v10", "dropout"]

_FLOATS = frozenset(
    {
        DType.FLOAT,
        DType.DOUBLE,
        DType.FLOAT16,
        DType.BFLOAT16,
        DType.FLOAT8E4M3FN,
        DType.FLOAT8E4M3FNUZ,
        DType.FLOAT8E5M2,
        DType.FLOAT8E5M2FNUZ,
    }
)


def _apply(
    ctx,
    x: np.ndarray,
    ratio: float,
    training: bool,
    seed: int | None,
    mask_dtype,
    kept: int = 1,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    if not 0.0 <= ratio < 1.0 and training:
        raise KernelError(f"Dropout: ratio must be in [0, 1) in training mode, got {ratio}")
    if not training or ratio == 0.0:
        # the identity: a view (the kernel is registered alias=True: the planner keeps x
        # alive while it lives; the session copies an output that views a feed), and an
        # all-ones mask as a read-only broadcast of one element. Copying x and filling a
        # mask took SqueezeNet's Dropout 19.7 us a call, this 3.9 (warm, 1 thread).
        out = x.view()
        if ctx.num_outputs < 2:
            return out
        return out, _filled(x.shape, np.dtype(mask_dtype), kept)
    # The legacy RandomState stream, so a seeded node reproduces onnx's reference output.
    rng = np.random.RandomState(seed)
    keep = rng.uniform(0.0, 1.0, x.shape) >= ratio
    out = (x * keep / np.asarray(1.0 - ratio, dtype=x.dtype)).astype(x.dtype)
    if ctx.num_outputs < 2:
        return out
    return out, keep.astype(mask_dtype)


@lru_cache(maxsize=64)
def _filled(shape: tuple[int, ...], dtype: np.dtype, value: int) -> np.ndarray:
    """The mask of ``shape`` all ``value``, read-only, made once per shape and dtype: SqueezeNet's
    Dropout (whose mask nothing reads) spent 33-49 us a run in a session on
    ``np.broadcast_to`` (5 us warm, the rest a cold interpreter after the convolutions), 3 us
    without it."""
    return np.broadcast_to(np.full((), value, dtype), shape)


@kernel("Dropout", since=1, dtypes=_FLOATS, context=True, alias=True)
def dropout_legacy(ctx, data, *, ratio: float = 0.5, is_test: int = 0, consumed_inputs=None):
    """Opsets 1-6: training unless ``is_test``; the mask has the data's type."""
    return _apply(ctx, data, ratio, not is_test, None, data.dtype)


@kernel("Dropout", since=7, dtypes=_FLOATS, context=True, alias=True)
def dropout_v7(ctx, data, *, ratio: float = 0.5):
    """Opsets 7-9: inference (identity); the mask has the data's type (zeros)."""
    return _apply(ctx, data, ratio, False, None, data.dtype, kept=0)


@kernel("Dropout", since=10, dtypes=_FLOATS, context=True, alias=True)
def dropout_v10(ctx, data, *, ratio: float = 0.5):
    """Opsets 10-11: inference (identity); the mask is bool (false)."""
    return _apply(ctx, data, ratio, False, None, np.bool_, kept=0)


@kernel("Dropout", since=12, dtypes=_FLOATS, context=True, alias=True)
def dropout(ctx, data, ratio=None, training_mode=None, *, seed: int | None = None):
    """Opset 12+: ``ratio`` (default 0.5) and ``training_mode`` (default false) are inputs."""
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(()))
    return _apply(ctx, data, r, training, seed, np.bool_)
