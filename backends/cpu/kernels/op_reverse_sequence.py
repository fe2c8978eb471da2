"""ReverseSequence: reverse the first ``sequence_lens[b]`` steps of every batch entry."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import ModelError

__all__ = ["reverse_sequence"]


@kernel("ReverseSequence", since=10)
def reverse_sequence(
    x: np.ndarray, sequence_lens: np.ndarray, *, batch_axis: int = 1, time_axis: int = 0
) -> np.ndarray:
    if {batch_axis, time_axis} != {0, 1}:
        raise ModelError(
            "ReverseSequence: batch_axis and time_axis must be 0 and 1 (in either "
            f"order), got {batch_axis} and {time_axis}"
        )
    steps = x.shape[time_axis]
    lens = np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    t = np.arange(steps)[:, None]  # [time, batch]
    src = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    if time_axis == 1:
        src = src.T
    src = src.reshape(src.shape + (1,) * (x.ndim - 2))
    return np.take_along_axis(x, np.broadcast_to(src, x.shape), axis=time_axis)
