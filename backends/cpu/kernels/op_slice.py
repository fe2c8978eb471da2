"""Slice: opset 1 takes starts/ends/axes as attributes, opset 10+ as inputs with ``steps``.

Out-of-range starts and ends are clamped the way ONNX says (which is Python slicing: a start
or end of INT64_MAX/INT64_MIN means "to the end" in the step's direction).
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axes
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["slice_attr", "slice_"]


def _slice(data: np.ndarray, starts, ends, axes, steps) -> np.ndarray:
    if len(starts) != len(ends):
        raise KernelError(f"Slice: starts {starts} and ends {ends} differ in length")
    axes = list(range(len(starts))) if axes is None else norm_axes(axes, data.ndim, "Slice")
    steps = [1] * len(starts) if steps is None else steps
    if len(axes) != len(starts) or len(steps) != len(starts):
        raise KernelError(
            f"Slice: starts, ends, axes {axes} and steps {steps} must have the same length"
        )
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        if st == 0:
            raise KernelError(f"Slice: step along axis {a} is 0")
        dim = data.shape[a]
        # Clamp huge sentinels first so Python slicing sees ordinary numbers.
        s = max(min(s, dim), -dim - 1)
        e = max(min(e, dim), -dim - 1)
        if st < 0 and e < -dim:
            e = None
        index[a] = slice(s, e, st)
    return data[tuple(index)]


@kernel("Slice", since=1)
def slice_attr(
    data: np.ndarray,
    *,
    starts: list[int] | None = None,
    ends: list[int] | None = None,
    axes: list[int] | None = None,
) -> np.ndarray:
    """Opsets 1-9: starts, ends and axes are attributes; steps are 1."""
    if starts is None or ends is None:
        raise KernelError("Slice (opset < 10): attributes 'starts' and 'ends' are required")
    return _slice(data, list(starts), list(ends), axes, None)


@kernel("Slice", since=10)
def slice_(
    data: np.ndarray,
    starts: np.ndarray,
    ends: np.ndarray,
    axes: np.ndarray | None = None,
    steps: np.ndarray | None = None,
) -> np.ndarray:
    """Opset 10+: starts, ends, optional axes and steps are int tensors."""
    return _slice(data, int_list(starts), int_list(ends), int_list(axes), int_list(steps))
