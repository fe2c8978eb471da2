"""ShuffleNet's channel shuffle as one oneDNN reorder into channels-last
(``anychip::ChannelShuffle`` before a oneDNN convolution, ``kernels.channel_shuffle``).

The shuffled tensor ``Y[:, i * g + t] = X[:, t * m + i]`` (``m = C / g``) is the 5-D view
``[N, m, g, H, W]`` of an NCHW ``X``; its channels-last storage is the same dimensions with
strides ``(H*W*C, g, 1, W*C, C)``. One reorder between those two descriptors does the shuffle
and the layout change the depthwise convolution after it would otherwise do on its own
(measured at 1 thread: 37 us against 12 for numpy's shuffle plus 46 for the convolution's
reorder at 136x28x28; 14 against 20 at 272x14x14; 16 against 18 at 544x7x7).

Where a C compiler is found, the generated copy of ``backends/cpu/native/copies.py`` does the same
shuffle first: an 8x8 register transpose per tile, on the pool's threads from 2^17
elements (2 threads, medians of 100, us, this reorder / that copy: 112x56x56 117 / 61-65,
136x28x28 45 / 35, 544x7x7 22 / 12; the reorder runs on one OpenMP thread there, under
``_lib.SMALL_WORK``).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.native import copies
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads, team_for
from anychip.backends.cpu.replay import record as _replay

__all__ = ["shuffle"]


def shuffle(x: np.ndarray, group: int) -> np.ndarray | None:
    """The shuffled float32 NCHW ``x`` as the NCHW view of a channels-last buffer, or None
    when oneDNN cannot (not loaded, another rank, not C-contiguous, groups that do not divide
    the channels)."""
    if get() is None or x.dtype != np.float32 or x.ndim != 4 or not x.flags.c_contiguous:
        return None
    n, c, h, w = x.shape
    if group < 1 or c % group or 0 in x.shape:
        return None
    y = copies.shuffle_channels_last(x, group)
    if y is not None:
        if _replay.ACTIVE:  # the copy's one call (noted there): all it did
            _replay.seal()
        return y
    with team_for(x.size):  # the reorder made and run for the team it gets
        return _reorder(x, group)


def _reorder(x: np.ndarray, group: int) -> np.ndarray | None:
    n, c, h, w = x.shape
    m = c // group
    dims = (n, m, group, h, w)
    key = ("channel_shuffle", x.shape, group, omp_threads())

    def build() -> P.Prim:
        src = P.md_strided(dims, (c * h * w, h * w, m * h * w, w, 1))
        dst = P.md_strided(dims, (h * w * c, group, 1, w * c, c))
        return P.reorder_prim(src, dst)

    try:
        prim = P.cached(key, build)
    except P.Unsupported:
        return None
    buf = np.empty((n, h, w, c), np.float32)
    prim.run({C.arg_src: x, C.arg_dst: buf})
    return P.from_channels_last(buf)
