"""Bucketing with padding for static-shape devices: prove a partition safe to pad, then pad.

A static-shape device compiles once per input signature (``core/compile/specialize.py``); a model
fed
many sequence lengths compiles once per length. Bucketing rounds a symbolic dimension up (to a
power of two, or to the next size of a list) so that lengths share one executable: the
partition's inputs are padded with zeros along that dimension and its outputs sliced back.

That is only right when no padded position can influence an unpadded one. ``analyse`` proves
it per partition, conservatively, by propagating *which axes carry the padded dimension*
through the graph (a forward dataflow over the nodes in order, each op with a rule):

* elementwise and broadcasting ops (Add, Mul, Gelu, Where, Cast, BatchNormalization in
  inference, ...): the output carries every padded axis of its inputs, right-aligned;
* MatMul / Gemm: padded row or batch axes carry through; a padded *contracted* axis refuses;
* Softmax, LayerNormalization, reductions: refuse when they reduce over a padded axis (this is
  the attention Softmax over padded keys: no mask is assumed), else carry through;
* Transpose permutes; Concat, Slice, Gather carry through unless they act on the padded axis;
* Reshape, Flatten, Squeeze, Unsqueeze: only when the dims before and after the padded one have
  the same (symbolic) products in input and output, so every row keeps its elements;
* Conv and pools: the batch axis only; Shape and Size read the padded size: refused;
* any other op: refused ("no padding rule").

A value whose inferred shape has the bucketed symbol on an axis the analysis did not mark as
padded (a dimension not derived from a padded input) also refuses. A refusal names the node
and why; the partition then compiles per exact signature as without bucketing. Padding is
zeros (NaN or inf may appear in padded positions, e.g. after a Div: they stay there).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from anychip.core.plugin.shapes import bucket_size, parse_buckets

__all__ = ["BucketPlan", "analyse", "parse_buckets", "bucket_size"]

Axes = dict[int, str]  # axis -> the bucketed symbol it carries

_ELEMENTWISE = frozenset(
    (
        "Add Sub Mul Div Pow Max Min Sum Mean Where Equal Less Greater LessOrEqual "
        "GreaterOrEqual And Or Xor Not Relu Sigmoid Tanh Erf Gelu Sqrt Exp Log Abs Neg Reciprocal "
        "Clip HardSwish HardSigmoid LeakyRelu Elu Selu Softplus Softsign Sin Cos Floor Ceil Round "
        "Sign Cast Identity Dropout PRelu Mish FastGelu"
    ).split()
)
_FIRST_INPUT_ONLY = frozenset(("BatchNormalization", "InstanceNormalization"))
_BATCH_ONLY = frozenset(
    (
        "Conv ConvTranspose MaxPool AveragePool GlobalAveragePool GlobalMaxPool LpPool NpuConv "
        "NpuPool"
    ).split()
)
_RESHAPES = frozenset(("Reshape", "Flatten", "Squeeze", "Unsqueeze"))
_REDUCE = frozenset(
    "ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL2 ReduceL1 ArgMax ArgMin".split()
)


class _Refused(Exception):
    """A node that may let a padded position influence an unpadded one."""


class BucketPlan:
    """Which partition inputs and outputs carry which bucketed dimension, and the rules."""

    def __init__(self, rules: dict[str, Any], inputs: list[Axes], outputs: list[Axes]) -> None:
        self.rules, self.inputs, self.outputs = rules, inputs, outputs

    def describe(self) -> str:
        return ", ".join(
            f"{s}->{'pow2' if r == 'pow2' else list(r)}" for s, r in self.rules.items()
        )

    def targets(self, shapes: Sequence[tuple[int, ...]]) -> dict[str, tuple[int, int]] | None:
        """symbol -> (actual size, bucket size) for these input shapes; None when the inputs
        disagree on a symbol's size (the run then goes unpadded and fails or not on its own)."""
        sizes: dict[str, int] = {}
        for axes, shape in zip(self.inputs, shapes):
            for axis, sym in axes.items():
                if sizes.setdefault(sym, int(shape[axis])) != int(shape[axis]):
                    return None
        return {s: (n, bucket_size(self.rules[s], n)) for s, n in sizes.items()}

    def pad(self, arrays: Sequence[np.ndarray], targets: dict[str, tuple[int, int]]) -> list:
        """The inputs padded with zeros up to their buckets."""
        out = []
        for a, axes in zip(arrays, self.inputs):
            if not axes:  # not carried: passed as it is (it may be a device tensor)
                out.append(a)
                continue
            widths = [(0, 0)] * np.ndim(a)
            for axis, sym in axes.items():
                n, b = targets[sym]
                widths[axis] = (0, b - n)
            out.append(np.pad(a, widths) if any(w for _, w in widths) else a)
        return out

    def slice(self, arrays: Sequence[np.ndarray], targets: dict[str, tuple[int, int]]) -> list:
        """The outputs cut back to the actual sizes."""
        out = []
        for a, axes in zip(arrays, self.outputs):
            if not axes:  # not carried: passed as it is (it may be a device tensor)
                out.append(a)
                continue
            index = [slice(None)] * np.ndim(a)
            for axis, sym in axes.items():
                index[axis] = slice(0, targets[sym][0])
            out.append(np.ascontiguousarray(a[tuple(index)]))
        return out


