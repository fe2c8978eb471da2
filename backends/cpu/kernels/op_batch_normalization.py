"""BatchNormalization in inference and training form, for every opset from 1.

Inference folds the statistics into one scale and shift per channel (``y = x * a + b``), so a
float32 activation costs one multiply-add. Opsets 1-7 may set ``spatial=0``: then the
statistics have one value per (C, *spatial) element instead of per channel.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["batch_normalization_legacy", "batch_normalization"]

_FLOATS = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})


def _stat_shape(x: np.ndarray, stat: np.ndarray, spatial: int) -> tuple[int, ...]:
    if spatial or stat.ndim == 1 and x.ndim > 2 and stat.shape[0] == x.shape[1]:
        return (1, -1) + (1,) * (x.ndim - 2)
    return (1,) + stat.shape


def inference_constants(
    scale: np.ndarray,
    b: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    epsilon: float,
    dt: np.dtype,
) -> tuple[np.ndarray, np.ndarray]:
    """``(a, shift)`` of the inference form ``y = x * a + shift``, computed in ``dt`` (the
    kernel's and ``passes/lower_batch_norm``'s, so the lowered graph gives the same bits)."""
    a = scale.astype(dt) / np.sqrt(var.astype(dt) + np.asarray(epsilon, dt))
    return a, b.astype(dt) - mean.astype(dt) * a


def _infer(x, scale, b, mean, var, epsilon, spatial, out=None) -> np.ndarray:
    if x.ndim < 2:
        raise KernelError(
            f"BatchNormalization needs an input (N, C, ...) of rank >= 2, got shape {x.shape}"
        )
    dt = x.dtype
    shape = _stat_shape(x, scale, spatial)
    a, shift = inference_constants(scale, b, mean, var, epsilon, dt)
    if fits(out, x.shape, dt):  # in place over x is fine: each step is element-wise
        np.multiply(x, a.reshape(shape), out=out)
        return np.add(out, shift.reshape(shape), out=out)
    return x * a.reshape(shape) + shift.reshape(shape)


def _train(x, scale, b, mean, var, epsilon, momentum):
    """Normalise with the batch statistics; also the updated running statistics."""
    dt = x.dtype
    axes = (0,) + tuple(range(2, x.ndim))
    cur_mean = np.mean(x, axis=axes, dtype=dt)
    cur_var = np.var(x, axis=axes, dtype=dt)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    inv = np.asarray(1, dt) / np.sqrt(cur_var + np.asarray(epsilon, dt))
    y = (x - cur_mean.reshape(shape)) * (inv * scale.astype(dt)).reshape(shape)
    y = y + b.astype(dt).reshape(shape)
    mom = np.asarray(momentum, mean.dtype)
    one = np.asarray(1, mean.dtype)
    run_mean = mean * mom + cur_mean.astype(mean.dtype) * (one - mom)
    run_var = var * mom + cur_var.astype(var.dtype) * (one - mom)
    return y, run_mean, run_var, cur_mean, cur_var


@kernel("BatchNormalization", since=1, dtypes=_FLOATS, context=True, inplace=True)
def batch_normalization_legacy(
    ctx,
    x,
    scale,
    b,
    mean,
    var,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    spatial: int = 1,
    is_test: int = 0,
    consumed_inputs=None,
    out=None,
):
    """Opsets 1-13: five outputs; more than one requested output means training mode."""
    if ctx.num_outputs <= 1 or is_test:
        return _infer(x, scale, b, mean, var, epsilon, spatial, out)
    y, run_mean, run_var, saved_mean, saved_var = _train(x, scale, b, mean, var, epsilon, momentum)
    return (y, run_mean, run_var, saved_mean, saved_var)[: ctx.num_outputs]


@kernel("BatchNormalization", since=14, dtypes=_FLOATS, inplace=True)
def batch_normalization(
    x,
    scale,
    b,
    input_mean,
    input_var,
    *,
    epsilon: float = 1e-5,
    momentum: float = 0.9,
    training_mode: int = 0,
    out=None,
):
    """Opset 14+: ``training_mode=1`` also returns the running mean and variance."""
    if not training_mode:
        return _infer(x, scale, b, input_mean, input_var, epsilon, 1, out)
    y, run_mean, run_var, _, _ = _train(x, scale, b, input_mean, input_var, epsilon, momentum)
    return y, run_mean, run_var
