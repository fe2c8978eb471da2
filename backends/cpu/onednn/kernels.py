"""The oneDNN kernels of the CPU backend: registered after the numpy kernels (same op and
version, so they win) when the library file is there (it loads on the first call). Each tries
oneDNN and calls the numpy kernel for the
node when oneDNN cannot run its attributes or dtypes (each module lists its fallback cases),
or when oneDNN was hidden after loading (``ANYCHIP_ONEDNN=0`` and ``_lib.reset()``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels import (
    op_activations,
    op_channel_shuffle,
    op_concat,
    op_contrib_conv,
    op_conv,
    op_matmul,
    op_matmul_add,
    op_pool,
    op_rnn,
)
from anychip.backends.cpu.kernels._out import fits
from anychip.backends.cpu.native import copies
from anychip.backends.cpu.native import linear as _linear
from anychip.backends.cpu.onednn import _lib as _lib_mod
from anychip.backends.cpu.onednn import _math
from anychip.backends.cpu.onednn import conv as _conv_mod
from anychip.backends.cpu.onednn import conv_split as _conv_split
from anychip.backends.cpu.onednn import matmul as _matmul_mod
from anychip.backends.cpu.onednn import nan_guard as _nan_guard
from anychip.backends.cpu.onednn import pool as _pool_mod
from anychip.backends.cpu.onednn import rnn as _rnn_mod
from anychip.backends.cpu.onednn import shuffle as _shuffle_mod
from anychip.backends.cpu.onednn._lib import C, team_for
from anychip.backends.cpu.onednn._lib import available as _lib_available
from anychip.backends.cpu.onednn._prim import channels_last as channels_last_shape
from anychip.backends.cpu.onednn._prim import from_channels_last
from anychip.backends.cpu.onednn._prim import from_channels_last_ok as channels_last_ok
from anychip.backends.cpu.onednn.conv import eltwise
from anychip.backends.cpu.replay import record as _replay
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType
from anychip.opsets.com_microsoft import MS_DOMAIN
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["ONEDNN_KERNELS", "RUNS"]

#: Runs per (op, "onednn" or "numpy"): which path served each call (tests and benchmarks read
#: it to see that oneDNN ran, or that a node fell back).
RUNS: Counter[tuple[str, str]] = Counter()


def _node_memo(ctx: Any, name: str) -> dict:
    """The node's own dict ``name`` in its ``meta``, for what its kernel remembers between
    calls (a clone's meta starts as a copy of the original's: it gets a dict of its own)."""
    node = ctx.node
    kept = node.meta.get(name)
    if kept is None or kept[0] is not node:
        kept = node.meta[name] = (node, {})
    return kept[1]


# Each primitive runs on one OpenMP thread when its work is small (``_lib.team_for``).
def _conv(x: np.ndarray, w: np.ndarray, *args: Any, ctx: Any = None) -> Any:
    memo = None if ctx is None else _node_memo(ctx, "onednn_conv")
    sized = memo.get("work") if memo is not None else None
    if sized is not None and sized[0] == x.shape and sized[1] == w.shape:
        work, small = sized[2], sized[3]  # the node's last call had these shapes
    else:
        # output positions times the weights: a stride-2 convolution has a quarter of the
        # input's
        work = x.size // x.shape[1] * w.size if x.ndim > 1 and x.shape[1] else 0
        for s in args[3].get("strides") or ():
            work //= max(int(s), 1)
        small = _conv_split.team_work(x, w) if x.ndim == 4 and x.shape[0] == 1 else None
        if memo is not None:
            memo["work"] = (x.shape, w.shape, work, small)
    with team_for(work, small) as team:  # a one-thread convolution may split its rows
        return _conv_mod.conv(x, w, *args, team=team, memo=memo)


def pool(x: np.ndarray, *args: Any, ctx: Any = None) -> Any:
    """A pooling node through oneDNN, with the node's memo of primitives (``pool.pool``):
    looking them up by source shape, strides and team costs 4-6 us less a call than working
    the window out again (warm, 2 threads, medians of 2000, us, before / after, load 2.8:
    GlobalAveragePool 544x7x7 17.2-17.6 / 12.3-13.3, AveragePool 3x3/2 136x28x28 27.1-27.7 /
    21.7-22.1, MaxPool 3x3/2 256x27x27 35.2-35.4 / 30.6-31.1)."""
    memo = None if ctx is None else _node_memo(ctx, "onednn_pool")
    with team_for(x.size * 9):
        return _pool_mod.pool(x, *args, memo=memo)


def recurrent(op: str, x: Any, w: Any, r: Any, *args: Any) -> Any:
    steps = x.shape[0] if x is not None and x.ndim else 1
    work = (x.size // max(steps, 1)) * ((w.size + r.size) // max(x.shape[-1], 1))
    with team_for(work) as team:  # a small-step recurrence may split its batch
        return _rnn_mod.recurrent(op, x, w, r, *args, team=team)


def _matmul(a: np.ndarray, b: np.ndarray, out: Any, trans_b: bool = False) -> Any:
    if b.ndim != 2:
        return None
    n = b.shape[0] if trans_b else b.shape[1]
    y = _matmul_mod.split_gemv(a, b, out, trans_b)  # one row, large weights, 2+ threads
    if y is not None:
        return y
    if a.size * n < _matmul_mod.MIN_MACS:
        return None  # numpy's (matmul.py declines it): without the OpenMP team's switch
    if _math.current() == _math.STRICT:  # numpy's float32 sgemm halves: not in bf16 math
        y = _matmul_mod.split_columns(a, b, out, trans_b)  # two threads or more, mid-sized
        if y is not None:
            return y
    with team_for(a.size * n, _lib_mod.MATMUL_SMALL_WORK) as team:  # rows may split
        return _matmul_mod.matmul(a, b, out, trans_b, team)


def _served(op: str, y: Any) -> Any:
    RUNS[op, "numpy" if y is None else "onednn"] += 1
    return y


_ZERO = np.float32(0)

#: Merged into the CPU table by the plugin hook when ``onednn.findable()``.
ONEDNN_KERNELS = KernelTable("cpu")
kernel = ONEDNN_KERNELS.register

#: Ops whose oneDNN kernel reads a channels-last input in place.
_CHANNELS_LAST_READERS = frozenset(
    {"Conv", "FusedConv", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}
)


def _readers_take_channels_last(node: Any, depth: int = 2) -> bool:
    """Every reader of the node's output (in its partition) is a oneDNN kernel, or a Relu or
    a channel Concat whose own readers are (``relu`` and ``concat`` below keep the layout),
    and the output leaves neither the graph nor the partition."""
    value = node.outputs[0] if node.outputs else None
    uses = value.uses if value is not None else []
    graph = getattr(node, "graph", None)
    if not uses or graph is not None and any(o is value for o in graph.outputs):
        return False  # a graph or partition output: other devices and users get C order
    for user, _ in uses:
        if user.domain not in ("", "ai.onnx", MS_DOMAIN):
            return False
        if (user.op_type == "Relu" or _channel_concat(user)) and depth > 0:
            if not _readers_take_channels_last(user, depth - 1):
                return False
        elif user.op_type not in _CHANNELS_LAST_READERS:
            return False
    return True


def _channel_concat(node: Any) -> bool:
    """A Concat along the channels of 4-D tensors (the only kind ``concat`` below keeps
    channels-last)."""
    if node.op_type != "Concat":
        return False
    value = node.outputs[0] if node.outputs else None
    return value is not None and value.rank == 4 and node.attr("axis", 1) in (1, -3)


def _channels_last(ctx: Any, out: np.ndarray | None = None) -> bool:
    """Whether the node's output should stay channels-last: it has no planned ``out`` (Conv
    uses the plan's C-contiguous buffer when given; FusedConv and the pools ask without it:
    a pool keeps a channels-last source's layout for oneDNN readers, where writing the plan's
    NCHW buffer cost a reorder there and another at the next convolution), and every reader
    in this partition is a oneDNN kernel, possibly through a Relu (numpy kernels write
    C-contiguous planned outputs, so for them a strided read would cost more than one reorder
    here). The readers are looked at once per node."""
    if out is not None:
        return False
    node = ctx.node
    keep = node.meta.get("onednn_channels_last")
    if keep is None:
        keep = node.meta["onednn_channels_last"] = _readers_take_channels_last(node)
    return keep


def _relu_into(x: np.ndarray, y: np.ndarray) -> None:
    """``y = max(x, 0)``: a replay's step (numpy deprecates ``out`` given positionally)."""
    np.maximum(x, _ZERO, out=y)


