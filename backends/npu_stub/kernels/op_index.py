"""The index datapath: the shape and mask arithmetic of transformer exports (Shape, Gather,
Unsqueeze, Squeeze, Expand, Cast, Where, Range, comparisons and logic, Max/Min, Slice,
ConstantOfShape, GatherND, ScatterND) over int64, int32, bool and float32 tensors.

The NPU compiles for concrete shapes only (shape policy ``"static"``), so every output shape is
known when a kernel is built: shape-only ops (Unsqueeze, Squeeze, Expand, Reshape) read it from
the graph rather than from their runtime shape inputs. Gather of an embedding table is a
device-side row lookup with ONNX's negative indices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.npu_stub.kernels import Run, builder

__all__: list[str] = []


def _out(node: Any) -> tuple[tuple[int, ...], np.dtype]:
    v = node.outputs[0]
    return tuple(int(d) for d in v.shape), np.dtype(v.dtype.numpy)


@builder("Shape")
def build_shape(node: Any, ctx: Any) -> Run:
    dims = list(node.inputs[0].shape)
    start, end = node.attr("start", 0), node.attr("end")
    value = np.array(dims[slice(start, end)], np.int64)  # concrete at compile time
    return lambda xs: value


@builder("Unsqueeze", "Squeeze", "Identity")
def build_same_data(node: Any, ctx: Any) -> Run:
    shape, _ = _out(node)
    return lambda xs: xs[0].reshape(shape)


@builder("Expand")
def build_expand(node: Any, ctx: Any) -> Run:
    shape, _ = _out(node)
    return lambda xs: np.broadcast_to(xs[0], shape)


@builder("Cast")
def build_cast(node: Any, ctx: Any) -> Run:
    _, dtype = _out(node)
    return lambda xs: xs[0].astype(dtype)


@builder("ConstantOfShape")
def build_constant_of_shape(node: Any, ctx: Any) -> Run:
    shape, dtype = _out(node)
    value = node.attr("value")
    fill = np.asarray(value).reshape(-1)[0] if value is not None else 0
    result = np.full(shape, fill, dtype)
    return lambda xs: result


@builder("Where")
def build_where(node: Any, ctx: Any) -> Run:
    return lambda xs: np.where(xs[0], xs[1], xs[2])


@builder("Range")
def build_range(node: Any, ctx: Any) -> Run:
    _, dtype = _out(node)
    return lambda xs: np.arange(xs[0].item(), xs[1].item(), xs[2].item(), dtype=dtype)


_BINARY = {
    "And": np.logical_and,
    "Or": np.logical_or,
    "Equal": np.equal,
    "Less": np.less,
    "Greater": np.greater,
    "LessOrEqual": np.less_equal,
    "GreaterOrEqual": np.greater_equal,
}
for _op, _fn in _BINARY.items():
    builder(_op)(lambda node, ctx, fn=_fn: lambda xs: fn(xs[0], xs[1]))
builder("Not")(lambda node, ctx: lambda xs: np.logical_not(xs[0]))
builder("Neg")(lambda node, ctx: lambda xs: np.negative(xs[0]))


@builder("Max", "Min")
def build_max_min(node: Any, ctx: Any) -> Run:
    fn = np.maximum if node.op_type == "Max" else np.minimum

    def run(xs: list) -> np.ndarray:
        out = xs[0]
        for x in xs[1:]:
            out = fn(out, x)
        return out

    return run


def _indices(idx: np.ndarray, dim: int) -> np.ndarray:
    idx = idx.astype(np.int64, copy=False)
    if idx.size and (idx.min() < -dim or idx.max() >= dim):
        raise IndexError(f"index out of range [{-dim}, {dim - 1}]")
    return np.where(idx < 0, idx + dim, idx)


@builder("Gather")
def build_gather(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    return lambda xs: np.take(xs[0], _indices(xs[1], xs[0].shape[axis]), axis=axis)


@builder("GatherElements")
def build_gather_elements(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis

    def run(xs: list) -> np.ndarray:
        return np.take_along_axis(xs[0], _indices(xs[1], xs[0].shape[axis]), axis=axis)

    return run


@builder("Slice")
def build_slice(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)

    def run(xs: list) -> np.ndarray:
        starts, ends = xs[1].tolist(), xs[2].tolist()
        axes = xs[3].tolist() if len(xs) > 3 and xs[3] is not None else range(len(starts))
        steps = xs[4].tolist() if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
        index = [slice(None)] * rank
        for a, b, e, s in zip(axes, starts, ends, steps):
            index[a + rank if a < 0 else a] = slice(b, e, s)
        return xs[0][tuple(index)]

    return run


@builder("GatherND")
def build_gather_nd(node: Any, ctx: Any) -> Run:
    def run(xs: list) -> np.ndarray:  # batch_dims 0 (check_node refuses others)
        data, idx = xs[0], xs[1].astype(np.int64)
        k = idx.shape[-1]
        idx = np.where(idx < 0, idx + np.array(data.shape[:k]), idx)
        return data[tuple(np.moveaxis(idx, -1, 0))]

    return run


@builder("CumSum")
def build_cumsum(node: Any, ctx: Any) -> Run:
    exclusive, reverse = int(node.attr("exclusive", 0)), int(node.attr("reverse", 0))

    def run(xs: list) -> np.ndarray:
        x, axis = xs[0], int(xs[1].reshape(-1)[0])
        axis = axis + x.ndim if axis < 0 else axis
        if reverse:
            x = np.flip(x, axis)
        out = np.cumsum(x, axis=axis, dtype=x.dtype)
        if exclusive:
            out = np.concatenate(
                [np.zeros_like(np.take(out, [0], axis)), np.delete(out, -1, axis)], axis
            )
        return np.flip(out, axis) if reverse else out

    return run


@builder("Split")
def build_split(node: Any, ctx: Any) -> Run:
    rank = len(node.inputs[0].shape)
    axis = int(node.attr("axis", 0))
    axis = axis + rank if axis < 0 else axis
    sizes = [int(v.shape[axis]) for v in node.outputs]  # concrete: the static policy
    cuts = np.cumsum(sizes)[:-1].tolist()
    return lambda xs: np.split(xs[0], cuts, axis=axis)


@builder("Pow")
def build_pow(node: Any, ctx: Any) -> Run:
    return lambda xs: np.power(xs[0], xs[1]).astype(xs[0].dtype, copy=False)


_SCATTER = {"add": np.add, "mul": np.multiply}  # max and min: refused in check_node


@builder("ScatterND")
def build_scatter_nd(node: Any, ctx: Any) -> Run:
    reduce = _SCATTER.get(node.attr("reduction", "none"))  # None: replace

    def run(xs: list) -> np.ndarray:
        data, idx, updates = xs[0], xs[1].astype(np.int64), xs[2]
        k = idx.shape[-1]
        dims = np.array(data.shape[:k], np.int64)
        if idx.size and ((idx < -dims).any() or (idx >= dims).any()):
            raise IndexError(f"ScatterND index out of range for dimensions {dims.tolist()}")
        where = tuple(np.moveaxis(np.where(idx < 0, idx + dims, idx), -1, 0))
        out = data.copy()
        if reduce is None:
            out[where] = updates
        else:
            reduce.at(out, where, updates)
        return out

    return run
