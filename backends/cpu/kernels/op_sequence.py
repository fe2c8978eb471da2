"""Sequence operators: a sequence is a Python list of numpy arrays.

Every kernel returns its sequence inside a one-element tuple, because the executor reads a
bare list as "one value per output".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError
from anychip.ir.graph import Graph

__all__ = [
    "sequence_empty",
    "sequence_construct",
    "sequence_at",
    "sequence_erase",
    "sequence_insert",
    "sequence_length",
    "split_to_sequence",
    "concat_from_sequence",
    "sequence_map",
]


def _check_seq(seq: Any, op: str) -> list[Any]:
    if not isinstance(seq, list):
        raise KernelError(f"{op}: input must be a sequence, got {type(seq).__name__}")
    return seq


def _position(seq: list[Any], pos: Any, op: str, *, insert: bool = False) -> int:
    """A position in ``seq``; negative counts from the back; insert allows ``len(seq)``."""
    p = int(np.asarray(pos).reshape(-1)[0])
    n = len(seq)
    hi = n if insert else n - 1
    if not -n <= p <= hi:
        raise KernelError(
            f"{op}: position {p} is out of range for a sequence of length {n} (valid: {-n}..{hi})"
        )
    return p + n if p < 0 else p


@kernel("SequenceEmpty", since=11)
def sequence_empty(*, dtype: int | None = None) -> tuple:
    return ([],)


@kernel("SequenceConstruct", since=11)
def sequence_construct(*inputs: Any) -> tuple:
    dtypes = {np.asarray(x).dtype for x in inputs}
    if len(dtypes) > 1:
        raise KernelError(
            "SequenceConstruct: all tensors must share one element type, got "
            f"{sorted(map(str, dtypes))}"
        )
    return (list(inputs),)


@kernel("SequenceAt", since=11)
def sequence_at(seq: Any, position: Any) -> np.ndarray:
    seq = _check_seq(seq, "SequenceAt")
    return seq[_position(seq, position, "SequenceAt")]


@kernel("SequenceErase", since=11)
def sequence_erase(seq: Any, position: Any = None) -> tuple:
    seq = list(_check_seq(seq, "SequenceErase"))
    if not seq:
        raise KernelError("SequenceErase: cannot erase from an empty sequence")
    p = len(seq) - 1 if position is None else _position(seq, position, "SequenceErase")
    del seq[p]
    return (seq,)


@kernel("SequenceInsert", since=11)
def sequence_insert(seq: Any, tensor: Any, position: Any = None) -> tuple:
    seq = list(_check_seq(seq, "SequenceInsert"))
    if seq and np.asarray(seq[0]).dtype != np.asarray(tensor).dtype:
        raise KernelError(
            f"SequenceInsert: tensor type {np.asarray(tensor).dtype} differs from the "
            f"sequence's {np.asarray(seq[0]).dtype}"
        )
    p = len(seq) if position is None else _position(seq, position, "SequenceInsert", insert=True)
    seq.insert(p, tensor)
    return (seq,)


@kernel("SequenceLength", since=11)
def sequence_length(seq: Any) -> np.ndarray:
    return np.array(len(_check_seq(seq, "SequenceLength")), dtype=np.int64)


@kernel("SplitToSequence", since=11)
def split_to_sequence(
    x: np.ndarray, split: Any = None, *, axis: int = 0, keepdims: int = 1
) -> tuple:
    x = np.asarray(x)
    if not -x.ndim <= axis < x.ndim:
        raise KernelError(f"SplitToSequence: axis {axis} is out of range for rank {x.ndim}")
    axis %= x.ndim
    n = x.shape[axis]
    if split is None:
        pieces = np.split(x, n, axis=axis) if n else []
        if not keepdims:
            pieces = [np.squeeze(p, axis=axis) for p in pieces]
        return (pieces,)
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise KernelError(f"SplitToSequence: split size must be positive, got {size}")
        bounds = list(range(size, n, size))
    else:
        sizes = [int(s) for s in split]
        if sum(sizes) != n or any(s < 0 for s in sizes):
            raise KernelError(
                f"SplitToSequence: split sizes {sizes} must be non-negative and sum to the "
                f"axis length {n}"
            )
        bounds = list(np.cumsum(sizes)[:-1])
    return (np.split(x, bounds, axis=axis),)


@kernel("ConcatFromSequence", since=11)
def concat_from_sequence(seq: Any, *, axis: int, new_axis: int = 0) -> np.ndarray:
    seq = [np.asarray(t) for t in _check_seq(seq, "ConcatFromSequence")]
    if not seq:
        raise KernelError("ConcatFromSequence: the input sequence is empty")
    rank = seq[0].ndim + (1 if new_axis else 0)
    if not -rank <= axis < rank:
        raise KernelError(f"ConcatFromSequence: axis {axis} is out of range for rank {rank}")
    try:
        if new_axis:
            return np.stack(seq, axis=axis % rank)
        return np.concatenate(seq, axis=axis % rank)
    except ValueError as e:
        shapes = [list(t.shape) for t in seq]
        raise KernelError(f"ConcatFromSequence: tensors of shapes {shapes} do not fit: {e}") from e


@kernel("SequenceMap", since=17, context=True)
def sequence_map(ctx: KernelContext, seq: Any, *additional: Any, body: Graph) -> tuple:
    seq = _check_seq(seq, "SequenceMap")
    for a in additional:
        if isinstance(a, list) and len(a) != len(seq):
            raise KernelError(
                f"SequenceMap: additional sequence of length {len(a)} differs from the input "
                f"sequence's length {len(seq)}"
            )
    n_out = len(body.outputs)
    results: list[list[Any]] = [[] for _ in range(n_out)]
    for i, item in enumerate(seq):
        args = [item] + [a[i] if isinstance(a, list) else a for a in additional]
        outs = ctx.run_graph(body, args)
        for k in range(n_out):
            results[k].append(outs[k])
    return tuple(results)