@kernel("Relu", since=1, dtypes=op_activations.NUMERIC_TYPES, inplace=True)
def relu(x: np.ndarray, consumed_inputs: Any = None, out: np.ndarray | None = None) -> np.ndarray:
    """Relu that keeps a channels-last input channels-last (a oneDNN kernel made it for a
    oneDNN reader, ``_channels_last``); anything else goes to the numpy kernel and its ``out``.
    """
    if x.dtype == np.float32 and x.flags.c_contiguous:  # numpy's maximum, noted for a replay
        y = out if fits(out, x.shape, x.dtype) else _replay.empty(x.shape)
        np.maximum(x, _ZERO, out=y)
        if _replay.ACTIVE:
            _replay.note(_relu_into, (x, y))
            _replay.seal()
        return y
    if x.dtype == np.float32 and not x.flags.c_contiguous and x.ndim in (3, 4, 5):
        if channels_last_ok(x):
            # in the input's memory order (4-D: the recorder's buffer while recorded,
            # backends/cpu/replay/record.py; else numpy's empty_like, which keeps it)
            if x.ndim == 4:
                y = from_channels_last(_replay.empty(channels_last_shape(x.shape)))
            else:
                y = np.empty_like(x)
            np.maximum(x, _ZERO, out=y)
            if _replay.ACTIVE:  # that one call: all it did
                _replay.note(_relu_into, (x, y))
                _replay.seal()
            return y
    return op_activations.relu(x, consumed_inputs, out=out)


