"""ai.onnx.preview.training optimizers: Adagrad, Adam, Momentum.

Each takes a scalar learning rate R and update count T, then n tensors to optimize, their n
gradients and their optimizer states, and returns the updated tensors and states (one update
step, as the spec's pseudo-code writes it). Gradient needs autodiff over the graph and is not
provided: placement reports it as having no kernel.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError

__all__ = ["adagrad", "adam", "momentum"]

_TRAIN = "ai.onnx.preview.training"


def _groups(inputs: tuple[Any, ...], k: int, op: str) -> list[list[np.ndarray]]:
    if len(inputs) % k:
        raise KernelError(
            f"{op}: after R and T the inputs must be {k} groups of equal length, got "
            f"{len(inputs)} tensors"
        )
    n = len(inputs) // k
    return [[np.asarray(t) for t in inputs[i * n : (i + 1) * n]] for i in range(k)]


def _scalar(x: Any) -> float:
    return float(np.asarray(x).reshape(-1)[0])


@kernel("Adagrad", domain=_TRAIN, since=1)
def adagrad(
    r: Any,
    t: Any,
    *inputs: Any,
    decay_factor: float = 0.0,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
) -> tuple[np.ndarray, ...]:
    xs, gs, hs = _groups(inputs, 3, "Adagrad")
    rate = _scalar(r) / (1 + _scalar(t) * decay_factor)
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        new_x.append((x - rate * g_reg / (np.sqrt(h_new) + epsilon)).astype(x.dtype))
        new_h.append(h_new.astype(h.dtype))
    return (*new_x, *new_h)


@kernel("Momentum", domain=_TRAIN, since=1)
def momentum(
    r: Any,
    t: Any,
    *inputs: Any,
    alpha: float | None = None,
    beta: float | None = None,
    mode: str | None = None,
    norm_coefficient: float | None = None,
) -> tuple[np.ndarray, ...]:
    if alpha is None or beta is None or mode is None or norm_coefficient is None:
        raise ModelError("Momentum: attributes alpha, beta, mode and norm_coefficient are required")
    if mode not in ("standard", "nesterov"):
        raise ModelError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    xs, gs, vs = _groups(inputs, 3, "Momentum")
    rate = _scalar(r)
    # The first update (T == 0) takes the gradient unscaled.
    beta_adj = beta if _scalar(t) > 0 else 1.0
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adj * g_reg
        step = g_reg + alpha * v_new if mode == "nesterov" else v_new
        new_x.append((x - rate * step).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
    return (*new_x, *new_v)


@kernel("Adam", domain=_TRAIN, since=1)
def adam(
    r: Any,
    t: Any,
    *inputs: Any,
    alpha: float = 0.9,
    beta: float = 0.999,
    epsilon: float = 1e-6,
    norm_coefficient: float = 0.0,
    norm_coefficient_post: float = 0.0,
) -> tuple[np.ndarray, ...]:
    xs, gs, vs, hs = _groups(inputs, 4, "Adam")
    rate, step = _scalar(r), _scalar(t)
    if step > 0:
        rate = rate * np.sqrt(1 - beta**step) / (1 - alpha**step)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - rate * v_new / (np.sqrt(h_new) + epsilon)
        new_x.append(((1 - norm_coefficient_post) * x_new).astype(x.dtype))
        new_v.append(v_new.astype(v.dtype))
        new_h.append(h_new.astype(h.dtype))
    return (*new_x, *new_v, *new_h)
