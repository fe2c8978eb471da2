"""``com.microsoft`` FusedConv: Conv, plus an optional sum input, then an activation (what
onnxruntime's graph optimizer writes when it saves an optimized model)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_conv import conv
from anychip.backends.cpu.kernels.op_rnn import make_activation
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["fused_conv"]


_ACTIVATIONS = ("Relu", "Tanh", "Sigmoid", "LeakyRelu", "Clip", "HardSigmoid")


def _activation(y: np.ndarray, name: str, params: list[float]) -> np.ndarray:
    """FusedConv's activation: Clip's bounds, or the recurrent ops' table for the rest
    (``op_rnn.make_activation``)."""
    p = list(params) + [None, None]
    if name not in _ACTIVATIONS:
        raise KernelError(f"FusedConv: activation {name!r} is not one of {', '.join(_ACTIVATIONS)}")
    if name == "Clip":
        return np.clip(y, p[0], p[1])
    return make_activation(name, p[0], p[1])(y)


@kernel("FusedConv", domain=MS_DOMAIN, since=1)
def fused_conv(
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    z: np.ndarray | None = None,
    *,
    auto_pad: str = "NOTSET",
    dilations: list[int] | None = None,
    group: int = 1,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
    activation: str | None = None,
    activation_params: list[float] | None = None,
) -> np.ndarray:
    y = conv(
        x,
        w,
        b,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    if z is not None:
        y = y + z
    if activation:
        y = _activation(y, activation, activation_params or [])
    return y.astype(x.dtype, copy=False)