def analyse(graph: Any, rules: Mapping[str, Any]) -> BucketPlan | str:
    """A plan padding ``graph``'s inputs along the symbols of ``rules``, or why it is unsafe."""
    carried: dict[int, Axes] = {}
    inputs: list[Axes] = []
    for v in graph.inputs:
        axes = {i: d for i, d in enumerate(v.shape or ()) if isinstance(d, str) and d in rules}
        inputs.append(axes)
        if axes:
            carried[id(v)] = axes
    if not carried:
        return f"no partition input has a dimension among {sorted(rules)}"
    for node in graph.nodes:
        ins = [carried.get(id(v), {}) if v is not None else {} for v in node.inputs]
        try:
            outs = _rule(node, ins) if any(ins) else [{} for _ in node.outputs]
            for v, axes in zip(node.outputs, outs):
                if v is not None:
                    _check_symbols(node, v, axes, rules)
                    if axes:
                        carried[id(v)] = axes
        except _Refused as e:
            return f"{node.op_type} node {node.name!r}: {e}"
    outputs = [carried.get(id(v), {}) for v in graph.outputs]
    return BucketPlan(dict(rules), inputs, outputs)


def _check_symbols(node: Any, v: Any, axes: Axes, rules: Mapping[str, Any]) -> None:
    for i, d in enumerate(v.shape or ()):
        if isinstance(d, str) and d in rules and axes.get(i) != d:
            raise _Refused(f"output {v.name!r} has dimension {d} at axis {i} not padded with it")


def _rule(node: Any, ins: list[Axes]) -> list[Axes]:
    op = node.op_type
    if op in _ELEMENTWISE:
        return [_broadcast(node, ins)] * len(node.outputs)
    if op in _FIRST_INPUT_ONLY:
        if any(ins[1:]):
            raise _Refused("a padded parameter input")
        return [ins[0]] + [{}] * (len(node.outputs) - 1)
    if op in _BATCH_ONLY:
        if any(set(a) - {0} for a in ins):
            raise _Refused("only the batch axis may be padded")
        return [ins[0]]
    if op == "MatMul":
        return [_matmul(node, ins)]
    if op == "Gemm":
        return [_gemm(node, ins)]
    if op in ("Softmax", "LogSoftmax", "Hardmax", "LayerNormalization"):
        return _normalization(node, ins)
    if op in _REDUCE:
        return [_reduce(node, ins)]
    if op == "Transpose":
        rank = len(node.inputs[0].shape)
        perm = [int(p) for p in (node.attr("perm") or range(rank - 1, -1, -1))]
        return [{j: ins[0][p] for j, p in enumerate(perm) if p in ins[0]}]
    if op in _RESHAPES:
        return [_reshape(node, ins)]
    if op == "Concat":
        axis = _axis(node, int(node.attr("axis")), node.outputs[0])
        if any(axis in a for a in ins):
            raise _Refused(f"concatenates along padded axis {axis}")
        return [_broadcast(node, ins)]
    if op in ("Slice", "Gather"):
        return [_select(node, ins)]
    raise _Refused("no padding rule for this op")


def _axis(node: Any, axis: int, v: Any) -> int:
    rank = len(v.shape)
    return axis + rank if axis < 0 else axis


def _broadcast(node: Any, ins: list[Axes]) -> Axes:
    """Right-aligned union of the inputs' padded axes (numpy broadcasting)."""
    rank = len(node.outputs[0].shape)
    out: Axes = {}
    for v, axes in zip(node.inputs, ins):
        shift = rank - len(v.shape)
        for a, sym in axes.items():
            if out.setdefault(a + shift, sym) != sym:
                raise _Refused(f"two bucketed dimensions meet at axis {a + shift}")
    return out


def _matmul(node: Any, ins: list[Axes]) -> Axes:
    ra, rb = len(node.inputs[0].shape), len(node.inputs[1].shape)
    if (ins[0] and ra < 2) or (ins[1] and rb < 2):
        raise _Refused("a padded 1-D operand")
    if ra - 1 in ins[0] or rb - 2 in ins[1]:
        raise _Refused("contracts over the padded axis")
    r = max(ra, rb)
    out: Axes = {}
    for axes, rk, own in ((ins[0], ra, r - 2), (ins[1], rb, r - 1)):
        for a, sym in axes.items():  # A's rows -> r-2, B's columns -> r-1, batch right-aligned
            target = own if a >= rk - 2 else a + r - rk
            if out.setdefault(target, sym) != sym:
                raise _Refused(f"two bucketed dimensions meet at axis {target}")
    return out


