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
from itertools import pairwise
from typing import Any

import numpy as np

from anychip.backends.cpu.native import pool
from anychip.backends.cpu.onednn import _prim as P
from anychip.backends.cpu.onednn._lib import C, get, omp_threads
from anychip.backends.cpu.onednn._parallel import run_all
from anychip.backends.cpu.replay import record as _replay

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


#: Multiply-adds of a whole recurrence from which, with two or more OpenMP threads given and
#: a step too small for oneDNN's team (``_lib.SMALL_WORK``), the batch is split into one
#: primitive per thread, run at once (``_parallel.run_all``): one wake of the second thread
#: per sequence instead of one per step.
BATCH_SPLIT_WORK = 1 << 22
#: Fewest batch rows per part: a part of the bench LSTM (T=32, 64 -> 128) costs 0.29 ms at
#: batch 4 against 0.64 for the whole batch 8, but batches 2 and 4 split ran 0.6x their
#: unsplit time (a step's fixed cost dominates there).
MIN_PART_ROWS = 4


def recurrent(
    op: str,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    sequence_lens: np.ndarray | None,
    initial: list[np.ndarray | None],
    attrs: dict[str, Any],
    team: int = 1,
) -> tuple[np.ndarray, ...] | None:
    """(Y, Y_h[, Y_c]) of an LSTM, GRU or RNN node, or None when oneDNN cannot run it.
    ``team``: the OpenMP threads given; with oneDNN's own team at one thread (the caller's
    ``team_for``), a large enough recurrence runs split by batch over that many threads."""
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
    spec = (op, lbr, act, h, d, ddir)
    parts = 1
    if team > 1 and omp_threads() == 1 and t * n * d * gh * (i + h) >= BATCH_SPLIT_WORK:
        parts = max(1, min(team, n // MIN_PART_ROWS))
        parts = parts if parts > 1 and pool.try_parallel() else 1
    bounds = [n * k // parts for k in range(parts + 1)]
    try:
        runs = [_part(spec, x, w, r, b, initial, lo, hi, parts) for lo, hi in pairwise(bounds)]
    except P.Unsupported:
        return None
    if parts == 1:
        runs[0][0].prim.run(runs[0][1])  # noted there
    else:
        prims, buffers = [e.prim for e, _ in runs], [bufs for _, bufs in runs]
        run_all(prims, buffers)
        if _replay.ACTIVE:  # the buffers' arrays kept by the note
            _replay.note(run_all, (prims, buffers))
    dst = _joined(runs, C.arg_dst)
    outs = [_joined(runs, C.arg_dst_1 + k) for k in range(len(initial))]
    _replay.seal()  # the copies in and out and the primitives: all noted
    y = dst.reshape(t, n, d, h).transpose(0, 2, 1, 3)  # (T, D, N, H)
    if layout:
        return (y.transpose(2, 0, 1, 3),) + tuple(o.transpose(1, 0, 2) for o in outs)
    return (y,) + tuple(outs)


def _joined(runs: list[tuple[Any, dict[int, np.ndarray]]], arg: int) -> np.ndarray:
    """Output ``arg`` of the batch parts, joined along the batch (a lone part's own buffer)."""
    if len(runs) == 1:
        return runs[0][1][arg]
    parts = [bufs[arg] for _, bufs in runs]
    shape = parts[0].shape[:1] + (sum(p.shape[1] for p in parts),) + parts[0].shape[2:]
    joined = _replay.empty(shape)
    np.concatenate(parts, axis=1, out=joined)
    if _replay.ACTIVE:
        _replay.note(_concatenate, (parts, joined))
    return joined


def _concatenate(parts: list[np.ndarray], out: np.ndarray) -> None:
    np.concatenate(parts, axis=1, out=out)


def _part(
    spec: tuple,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None,
    initial: list[np.ndarray | None],
    lo: int,
    hi: int,
    parts: int,
) -> tuple[_Rnn, dict[int, np.ndarray]]:
    """The primitive for batch rows ``[lo, hi)`` (of ``parts``) and its buffers."""
    op, lbr, act, h, d, ddir = spec
    t, n, i = x.shape
    xs = x[:, lo:hi] if parts > 1 else x
    # a split's parts are distinct primitives even at equal sizes: they run at once
    key = (op, lbr, act, xs.shape, h, d, ddir, omp_threads()) + ((lo, parts) if parts > 1 else ())
    entry = P.cached(key, lambda: _build(op, lbr, act, t, hi - lo, i, h, d, ddir, parts > 1))
    wl, wi, bias = P.weights(key, (w, r, b), lambda: _prepare(entry, key, op, lbr, w, r, b))
    bufs = {C.arg_src: _replay.contiguous(xs, np.float32), C.arg_weights: wl, C.arg_weights_1: wi}
    bufs[C.arg_bias] = bias
    if entry.scratch is not None:
        bufs[C.arg_scratchpad] = entry.scratch
    bufs[C.arg_dst] = _replay.empty((t, hi - lo, d * h))
    for k, s in enumerate(initial):
        if s is None:  # numpy's, not a recorder's: read, never written (a replay keeps it)
            s = np.zeros((d, hi - lo, h), np.float32)
        else:
            s = _replay.contiguous(s[:, lo:hi] if parts > 1 else s, np.float32)
        bufs[C.arg_src_1 + k] = s
        bufs[C.arg_dst_1 + k] = _replay.empty((d, hi - lo, h))
    return entry, bufs


class _Rnn:
    """A recurrent primitive, its weights' layouts and (``scratch``) its own scratchpad when
    it runs on another thread."""

    __slots__ = ("prim", "wl_md", "wi_md", "dims", "scratch")

    def __init__(self, prim: P.Prim, wl_md: Any, wi_md: Any, dims: tuple, scratch: Any) -> None:
        self.prim = prim
        self.wl_md = wl_md
        self.wi_md = wi_md
        self.dims = dims
        self.scratch = scratch


def _build(
    op: str, lbr: bool, act: int, t: int, n: int, i: int, h: int, d: int, ddir: int, own: bool
) -> _Rnn:
    """``own``: the scratchpad is an argument (the batch parts run on other threads)."""
    L = P.lib()
    dn, null = L.dnnl, L.ffi.NULL
    attr = P.user_scratchpad() if own else P.attr()
    gates = _GATES[op]
    src = P.md((t, n, i), C.tnc)
    state = P.md((1, d, n, h), C.ldnc)
    wl = P.md((1, d, i, gates, h), C.any)
    wi = P.md((1, d, h, gates, h), C.any)
    bias = P.md((1, d, gates + int(lbr), h), C.ldgo)
    dst = P.md((t, n, d * h), C.tnc)
    common = (L.engine, C.forward_inference, ddir, src, state)
    if op == "LSTM":  # no peepholes, no projection
        pd = P.make_pd(
            dn.dnnl_lstm_forward_primitive_desc_create, *common, state, wl, wi, null, null,
            bias, dst, state, state, 0, attr,
        )  # fmt: skip
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
            attr,
        )
    else:
        create = (
            dn.dnnl_lbr_gru_forward_primitive_desc_create
            if lbr
            else dn.dnnl_gru_forward_primitive_desc_create
        )
        pd = P.make_pd(create, *common, wl, wi, bias, dst, state, 0, attr)
    wl_md = P.query_md(pd, C.query_weights_md, 0)
    wi_md = P.query_md(pd, C.query_weights_md, 1)
    args = {C.arg_src: src, C.arg_src_1: state, C.arg_weights: wl_md, C.arg_weights_1: wi_md}
    args.update({C.arg_bias: bias, C.arg_dst: dst, C.arg_dst_1: state})
    if op == "LSTM":
        args.update({C.arg_src_2: state, C.arg_dst_2: state})
    scratch = P.scratchpad_arg(pd, args) if own else None
    return _Rnn(P.Prim(pd, args), wl_md, wi_md, (d, i, h, gates), scratch)


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
