"""LSTM, GRU and RNN through oneDNN's recurrent primitives: the whole recurrence (every time step,
both directions) is one primitive execution, never a Python loop per step.

Gate orders: ONNX LSTM weights are (i, o, f, c), oneDNN's (i, f, c~, o), so the gate blocks are
permuted once when the weights are prepared; GRU's (z, r, h) is oneDNN's (u, r, o) already.
GRU with ``linear_before_reset=1`` is oneDNN's ``lbr_gru`` (its bias has a fourth block, R's
bias of the candidate gate); with 0 it is oneDNN's GRU, whose candidate bias is Wb_h + Rb_h.

Falls back to the numpy kernels (``kernels/op_rnn.py``) for: dtypes other than float32,
``sequence_lens`` with unequal lengths, non-default activations, ``clip``, ``input_forget``,
LSTM peepholes (P), RNN activations other than one of Tanh, Relu, Sigmoid for both directions,
and empty tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads

__all__ = ["recurrent"]

_DEFAULT_ACTS = {"LSTM": ["sigmoid", "tanh", "tanh"], "GRU": ["sigmoid", "tanh"], "RNN": ["tanh"]}
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
#: RNN's activation (the same for both directions): oneDNN's vanilla RNN eltwise.
_RNN_ACTS = {"tanh": C.eltwise_tanh, "relu": C.eltwise_relu, "sigmoid": C.eltwise_logistic}


def _rnn_activation(attrs: dict[str, Any]) -> int | None:
    acts = [a.lower() for a in attrs.get("activations") or ["tanh"]]
    if len(set(acts)) != 1 or acts[0] not in _RNN_ACTS:
        return None
    if attrs.get("activation_alpha") or attrs.get("activation_beta"):
        return None
    return _RNN_ACTS[acts[0]]


_LSTM_ORDER = [0, 2, 3, 1]  # ONNX (i, o, f, c) blocks taken in oneDNN's order (i, f, c, o)


def _supported(op: str, x: np.ndarray, arrays: Sequence[Any], attrs: dict[str, Any]) -> bool:
    if get() is None or x.dtype != np.float32 or x.ndim != 3 or 0 in x.shape:
        return False
    if any(a is not None and np.asarray(a).dtype != np.float32 for a in arrays):
        return False
    if attrs.get("clip") is not None or attrs.get("input_forget"):
        return False
    acts = attrs.get("activations")
    nd = 2 if attrs.get("direction") == "bidirectional" else 1
    if op == "RNN":
        return _rnn_activation(attrs) is not None
    if acts and [a.lower() for a in acts] != _DEFAULT_ACTS[op] * nd:
        return False
    if acts and (attrs.get("activation_alpha") or attrs.get("activation_beta")):
        return False
    return attrs.get("direction", "forward") in ("forward", "reverse", "bidirectional")


def recurrent(
    op: str,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    sequence_lens: np.ndarray | None,
    initial: list[np.ndarray | None],
    attrs: dict[str, Any],
) -> tuple[np.ndarray, ...] | None:
    """(Y, Y_h[, Y_c]) of an LSTM, GRU or RNN node, or None when oneDNN cannot run it."""
    if not _supported(op, x, [w, r, b, *initial], attrs):
        return None
    layout = int(attrs.get("layout") or 0)
    if layout:
        x = x.transpose(1, 0, 2)
        initial = [None if s is None else s.transpose(1, 0, 2) for s in initial]
    t, n, i = x.shape
    if sequence_lens is not None and np.any(np.asarray(sequence_lens) != t):
        return None
    d, gh, _ = w.shape
    h = r.shape[-1]
    lbr = op == "GRU" and bool(attrs.get("linear_before_reset"))
    gates = _GATES[op]
    if gh != gates * h or r.shape != (d, gh, h) or w.shape[2] != i:
        return None
    direction = attrs.get("direction", "forward")
    ddir = {"forward": C.left2right, "reverse": C.right2left}.get(direction, C.bidirectional_concat)
    act = _rnn_activation(attrs) if op == "RNN" else 0
    key = (op, lbr, act, x.shape, h, d, ddir, omp_threads())
    try:
        entry = P.cached(key, lambda: _build(op, lbr, act, t, n, i, h, d, ddir))
    except P.Unsupported:
        return None
    wl, wi, bias = P.weights(key, (w, r, b), lambda: _prepare(entry, key, op, lbr, w, r, b))
    x = np.ascontiguousarray(x)
    states = []
    for s in initial:
        s = np.zeros((d, n, h), np.float32) if s is None else np.ascontiguousarray(s, np.float32)
        states.append(s)
    dst = np.empty((t, n, d * h), np.float32)
    outs = [np.empty((d, n, h), np.float32) for _ in initial]
    bufs = {C.arg_src: x, C.arg_weights: wl, C.arg_weights_1: wi, C.arg_bias: bias}
    bufs[C.arg_dst] = dst
    for k, (s, o) in enumerate(zip(states, outs)):
        bufs[C.arg_src_1 + k] = s
        bufs[C.arg_dst_1 + k] = o
    entry.prim.run(bufs)
    y = dst.reshape(t, n, d, h).transpose(0, 2, 1, 3)  # (T, D, N, H)
    if layout:
        return (y.transpose(2, 0, 1, 3),) + tuple(o.transpose(1, 0, 2) for o in outs)
    return (y,) + tuple(outs)


class _Rnn:
    __slots__ = ("prim", "wl_md", "wi_md", "dims")

    def __init__(self, prim: P.Prim, wl_md: Any, wi_md: Any, dims: tuple) -> None:
        self.prim = prim
        self.wl_md = wl_md
        self.wi_md = wi_md
        self.dims = dims


def _build(op: str, lbr: bool, act: int, t: int, n: int, i: int, h: int, d: int, ddir: int) -> _Rnn:
    L = P.lib()
    dn, null = L.dnnl, L.ffi.NULL
    gates = _GATES[op]
    src = P.md((t, n, i), C.tnc)
    state = P.md((1, d, n, h), C.ldnc)
    wl = P.md((1, d, i, gates, h), C.any)
    wi = P.md((1, d, h, gates, h), C.any)
    bias = P.md((1, d, gates + int(lbr), h), C.ldgo)
    dst = P.md((t, n, d * h), C.tnc)
    common = (L.engine, C.forward_inference, ddir, src, state)
    if op == "LSTM":
        pd = P.make_pd(
            dn.dnnl_lstm_forward_primitive_desc_create,
            *common,
            state,
            wl,
            wi,
            null,
            null,
            bias,
            dst,
            state,
            state,
            0,
            null,
        )
    elif op == "RNN":
        pd = P.make_pd(
            dn.dnnl_vanilla_rnn_forward_primitive_desc_create,
            L.engine,
            C.forward_inference,
            act,
            ddir,
            src,
            state,
            wl,
            wi,
            bias,
            dst,
            state,
            0,
            0.0,
            0.0,
            null,
        )
    else:
        create = (
            dn.dnnl_lbr_gru_forward_primitive_desc_create
            if lbr
            else dn.dnnl_gru_forward_primitive_desc_create
        )
        pd = P.make_pd(create, *common, wl, wi, bias, dst, state, 0, null)
    wl_md = P.query_md(pd, C.query_weights_md, 0)
    wi_md = P.query_md(pd, C.query_weights_md, 1)
    args = {C.arg_src: src, C.arg_src_1: state, C.arg_weights: wl_md, C.arg_weights_1: wi_md}
    args.update({C.arg_bias: bias, C.arg_dst: dst, C.arg_dst_1: state})
    if op == "LSTM":
        args.update({C.arg_src_2: state, C.arg_dst_2: state})
    return _Rnn(P.Prim(pd, args), wl_md, wi_md, (d, i, h, gates))


def _prepare(
    entry: _Rnn, key: tuple, op: str, lbr: bool, w: np.ndarray, r: np.ndarray, b: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights in the primitive's layouts and the bias in oneDNN's gate order."""
    d, i, h, gates = entry.dims
    order = _LSTM_ORDER if op == "LSTM" else list(range(gates))

    def ldigo(a: np.ndarray, inp: int) -> np.ndarray:  # (D, G*H, in) -> (1, D, in, G, H)
        a = np.asarray(a, np.float32).reshape(d, gates, h, inp)[:, order]
        return np.ascontiguousarray(a.transpose(0, 3, 1, 2))[None]

    out = []
    for arr, inp, md, tag in ((w, i, entry.wl_md, "wl"), (r, h, entry.wi_md, "wi")):
        user = ldigo(arr, inp)
        buf = P.empty_for(md)
        P.reorder_into((key, tag), user, P.md(user.shape, C.ldigo), buf, md)
        out.append(buf)
    bb = np.zeros((d, 2, gates, h), np.float32)
    if b is not None:
        bb = np.asarray(b, np.float32).reshape(d, 2, gates, h)[:, :, order]
    bias = bb[:, 0] + bb[:, 1]
    if lbr:  # oneDNN's fourth block: R's bias of the candidate gate, applied before reset
        bias = np.concatenate([bb[:, 0, :2] + bb[:, 1, :2], bb[:, 0, 2:], bb[:, 1, 2:]], axis=1)
    return out[0], out[1], np.ascontiguousarray(bias[None])
