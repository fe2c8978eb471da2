"""Split: cut the input along ``axis`` into ``split`` sizes, or into the node's number of
outputs (opset 18: ``num_outputs``, the last piece smaller when it does not divide)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axis
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["split_v1", "split_v2", "split_v13", "split"]


def _split(data: np.ndarray, axis: int, sizes: list[int] | None, count: int) -> tuple:
    a = norm_axis(axis, data.ndim, "Split")
    dim = data.shape[a]
    if sizes is None:
        if count < 1:
            raise KernelError("Split: the node has no outputs")
        chunk = -(-dim // count)
        sizes = [min(chunk, max(dim - i * chunk, 0)) for i in range(count)]
    if sum(sizes) != dim or any(s < 0 for s in sizes):
        raise KernelError(f"Split: sizes {sizes} do not add up to {dim}, the size of axis {a}")
    if len(sizes) != count:
        raise KernelError(f"Split: {len(sizes)} sizes given for a node with {count} outputs")
    # views, as np.split gives, without its Python wrapper (17 us for three pieces of GPT-2's
    # [1, 128, 96] QKV, 2 us sliced)
    lead, parts, start = (slice(None),) * a, [], 0
    for size in sizes:
        parts.append(data[lead + (slice(start, start + size),)])
        start += size
    return tuple(parts)


@kernel("Split", since=1, context=True, alias=True)
def split_v1(
    ctx, data, split_input=None, *, axis: int | None = None, split: list[int] | None = None
):
    """Opset 1: sizes from the optional second input or the ``split`` attribute."""
    sizes = int_list(split_input) if split_input is not None else int_list(split)
    return _split(data, 0 if axis is None else axis, sizes, ctx.num_outputs)


@kernel("Split", since=2, context=True, alias=True)
def split_v2(ctx, data, *, axis: int = 0, split: list[int] | None = None):
    """Opsets 2-12: sizes from the ``split`` attribute, else equal parts."""
    return _split(data, axis, int_list(split), ctx.num_outputs)


@kernel("Split", since=13, context=True, alias=True)
def split_v13(ctx, data, split=None, *, axis: int = 0):
    """Opsets 13-17: sizes from the optional ``split`` input, else equal parts."""
    return _split(data, axis, int_list(split), ctx.num_outputs)


@kernel("Split", since=18, context=True, alias=True)
def split(ctx, data, split=None, *, axis: int = 0, num_outputs: int | None = None):
    """Opset 18+: ``split`` input or ``num_outputs`` (ceil-sized parts, last one smaller)."""
    if split is not None and num_outputs is not None:
        raise KernelError("Split: give either the 'split' input or 'num_outputs', not both")
    count = ctx.num_outputs if num_outputs is None else num_outputs
    return _split(data, axis, int_list(split), count)
