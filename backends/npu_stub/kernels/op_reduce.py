"""ReduceMean, ReduceSum, ReduceMax, ReduceMin and Pad: the RMS and layer norms of decoder
exports (Llama, Mistral, Qwen2, Gemma: ``x * Reciprocal(Sqrt(ReduceMean(x * x) + eps))``),
DeBERTa's and MobileBERT's padding. Axes and pads are read when compiled (attributes, or
constant inputs from opset 18 and 11: ``support.COMPILE_TIME_INPUTS``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder
from anychip.backends.npu_stub.kernels.support import opset_of

__all__: list[str] = []

_REDUCE = {"ReduceMean": np.mean, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min}
#: The opset from which each reduction takes its axes as an input.
_AXES_INPUT_SINCE = {"ReduceSum": 13}


def _ints(node: Any, ctx: Any, index: int, attribute: str, since: int) -> list[int] | None:
    """An int list from input ``index`` (opset >= ``since``, read through ``ctx.const``) or
    from ``attribute`` (earlier); None when absent."""
    if opset_of(node) >= since:
        v = node.inputs[index] if index < len(node.inputs) else None
        return None if v is None else [int(a) for a in np.asarray(ctx.const(v)).ravel()]
    got = node.attr(attribute, None)
    return None if got is None else [int(a) for a in got]


@builder(*_REDUCE)
def build_reduce(node: Any, ctx: Any) -> Run:
    fn = _REDUCE[node.op_type]
    rank = len(node.inputs[0].shape)
    axes = _ints(node, ctx, 1, "axes", _AXES_INPUT_SINCE.get(node.op_type, 18))
    keep = bool(node.attr("keepdims", 1))
    if not axes:
        if node.attr("noop_with_empty_axes", 0):
            return lambda xs: np.array(xs[0], copy=True)
        axes = list(range(rank))
    over = tuple(sorted({a % rank if rank else 0 for a in axes}))
    dtype = np.dtype(node.outputs[0].dtype.numpy)
    return lambda xs: np.asarray(fn(xs[0], axis=over, keepdims=keep)).astype(dtype, copy=False)


@builder("Pad")
def build_pad(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    mode = node.attr("mode", "constant")
    if isinstance(mode, bytes):
        mode = mode.decode()
    pads = _ints(node, ctx, 1, "pads", 11) or [0] * (2 * rank)
    value = 0.0
    if opset_of(node) >= 11:
        v = node.inputs[2] if len(node.inputs) > 2 else None
        if v is not None:
            value = float(np.asarray(ctx.const(v)).ravel()[0])
    else:
        value = float(node.attr("value", 0.0))
    axes = _ints(node, ctx, 3, "", 18) if len(node.inputs) > 3 else None
    axes = [a % rank for a in axes] if axes else list(range(rank))
    before, after = [0] * rank, [0] * rank
    for k, a in enumerate(axes):
        before[a], after[a] = pads[k], pads[k + len(axes)]
    grow = [(max(b, 0), max(e, 0)) for b, e in zip(before, after)]
    crop = tuple(slice(-min(b, 0), None if e >= 0 else e) for b, e in zip(before, after))
    numpy_mode = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}

    def run(xs: list) -> np.ndarray:
        x = xs[0][crop]
        if mode == "constant":
            return np.pad(x, grow, mode="constant", constant_values=np.float32(value))
        return np.pad(x, grow, mode=numpy_mode[mode])

    return run
