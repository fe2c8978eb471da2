"""``anychip::ChannelShuffle`` (``passes/fuse_channel_shuffle.py``): ShuffleNet's
Reshape -> Transpose -> Reshape in one node, one copy (into the planned ``out``)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.ir.dtypes import DType
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["channel_shuffle", "shuffled_view"]


def shuffled_view(x: np.ndarray, group: int) -> np.ndarray:
    """``x`` [N, C, ...] as the 5-D view [N, C / group, group, ...] whose C order is the
    shuffled channels (no copy)."""
    if x.ndim < 2 or group < 1 or x.shape[1] % group:
        raise KernelError(
            f"ChannelShuffle: {group} groups do not divide the {x.shape[1] if x.ndim > 1 else 0}"
            f" channels of an input of shape {list(x.shape)}"
        )
    n, c = x.shape[:2]
    split = x.reshape((n, group, c // group) + x.shape[2:])
    return split.swapaxes(1, 2)


@kernel("ChannelShuffle", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE))
def channel_shuffle(x: np.ndarray, *, group: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x``'s channels interleaved across ``group`` groups, C-contiguous."""
    view = shuffled_view(x, group)
    if fits(out, x.shape, x.dtype):
        np.copyto(out.reshape(view.shape), view)
        return out
    return np.ascontiguousarray(view).reshape(x.shape)
