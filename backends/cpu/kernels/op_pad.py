"""Pad: constant, reflect, edge and (opset 19) wrap modes; negative pads crop.

Opset 1 names the attribute ``paddings``, opset 2 ``pads``; from opset 11 pads and the
constant are inputs, and opset 18 adds ``axes``.
"""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels._axes import int_list, norm_axes
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError

__all__ = ["pad_v1", "pad_v2", "pad"]

_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def _pad(data: np.ndarray, pads: list[int], mode: str, value, axes: list[int] | None):
    axes = list(range(data.ndim)) if axes is None else norm_axes(axes, data.ndim, "Pad")
    if len(pads) != 2 * len(axes):
        raise KernelError(f"Pad: pads {pads} must hold 2 values per padded axis ({len(axes)} axes)")
    if mode not in _MODES:
        raise KernelError(f"Pad: unknown mode {mode!r}; use constant, reflect, edge or wrap")
    begin = [0] * data.ndim
    end = [0] * data.ndim
    for i, a in enumerate(axes):
        begin[a] = pads[i]
        end[a] = pads[i + len(axes)]
    # Crop first (negative pads), then pad by the positive amounts.
    crop = tuple(
        slice(max(-b, 0), data.shape[i] - max(-e, 0)) for i, (b, e) in enumerate(zip(begin, end))
    )
    data = data[crop]
    width = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
    if not any(b or e for b, e in width):
        return np.array(data)
    if mode == "constant":
        fill = np.asarray(0 if value is None else value).reshape(-1)
        fill = fill[0] if fill.size else 0
        return np.pad(data, width, mode="constant", constant_values=fill)
    if mode == "reflect" and any((b or e) and data.shape[i] < 2 for i, (b, e) in enumerate(width)):
        raise KernelError(
            f"Pad: reflect mode needs at least 2 elements on padded axes, got shape {data.shape}"
        )
    if any((b or e) and data.shape[i] == 0 for i, (b, e) in enumerate(width)):
        raise KernelError(f"Pad: {mode} mode cannot pad an empty axis (shape {data.shape})")
    return np.pad(data, width, mode=_MODES[mode])


@kernel("Pad", since=1)
def pad_v1(
    data: np.ndarray,
    *,
    paddings: list[int] | None = None,
    mode: str = "constant",
    value: float = 0.0,
) -> np.ndarray:
    """Opset 1: ``paddings`` attribute."""
    if paddings is None:
        raise KernelError("Pad (opset 1): the 'paddings' attribute is required")
    return _pad(data, list(paddings), mode, value, None)


@kernel("Pad", since=2)
def pad_v2(
    data: np.ndarray, *, pads: list[int] | None = None, mode: str = "constant", value: float = 0.0
) -> np.ndarray:
    """Opsets 2-10: ``pads`` attribute."""
    if pads is None:
        raise KernelError("Pad (opset 2-10): the 'pads' attribute is required")
    return _pad(data, list(pads), mode, value, None)


@kernel("Pad", since=11)
def pad(
    data: np.ndarray,
    pads: np.ndarray,
    constant_value: np.ndarray | None = None,
    axes: np.ndarray | None = None,
    *,
    mode: str = "constant",
) -> np.ndarray:
    """Opset 11+: pads, constant_value and (opset 18) axes are inputs."""
    return _pad(data, int_list(pads), mode, constant_value, int_list(axes))
