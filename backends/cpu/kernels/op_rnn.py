"""Recurrent layers: RNN, LSTM and GRU (ONNX gate orders: LSTM i,o,f,c; GRU z,r,h).

All three share the driver ``_recurrence``: it runs one direction over the time axis with the
batch vectorized, honouring ``sequence_lens`` (a shorter sequence keeps its last state and
writes zeros past its end; the reverse direction starts at each sequence's own last step).
``layout=1`` (opset 14) puts batch first on X, Y and the states. float16 and bfloat16 compute
in float32 and are cast back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.errors import KernelError, ModelError
from anychip.ir.dtypes import DType

__all__ = ["rnn", "lstm", "gru", "make_activation"]

_TYPES = frozenset({DType.FLOAT16, DType.FLOAT, DType.DOUBLE, DType.BFLOAT16})
Act = Callable[[np.ndarray], np.ndarray]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    e = np.exp(x[~pos])
    out[~pos] = e / (1.0 + e)
    return out


def make_activation(name: str, alpha: float | None, beta: float | None) -> Act:
    """The activation function ``name`` (the ONNX recurrent ops' list; also what onnxruntime's
    fused contrib ops take), with its alpha/beta defaults."""
    n = name.lower()
    if n == "relu":
        return lambda x: np.maximum(x, 0)
    if n == "tanh":
        return np.tanh
    if n == "sigmoid":
        return _sigmoid
    if n == "affine":
        a, b = 1.0 if alpha is None else alpha, 0.0 if beta is None else beta
        return lambda x: a * x + b
    if n == "leakyrelu":
        a = 0.01 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * x)
    if n == "thresholdedrelu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x > a, x, 0)
    if n == "scaledtanh":
        a, b = 1.0 if alpha is None else alpha, 1.0 if beta is None else beta
        return lambda x: a * np.tanh(b * x)
    if n == "hardsigmoid":
        a, b = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        return lambda x: np.clip(a * x + b, 0, 1)
    if n == "elu":
        a = 1.0 if alpha is None else alpha
        return lambda x: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1))
    if n == "softsign":
        return lambda x: x / (1 + np.abs(x))
    if n == "softplus":
        return lambda x: np.logaddexp(0, x)
    raise ModelError(f"unknown recurrent activation function {name!r}")


_USES_ALPHA = {"affine", "leakyrelu", "thresholdedrelu", "scaledtanh", "hardsigmoid", "elu"}
_USES_BETA = {"affine", "scaledtanh", "hardsigmoid"}


def _activations(
    names: Sequence[str] | None,
    defaults: Sequence[str],
    alphas: Sequence[float] | None,
    betas: Sequence[float] | None,
    num_dir: int,
) -> list[list[Act]]:
    """Activation functions per direction; alpha/beta are consumed in order by those using them."""
    names = list(names) if names else list(defaults) * num_dir
    if len(names) == len(defaults) and num_dir == 2:
        names = names * 2
    elif len(names) == 2 * len(defaults) and num_dir == 1:
        # RNN's schema default lists both directions' functions ("Tanh", "Tanh").
        names = names[: len(defaults)]
    if len(names) != len(defaults) * num_dir:
        raise ModelError(
            f"expected {len(defaults) * num_dir} activations ({len(defaults)} per direction), "
            f"got {names}"
        )
    alphas, betas = list(alphas or []), list(betas or [])
    fns = []
    for name in names:
        a = alphas.pop(0) if name.lower() in _USES_ALPHA and alphas else None
        b = betas.pop(0) if name.lower() in _USES_BETA and betas else None
        fns.append(make_activation(name, a, b))
    k = len(defaults)
    return [fns[d * k : (d + 1) * k] for d in range(num_dir)]


def _clip(x: np.ndarray, clip: float | None) -> np.ndarray:
    return x if clip is None else np.clip(x, -clip, clip)


def _recurrence(
    x: np.ndarray,
    lens: np.ndarray,
    reverse: bool,
    state: tuple[np.ndarray, ...],
    step: Callable[[np.ndarray, tuple[np.ndarray, ...]], tuple[np.ndarray, ...]],
) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
    """Run ``step`` over time; returns Y (seq, batch, hidden) and the final states."""
    seq, batch = x.shape[0], x.shape[1]
    hidden = state[0].shape[-1]
    y = np.zeros((seq, batch, hidden), dtype=x.dtype)
    rows = np.arange(batch)
    for t in range(seq):
        active = t < lens
        if not active.any():
            break
        idx = np.where(active, lens - 1 - t, 0) if reverse else np.full(batch, t)
        new = step(x[idx, rows], state)
        state = tuple(np.where(active[:, None], n, s) for n, s in zip(new, state))
        y[idx[active], rows[active]] = state[0][active]
    return y, state


def _prepare(
    x: np.ndarray,
    w: np.ndarray,
    sequence_lens: Any,
    initial: list[Any],
    hidden_size: int | None,
    direction: str,
    layout: int,
    op: str,
) -> tuple[np.ndarray, np.ndarray, int, int, list[np.ndarray | None], np.dtype]:
    x = np.asarray(x)
    out_dtype = x.dtype
    cdt = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    if x.ndim != 3:
        raise KernelError(f"{op}: X must be rank 3, got shape {list(x.shape)}")
    if layout:
        x = x.transpose(1, 0, 2)
    x = x.astype(cdt)
    num_dir = 2 if direction == "bidirectional" else 1
    if direction not in ("forward", "reverse", "bidirectional"):
        raise ModelError(f"{op}: direction must be forward, reverse or bidirectional")
    if np.asarray(w).shape[0] != num_dir:
        raise KernelError(
            f"{op}: W has {np.asarray(w).shape[0]} directions but direction={direction!r}"
        )
    hidden = hidden_size if hidden_size is not None else None
    seq, batch = x.shape[0], x.shape[1]
    lens = (
        np.full(batch, seq, dtype=np.int64)
        if sequence_lens is None
        else np.asarray(sequence_lens, dtype=np.int64).reshape(-1)
    )
    states = []
    for s in initial:
        if s is None:
            states.append(None)
            continue
        s = np.asarray(s).astype(cdt)
        states.append(s.transpose(1, 0, 2) if layout else s)
    return x, lens, num_dir, hidden or 0, states, out_dtype


def _finish(
    ys: list[np.ndarray],
    finals: list[tuple[np.ndarray, ...]],
    layout: int,
    out_dtype: np.dtype,
) -> tuple[np.ndarray, ...]:
    y = np.stack(ys, axis=1)  # seq, dir, batch, hidden
    outs = [y.transpose(2, 0, 1, 3) if layout else y]
    for k in range(len(finals[0])):
        s = np.stack([f[k] for f in finals])  # dir, batch, hidden
        outs.append(s.transpose(1, 0, 2) if layout else s)
    return tuple(o.astype(out_dtype) for o in outs)


def _directions(direction: str) -> list[bool]:
    return [False, True] if direction == "bidirectional" else [direction == "reverse"]


@kernel("RNN", since=1, dtypes=_TYPES)
def rnn(
    x: Any,
    w: Any,
    r: Any,
    b: Any = None,
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    layout: int = 0,
) -> tuple[np.ndarray, ...]:
    x, lens, nd, _, (h0,), odt = _prepare(
        x, w, sequence_lens, [initial_h], hidden_size, direction, layout, "RNN"
    )
    w, r = np.asarray(w).astype(x.dtype), np.asarray(r).astype(x.dtype)
    hidden = r.shape[-1]
    acts = _activations(activations, ["Tanh"], activation_alpha, activation_beta, nd)
    ys, finals = [], []
    for d, rev in enumerate(_directions(direction)):
        bias = (
            np.zeros(hidden, x.dtype)
            if b is None
            else np.asarray(b)[d].astype(x.dtype).reshape(2, hidden).sum(0)
        )
        f = acts[d][0]

        def step(xt: np.ndarray, st: tuple, d: int = d, bias: Any = bias, f: Act = f) -> tuple:
            pre = xt @ w[d].T + st[0] @ r[d].T + bias
            if clip is not None:
                pre = np.clip(pre, -clip, clip)
            return (f(pre),)

        h = np.zeros((x.shape[1], hidden), x.dtype) if h0 is None else h0[d]
        y, fin = _recurrence(x, lens, rev, (h,), step)
        ys.append(y)
        finals.append(fin)
    return _finish(ys, finals, layout, odt)


@kernel("LSTM", since=1, dtypes=_TYPES)
def lstm(
    x: Any,
    w: Any,
    r: Any,
    b: Any = None,
    sequence_lens: Any = None,
    initial_h: Any = None,
    initial_c: Any = None,
    p: Any = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    input_forget: int = 0,
    layout: int = 0,
) -> tuple[np.ndarray, ...]:
    x, lens, nd, _, (h0, c0), odt = _prepare(
        x, w, sequence_lens, [initial_h, initial_c], hidden_size, direction, layout, "LSTM"
    )
    w, r = np.asarray(w).astype(x.dtype), np.asarray(r).astype(x.dtype)
    hidden = r.shape[-1]
    acts = _activations(
        activations, ["Sigmoid", "Tanh", "Tanh"], activation_alpha, activation_beta, nd
    )
    ys, finals = [], []
    for d, rev in enumerate(_directions(direction)):
        bias = (
            np.zeros(4 * hidden, x.dtype)
            if b is None
            else np.asarray(b)[d].astype(x.dtype).reshape(2, 4 * hidden).sum(0)
        )
        peep = (
            np.zeros((3, hidden), x.dtype)
            if p is None
            else np.asarray(p)[d].astype(x.dtype).reshape(3, hidden)
        )
        f, g, hf = acts[d]

        def step(
            xt: np.ndarray,
            st: tuple,
            d: int = d,
            bias: Any = bias,
            peep: Any = peep,
            f: Act = f,
            g: Act = g,
            hf: Act = hf,
        ) -> tuple:
            h, c = st
            gates = xt @ w[d].T + h @ r[d].T + bias
            gi, go, gf, gc = np.split(gates, 4, axis=-1)
            # clip bounds the input of each gate activation, peephole terms included.
            i = f(_clip(gi + peep[0] * c, clip))
            fg = 1 - i if input_forget else f(_clip(gf + peep[2] * c, clip))
            c_new = fg * c + i * g(_clip(gc, clip))
            o = f(_clip(go + peep[1] * c_new, clip))
            return o * hf(c_new), c_new

        batch = x.shape[1]
        h = np.zeros((batch, hidden), x.dtype) if h0 is None else h0[d]
        c = np.zeros((batch, hidden), x.dtype) if c0 is None else c0[d]
        y, fin = _recurrence(x, lens, rev, (h, c), step)
        ys.append(y)
        finals.append(fin)
    return _finish(ys, finals, layout, odt)


@kernel("GRU", since=1, dtypes=_TYPES)
def gru(
    x: Any,
    w: Any,
    r: Any,
    b: Any = None,
    sequence_lens: Any = None,
    initial_h: Any = None,
    *,
    activation_alpha: Sequence[float] | None = None,
    activation_beta: Sequence[float] | None = None,
    activations: Sequence[str] | None = None,
    clip: float | None = None,
    direction: str = "forward",
    hidden_size: int | None = None,
    linear_before_reset: int = 0,
    layout: int = 0,
    output_sequence: int = 0,
) -> tuple[np.ndarray, ...]:
    x, lens, nd, _, (h0,), odt = _prepare(
        x, w, sequence_lens, [initial_h], hidden_size, direction, layout, "GRU"
    )
    w, r = np.asarray(w).astype(x.dtype), np.asarray(r).astype(x.dtype)
    hidden = r.shape[-1]
    acts = _activations(activations, ["Sigmoid", "Tanh"], activation_alpha, activation_beta, nd)
    ys, finals = [], []
    for d, rev in enumerate(_directions(direction)):
        wb, rb = (
            (np.zeros(3 * hidden, x.dtype),) * 2
            if b is None
            else np.asarray(b)[d].astype(x.dtype).reshape(2, 3 * hidden)
        )
        f, g = acts[d]
        rz, rr, rh = np.split(r[d], 3, axis=0)
        rbz, rbr, rbh = np.split(rb, 3)

        def step(
            xt: np.ndarray,
            st: tuple,
            d: int = d,
            wb: Any = wb,
            f: Act = f,
            g: Act = g,
            rz: Any = rz,
            rr: Any = rr,
            rh: Any = rh,
            rbz: Any = rbz,
            rbr: Any = rbr,
            rbh: Any = rbh,
        ) -> tuple:
            h = st[0]
            xw = xt @ w[d].T + wb
            xz, xr, xh = np.split(xw, 3, axis=-1)
            pz, pr = xz + h @ rz.T + rbz, xr + h @ rr.T + rbr
            if clip is not None:
                pz, pr = np.clip(pz, -clip, clip), np.clip(pr, -clip, clip)
            z, rg = f(pz), f(pr)
            if linear_before_reset:
                ph = xh + rg * (h @ rh.T + rbh)
            else:
                ph = xh + (rg * h) @ rh.T + rbh
            if clip is not None:
                ph = np.clip(ph, -clip, clip)
            return ((1 - z) * g(ph) + z * h,)

        hinit = np.zeros((x.shape[1], hidden), x.dtype) if h0 is None else h0[d]
        y, fin = _recurrence(x, lens, rev, (hinit,), step)
        ys.append(y)
        finals.append(fin)
    return _finish(ys, finals, layout, odt)
