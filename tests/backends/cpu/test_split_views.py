"""Split's pieces are the input's views, in np.split's shapes and values, on every axis and
with empty pieces (the kernel slices them itself, without np.split's wrapper)."""

from __future__ import annotations

import numpy as np
import pytest

from anychip.backends.cpu.kernels.op_split import _split


@pytest.mark.parametrize(
    "axis, sizes",
    [(0, [1, 0]), (1, [64, 64]), (1, [0, 128]), (-2, [100, 28]), (2, [32, 32, 32]), (-1, [10, 86])],
)
def test_pieces_are_views_equal_to_np_split(axis, sizes):
    x = np.random.default_rng(len(sizes) + axis).standard_normal((1, 128, 96)).astype(np.float32)
    got = _split(x, axis, sizes, len(sizes))
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and np.array_equal(g, w)
        assert g.size == 0 or np.shares_memory(g, x)