def _gemm(node: Any, ins: list[Axes]) -> Axes:
    ta, tb = int(node.attr("transA", 0)), int(node.attr("transB", 0))
    out: Axes = {}
    if ins[0]:
        if (1 - ta) in ins[0]:
            raise _Refused("contracts over the padded axis")
        out[0] = ins[0][ta]
    if ins[1]:
        if tb in ins[1]:
            raise _Refused("contracts over the padded axis")
        out[1] = ins[1][1 - tb]
    if len(ins) > 2 and ins[2]:
        for a, sym in ins[2].items():
            if out.setdefault(a + 2 - len(node.inputs[2].shape), sym) != sym:
                raise _Refused("two bucketed dimensions meet")
    return out


def _normalization(node: Any, ins: list[Axes]) -> list[Axes]:
    op, rank = node.op_type, len(node.inputs[0].shape)
    if op == "LayerNormalization":
        start = _axis(node, int(node.attr("axis", -1)), node.inputs[0])
        reduced = set(range(start, rank))
    elif int(node.meta.get("since") or node.version or 13) >= 13:
        reduced = {_axis(node, int(node.attr("axis", -1)), node.inputs[0])}
    else:
        reduced = set(range(_axis(node, int(node.attr("axis", 1)), node.inputs[0]), rank))
    if any(ins[1:]):
        raise _Refused("a padded scale or bias")
    if reduced & set(ins[0]):
        raise _Refused(f"normalizes over the padded axis {sorted(reduced & set(ins[0]))}")
    return [ins[0]] + [dict(ins[0])] * (len(node.outputs) - 1)


def _const_axes(node: Any, attr: str, index: int) -> list[int] | None:
    axes = node.attr(attr)
    if axes is None and len(node.inputs) > index and node.inputs[index] is not None:
        const = node.inputs[index].const
        if const is None:
            raise _Refused(f"its {attr} are not constant")
        axes = const.tolist()
    return None if axes is None else [int(a) for a in np.atleast_1d(axes)]


def _reduce(node: Any, ins: list[Axes]) -> Axes:
    rank = len(node.inputs[0].shape)
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [int(node.attr("axis", 0))]
    else:
        axes = _const_axes(node, "axes", 1)
    reduced = set(range(rank)) if not axes else {a + rank if a < 0 else a for a in axes}
    if reduced & set(ins[0]):
        raise _Refused(f"reduces over the padded axis {sorted(reduced & set(ins[0]))}")
    if int(node.attr("keepdims", 1)):
        return dict(ins[0])
    return {a - sum(r < a for r in reduced): s for a, s in ins[0].items()}


def _reshape(node: Any, ins: list[Axes]) -> Axes:
    """Rows stay rows when the dims before and after the padded axis have equal products."""
    if any(ins[1:]) or len(ins[0]) != 1:
        raise _Refused("more than one padded axis, or a padded shape input")
    (p, sym), src, dst = next(iter(ins[0].items())), node.inputs[0].shape, node.outputs[0].shape
    hits = [q for q, d in enumerate(dst) if d == sym]
    if src is None or dst is None or src.count(sym) != 1 or len(hits) != 1:
        raise _Refused(f"cannot follow the padded axis {p} through the reshape")
    q = hits[0]
    if _product(src[:p]) != _product(dst[:q]) or _product(src[p + 1 :]) != _product(dst[q + 1 :]):
        raise _Refused(f"mixes the padded axis {p} with others ({src} -> {dst})")
    return {q: sym}


def _product(dims: Sequence[Any]) -> tuple:
    if any(d is None or (isinstance(d, int) and d < 0) for d in dims):
        return ("unknown", object())  # never equal: an unknown dim refuses
    ints = math.prod(d for d in dims if isinstance(d, int))
    return ints, tuple(sorted(d for d in dims if isinstance(d, str)))


def _select(node: Any, ins: list[Axes]) -> Axes:
    data = ins[0]
    if node.op_type == "Slice":
        if any(ins[1:]):
            raise _Refused("padded slice bounds")
        axes = _const_axes(node, "axes", 3)
        rank = len(node.inputs[0].shape)
        sliced = set(range(rank)) if axes is None else {a + rank if a < 0 else a for a in axes}
        if sliced & set(data):
            raise _Refused(f"slices the padded axis {sorted(sliced & set(data))}")
        return dict(data)
    axis = _axis(node, int(node.attr("axis", 0)), node.inputs[0])
    if axis in data:
        raise _Refused(f"gathers along the padded axis {axis}")
    ri = len(node.inputs[1].shape)
    out = {a if a < axis else a + ri - 1: s for a, s in data.items()}
    out.update({a + axis: s for a, s in ins[1].items()})
    return out
