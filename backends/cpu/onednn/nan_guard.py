"""NaN through a FusedConv whose activation oneDNN computes with max/min.

oneDNN's eltwise post-ops for Relu (alpha 0), Clip and HardSigmoid clamp with ``vmaxps`` and
``vminps``, which return their second operand when the first is NaN: a NaN that the
convolution makes (a NaN, or an Inf times a zero weight, in its window) comes out as 0 (or
Clip's lower bound), where the unfused graph, numpy and onnxruntime give NaN (issue 47).

The convolution itself propagates NaN and Inf as IEEE says; only the clamp loses them. So after
such a FusedConv the kernel calls ``keep_nan``, and notes it for a replay
(``backends/cpu/replay/record.py``): when every input is finite (one sum per input, which a NaN
or Inf makes non-finite), nothing is done; otherwise the node is computed again by the numpy
kernel (``kernels/op_contrib_conv.py``, whose ``np.maximum``/``np.clip`` keep NaN) into the
same output. A sum that overflows on finite inputs only takes that slower path.

Not covered: finite inputs whose products overflow to +Inf and -Inf within one window
(|x| * |w| above 3.4e38), where the sum is NaN and the clamp still hides it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.kernels import op_contrib_conv

__all__ = ["clamps", "keep_nan"]


def clamps(activation: str | None, act: tuple[int, float, float] | None) -> bool:
    """Whether oneDNN computes this FusedConv activation with max/min (NaN lost)."""
    if act is None or activation is None:
        return False
    if activation == "LeakyRelu":
        return act[1] == 0.0  # alpha 0: oneDNN's relu takes its max path
    return activation in ("Relu", "Clip", "HardSigmoid")


def _finite(a: np.ndarray | None) -> bool:
    if a is None:
        return True
    with np.errstate(invalid="ignore", over="ignore"):
        return bool(np.isfinite(np.add.reduce(a, axis=None)))


def keep_nan(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None,
    z: np.ndarray | None,
    activation: str,
    params: list[float] | None,
    attrs: dict[str, Any],
    y: np.ndarray,
    memo: dict | None = None,
) -> None:
    """Rewrite ``y`` with the numpy FusedConv when an input holds NaN or Inf. ``memo``: the
    node's dict, where the weights' and bias's check is kept for the arrays it was made on
    (they are the node's constants: one sum per call is left, the input's)."""
    consts = memo.get("consts") if memo is not None else None
    if consts is None or consts[0] is not w or consts[1] is not b:
        consts = (w, b, _finite(w) and _finite(b))
        if memo is not None:
            memo["consts"] = consts
    if consts[2] and _finite(x) and _finite(z):
        return
    ref = op_contrib_conv.fused_conv(
        x, w, b, z, activation=activation, activation_params=params, **attrs
    )
    np.copyto(y, ref)