@kernel("Concat", since=1, context=True)
def concat(
    ctx: Any, *inputs: np.ndarray, axis: int | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """A channel Concat of float32 4-D tensors, one of them channels-last already, whose
    readers are all oneDNN kernels writes a channels-last buffer (one strided copy per input,
    or with two threads or more blocks of pixels on the pool's threads when every input is
    channels-last, ``cpu/native/copies.concat_channels_last``; the next convolution or pool
    reads it without a reorder, and producers that are oneDNN kernels keep their outputs
    channels-last for it), declining the plan's NCHW buffer as FusedConv does. Anything else
    (all inputs NCHW: the unfused graph, whose Conv nodes write the plan) is numpy's Concat
    into the planned ``out``."""
    arrays = [x for x in inputs if x is not None]
    if (
        len(arrays) > 1
        and (1 if axis is None else axis) in (1, -3)
        and all(a.dtype == np.float32 and a.ndim == 4 for a in arrays)
        and all(a.shape[0] == arrays[0].shape[0] for a in arrays)
        and all(a.shape[2:] == arrays[0].shape[2:] for a in arrays)
        and any(not a.flags.c_contiguous and channels_last_ok(a) for a in arrays)
        and _channels_last(ctx)
    ):
        first = arrays[0]
        shape = (first.shape[0], sum(a.shape[1] for a in arrays)) + first.shape[2:]
        y = from_channels_last(_replay.empty(channels_last_shape(shape)))
        if not copies.concat_channels_last(arrays, y):  # every input channels-last: in C
            c = 0
            for a in arrays:
                part = y[:, c : c + a.shape[1]]
                _replay.copy(part, a)
                c += a.shape[1]
        if _replay.ACTIVE:  # the copies: all it did
            _replay.seal()
        return y
    return op_concat.concat(*inputs, axis=axis, out=out)


@kernel(
    "ChannelShuffle", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE),
    context=True,
)  # fmt: skip
def channel_shuffle(
    ctx: Any, x: np.ndarray, *, group: int, out: np.ndarray | None = None
) -> np.ndarray:
    """ShuffleNet's shuffle whose readers are all oneDNN kernels (its depthwise convolution):
    one copy into channels-last (``onednn/shuffle.py``: the generated tile transpose, else a
    oneDNN reorder), declining the plan's NCHW buffer as FusedConv does; else numpy's copy
    into the planned ``out``."""
    if x.dtype == np.float32 and x.ndim == 4 and _channels_last(ctx):
        y = _shuffle_mod.shuffle(x, group)  # its own threads: the copy's, else the team
        if y is not None:
            return _served("ChannelShuffle", y)
    _served("ChannelShuffle", None)
    return op_channel_shuffle.channel_shuffle(x, group=group, out=out)


