"""LayerNormalization (opset 17): normalise over the axes from ``axis`` to the end."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native.rows import layer_norm_rows
from anychip.backends.cpu.replay import record as _replay
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = ["layer_normalization", "layer_normalization_node"]

_FLOATS = frozenset({DType.FLOAT, DType.DOUBLE, DType.FLOAT16, DType.BFLOAT16})


@kernel("LayerNormalization", since=17, dtypes=_FLOATS, context=True)
def layer_normalization_node(
    ctx: Any,
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,  # named: the executor hands planned memory to an ``out``
    **attrs: Any,
) -> Any:
    """``layer_normalization`` for a node: Mean and InvStdDev made only where the node uses
    them (the exporters' nodes have Y alone)."""
    stats = any(ctx.outputs_used[1:])
    done = layer_normalization(x, scale, b, out=out, stats=stats, **attrs)
    return done if stats else done[0]


def layer_normalization(
    x: np.ndarray,
    scale: np.ndarray,
    b: np.ndarray | None = None,
    *,
    axis: int = -1,
    epsilon: float = 1e-5,
    stash_type: int = 1,
    out: np.ndarray | None = None,
    stats: bool = True,
):
    """``Y = (X - mean) / sqrt(var + eps) * scale + B``; also Mean and InvStdDev (``stats``
    false: the C path leaves them out, None in their places).

    Statistics are computed in the ``stash_type`` precision (float32 by default) and keep the
    normalised axes as size-1 dimensions.
    """
    a = axis + x.ndim if axis < 0 else axis
    if not 0 <= a < max(x.ndim, 1):
        raise KernelError(f"LayerNormalization: axis {axis} is out of range for rank {x.ndim}")
    try:
        stash = DType(stash_type).numpy
    except ValueError:
        raise KernelError(
            f"LayerNormalization: stash_type {stash_type} is not a tensor type"
        ) from None
    if x.dtype == np.float32 and stash == np.float32:
        done = layer_norm_rows(x, scale, b, epsilon, a, out, stats=stats)
        if done is not None:  # generated C, bit-identical to the steps below
            _replay.seal()  # its one call, noted there: all the node does
            return done
    axes = tuple(range(a, x.ndim))
    xs = x.astype(stash, copy=False)
    # np.mean's own steps (a sum, then a division by the count), without its Python wrapper:
    # a transformer export runs this on [S, 32] rows, where the wrapper was a third of the time.
    one = np.dtype(stash).type
    count = one(math.prod(x.shape[a:]))
    mean = np.add.reduce(xs, axis=axes, keepdims=True)
    np.divide(mean, count, out=mean)
    centered = xs - mean
    var = np.add.reduce(np.multiply(centered, centered), axis=axes, keepdims=True)
    np.divide(var, count, out=var)
    np.add(var, one(epsilon), out=var)
    inv_std = np.divide(one(1), np.sqrt(var, out=var), out=var)
    centered *= inv_std
    if x.dtype == stash and fits(out, x.shape, x.dtype):
        y = np.multiply(centered, scale.astype(stash, copy=False), out=out)
    else:
        y = centered * scale.astype(stash, copy=False)
    if b is not None:
        y += b.astype(stash, copy=False)
    return y.astype(x.dtype, copy=False), mean, inv_std
