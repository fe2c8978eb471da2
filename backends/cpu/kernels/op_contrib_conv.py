"""``com.microsoft`` FusedConv: Conv, plus an optional sum input, then an activation (what
onnxruntime's graph optimizer writes when it saves an optimized model)."""

from __future__ import annotations

import numpy as np

from anychip.backends.cpu.kernels.op_conv import conv
from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError
from anychip.opsets.com_microsoft import MS_DOMAIN

__all__ = ["fused_conv"]


def _activation(y: np.ndarray, name: str, params: list[float]) -> np.ndarray:
    p = list(params) + [None, None]
    if name == "Relu":
        return np.maximum(y, 0)
    if name == "Tanh":
        return np.tanh(y)
    if name == "Sigmoid":
        return 1 / (1 + np.exp(-y))
    if name == "LeakyRelu":
        return np.where(y >= 0, y, y * np.asarray(0.01 if p[0] is None else p[0], y.dtype))
    if name == "Clip":
        return np.clip(y, p[0], p[1])
    if name == "HardSigmoid":
        alpha, beta = (0.2 if p[0] is None else p[0]), (0.5 if p[1] is None else p[1])
        return np.clip(y * np.asarray(alpha, y.dtype) + np.asarray(beta, y.dtype), 0, 1)
    raise KernelError(
        f"FusedConv: activation {name!r} is not one of Relu, Tanh, Sigmoid, LeakyRelu, Clip, "
        "HardSigmoid"
    )


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