@kernel("Conv", since=1, dtypes=op_conv._CONV_TYPES, context=True)
def conv(
    ctx: Any,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """Conv through oneDNN (``onednn/conv.py``), else the numpy kernel. A depthwise Conv
    whose readers are all oneDNN kernels keeps its output channels-last and declines the
    plan's NCHW buffer, as FusedConv does: its reorder back to NCHW cost twice the
    convolution (ShuffleNet's 136 channels at 28x28: 65 us against 33); a 1x1 reader takes
    the channels-last input in place (``conv1x1.py``)."""
    depthwise = w.ndim == 4 and w.shape[1] == 1 and x.ndim == 4 and x.shape[1] > 1
    keep = _channels_last(ctx, None if depthwise and attrs.get("group") == x.shape[1] else out)
    y = _served("Conv", _conv(x, w, b, None, None, attrs, keep, None if keep else out, ctx=ctx))
    return y if y is not None else op_conv.conv(x, w, b, out=out, **attrs)


@kernel("FusedConv", domain=MS_DOMAIN, since=1, context=True)
def fused_conv(
    ctx: Any,
    x: np.ndarray,
    w: np.ndarray,
    b: np.ndarray | None = None,
    z: np.ndarray | None = None,
    *,
    activation: str | None = None,
    activation_params: list[float] | None = None,
    out: np.ndarray | None = None,
    **attrs: Any,
) -> np.ndarray:
    """com.microsoft FusedConv: Z as a sum post-op, the activation as an eltwise post-op.

    Unlike Conv, a FusedConv whose readers are all oneDNN kernels keeps its output
    channels-last and declines the plan's NCHW buffer: the fusion pass makes whole chains of
    them, and a reorder on each side of every convolution cost more than the planned memory
    saves (MobileNet-like at 1 thread: 33.5 ms writing NCHW into the plan, 13.2 ms
    channels-last; onnxruntime 11.8). Otherwise it writes into the planned ``out``."""
    act = eltwise(activation, activation_params) if activation else None
    y = None
    if act is not None or not activation:
        keep = _channels_last(ctx)
        y = _conv(x, w, b, z, act, attrs, keep, None if keep else out, ctx=ctx)
    if _served("FusedConv", y) is not None:
        if _nan_guard.clamps(activation, act):  # oneDNN's max/min would turn NaN into 0
            guard = (x, w, b, z, activation, activation_params, attrs, y, _node_memo(ctx, "nan"))
            _nan_guard.keep_nan(*guard)
            _replay.note(_nan_guard.keep_nan, guard)
        return y
    return op_contrib_conv.fused_conv(
        x, w, b, z, activation=activation, activation_params=activation_params, **attrs
    )


# The fusion pass makes FusedConv only where this kernel is fast: while oneDNN loads (it falls
# back to the slower numpy FusedConv per call otherwise; backends/cpu/passes/_common.fast_kernel).
fused_conv.fast = _lib_available  # type: ignore[attr-defined]


@kernel("MaxPool", since=1, dtypes=op_pool._MAXPOOL_TYPES, context=True)
def max_pool(ctx: Any, x: np.ndarray, *, out: np.ndarray | None = None, **attrs: Any) -> Any:
    """MaxPool through oneDNN when the Indices output is not asked for."""
    if ctx.num_outputs == 1 and not attrs.get("storage_order"):
        keep = _channels_last(ctx)
        y = pool(x, C.pooling_max, attrs.get("kernel_shape"), attrs, "MaxPool", keep, out, ctx=ctx)
        if y is not None:
            return _served("MaxPool", y)
    _served("MaxPool", None)
    return op_pool.max_pool(ctx, x, out=out, **attrs)


@kernel("AveragePool", since=1, dtypes=op_pool._FLOATS, context=True)
def average_pool(
    ctx: Any, x: np.ndarray, *, out: np.ndarray | None = None, **attrs: Any
) -> np.ndarray:
    alg = (
        C.pooling_avg_include_padding
        if attrs.get("count_include_pad")
        else C.pooling_avg_exclude_padding
    )
    keep = _channels_last(ctx)
    y = pool(x, alg, attrs.get("kernel_shape"), attrs, "AveragePool", keep, out, ctx=ctx)
    _served("AveragePool", y)
    return y if y is not None else op_pool.average_pool(x, out=out, **attrs)


@kernel("GlobalAveragePool", since=1, dtypes=op_pool._FLOATS, context=True)
def global_average_pool(ctx: Any, x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    keep = _channels_last(ctx)
    y = pool(x, C.pooling_avg_exclude_padding, None, {}, "GlobalAveragePool", keep, out, ctx=ctx)
    _served("GlobalAveragePool", y)
    return y if y is not None else op_pool.global_average_pool(x, out=out)


@kernel("GlobalMaxPool", since=1, dtypes=op_pool._FLOATS, context=True)
def global_max_pool(ctx: Any, x: np.ndarray, *, out: np.ndarray | None = None) -> np.ndarray:
    y = _served(
        "GlobalMaxPool",
        pool(x, C.pooling_max, None, {}, "GlobalMaxPool", _channels_last(ctx), out, ctx=ctx),
    )
    return y if y is not None else op_pool.global_max_pool(x, out=out)


def _rnn(op: str, x: Any, w: Any, r: Any, b: Any, lens: Any, initial: Sequence[Any], attrs: dict):
    arrays = [np.asarray(a) if a is not None else None for a in (x, w, r, b, *initial)]
    return recurrent(op, arrays[0], arrays[1], arrays[2], arrays[3], lens, arrays[4:], attrs)


@kernel("LSTM", since=1, dtypes=op_rnn._TYPES)
def lstm(
    x: Any,
    w: Any,
    r: Any,
    b: Any = None,
    sequence_lens: Any = None,
    initial_h: Any = None,
    initial_c: Any = None,
    p: Any = None,
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """LSTM through oneDNN (``onednn/rnn.py``; no peepholes), else the numpy kernel."""
    if p is None:
        out = _rnn("LSTM", x, w, r, b, sequence_lens, [initial_h, initial_c], attrs)
        if out is not None:
            return _served("LSTM", out)
    _served("LSTM", None)
    return op_rnn.lstm(x, w, r, b, sequence_lens, initial_h, initial_c, p, **attrs)


@kernel("MatMul", since=1, dtypes=op_matmul._MATMUL_TYPES, context=True)
def matmul(ctx: Any, a: np.ndarray, b: np.ndarray, *, out: np.ndarray | None = None) -> Any:
    """MatMul through oneDNN when B is a constant 2-D float32 (``onednn/matmul.py``); under
    ``MIN_MACS`` numpy's sgemm, called from C for the node's next calls (``linear.Bound``)."""
    memo = _node_memo(ctx, "matmul")
    y = _remembered(memo, "MatMul", a, b, None, out)
    if y is not None:
        return y
    weights = ctx.node.inputs[1]
    if weights is not None and weights.const is not None:
        y = _matmul(a, b, out)
        if y is not None:
            return _served("MatMul", y)
        _remember_linear(memo, a, b, None)
    _served("MatMul", None)
    return op_matmul.matmul(a, b, out=out)


def _remembered(
    memo: dict, op: str, a: np.ndarray, b: np.ndarray, c: np.ndarray | None, out: Any
) -> np.ndarray | None:
    """The node's remembered C call (``_remember_linear``) on these arrays, or None where it
    has none or they are not the remembered ones."""
    fast = memo.get("linear")
    y = fast(a, b, c, out) if fast is not None else None
    if y is not None:
        _served(op, None)  # numpy's sgemm, as the unremembered path counts it
        if _replay.ACTIVE:  # its one C call (noted there): all the node does
            _replay.seal()
    return y


def _remember_linear(memo: dict, a: np.ndarray, b: np.ndarray, c: np.ndarray | None) -> None:
    """Keep the C call of a product ``_matmul`` declined at any thread count (under
    ``MIN_MACS``, not one row): the node's next calls of the same shapes make it alone."""
    if b.ndim == 2 and a.size * b.shape[1] < _matmul_mod.MIN_MACS and a.size != b.shape[0]:
        memo["linear"] = _linear.bound(a, b, c)


@kernel("Gemm", since=1, dtypes=op_matmul._MATMUL_TYPES, context=True)
def gemm(
    ctx: Any,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
    **attrs: Any,
) -> Any:
    """Gemm through oneDNN's matmul when B is a constant 2-D float32, A is not transposed and
    alpha is 1 (the fully connected layer); C added after. Else the numpy kernel, whose BLAS
    runs on one thread inside a partition beside oneDNN (``core/run/blas.py``)."""
    weights = ctx.node.inputs[1]
    beta = float(attrs.get("beta", 1.0))
    if (
        weights is not None
        and weights.const is not None
        and not attrs.get("transA")
        and float(attrs.get("alpha", 1.0)) == 1.0
        and a.ndim == 2
        and (c is None or beta in (0.0, 1.0))
    ):
        y = _matmul(a, b, out, trans_b=bool(attrs.get("transB")))
        if y is not None:
            if c is not None and beta == 1.0:
                cc = c.astype(np.float32, copy=False)
                np.add(y, cc, out=y)
                if _replay.ACTIVE:  # the product sealed; the bias too, noted
                    _replay.note(np.add, (y, cc, y))
            return _served("Gemm", y)
    _served("Gemm", None)
    return op_matmul.gemm(a, b, c, out=out, **attrs)


@kernel(
    "MatMulAdd", domain=ANYCHIP_DOMAIN, since=1, dtypes=(DType.FLOAT, DType.DOUBLE), context=True
)
def matmul_add(
    ctx: Any, a: np.ndarray, b: np.ndarray, c: np.ndarray, *, out: np.ndarray | None = None
) -> Any:
    """``a @ b`` through oneDNN as MatMul's (a constant 2-D float32 B, above ``MIN_MACS``),
    then ``+ c``; else the numpy kernel."""
    memo = _node_memo(ctx, "matmul_add")
    y = _remembered(memo, "MatMulAdd", a, b, c, out)
    if y is not None:
        return y
    weights = ctx.node.inputs[1]
    if weights is not None and weights.const is not None:
        y = _matmul(a, b, out)
        if y is not None:
            _replay.unseal()  # the bias below is numpy's, not noted
            return _served("MatMulAdd", op_matmul_add.add_bias(y, c))
        _remember_linear(memo, a, b, c)
    _served("MatMulAdd", None)
    return op_matmul_add.matmul_add(a, b, c, out=out)


def _one_state(op: str, numpy_kernel: Any) -> None:
    """GRU and RNN (one hidden state) through oneDNN (``onednn/rnn.py``: lbr_gru for GRU,
    the vanilla RNN), else the numpy kernel."""

    def run(
        x: Any,
        w: Any,
        r: Any,
        b: Any = None,
        sequence_lens: Any = None,
        initial_h: Any = None,
        **attrs: Any,
    ) -> tuple[np.ndarray, ...]:
        out = _served(op, _rnn(op, x, w, r, b, sequence_lens, [initial_h], attrs))
        return (
            out if out is not None else numpy_kernel(x, w, r, b, sequence_lens, initial_h, **attrs)
        )

    run.__name__ = op.lower()
    kernel(op, since=1, dtypes=op_rnn._TYPES)(run)


_one_state("GRU", op_rnn.gru)
_one_state("RNN", op_rnn.rnn)
