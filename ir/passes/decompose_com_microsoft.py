"""``com.microsoft`` operators rewritten into standard ONNX ops, so other devices can take them.

onnxruntime's transformer optimizer fuses subgraphs into contrib ops (Gelu, FastGelu,
BiasGelu, QuickGelu, FusedMatMul, SkipLayerNormalization). The CPU runs them natively
(``backends/cpu/kernels/op_contrib_*.py``); a device without those kernels (the NPU, the XPU,
a plugin's) would leave them on the CPU and pay two copies per op. ``decompose_for_devices``
runs after the generic passes and before placement (``core/compile/pipeline.py``): a contrib node is
rewritten into the standard subgraph its spec states only when a device that the session
prefers to every device running the node as written can run every op of that subgraph. With
the CPU alone, or the CPU first, or a pin on the node, nothing changes, so the CPU keeps its
native kernels and its own fusions (those run later, per CPU partition). The rewritten nodes
then go through placement like any other; when they all land on one device that runs the
node as written (the cost model kept them on the CPU), ``recompose_unmoved`` puts the node
back before partitioning.

Decompositions (the formulas of onnxruntime's ContribOperators.md):
    Gelu(x)                  0.5 * x * (1 + Erf(x / sqrt 2))
    BiasGelu(a, b)           Gelu(a + b)
    FastGelu(x, bias?)       v = x (+ bias); 0.5 * v * (1 + Tanh(sqrt(2/pi) * (v + 0.044715 v^3)))
    QuickGelu(x)             x * Sigmoid(alpha * x)
    FusedMatMul(a, b)        alpha * MatMul(a or a^T, b or b^T)  (no transBatch; ranks known)
    FusedGemm(a, b, c?)      activation(Gemm(a, b, c)) for Relu, Tanh, Sigmoid, LeakyRelu
                             (the CPU's own FusedGemm fusion runs later, on CPU partitions)
    Attention, MultiHeadAttention   projections, heads, softmax(Q K^T * scale + mask) V
                             (no past state, raw [B, T] masks only:
                             ``com_microsoft_attention_decompose.py``)
    EmbedLayerNormalization  LayerNormalization(Gather(word) + positions (+ Gather(segment)))
    SkipLayerNormalization   LayerNormalization(input + skip (+ bias), gamma, beta, axis=-1)
                             (output 0 and output 3 only; the model's opset >= 17), or for
                             a device without LayerNormalization the same written out:
                             d = s - ReduceMean(s); d / Sqrt(ReduceMean(d * d) + eps) * gamma + beta
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.errors import AnychipError
from anychip.ir.dtypes import DType
from anychip.ir.graph import Graph, Model
from anychip.ir.node import Node
from anychip.ir.passes.decompose_com_microsoft_attention import (
    attention,
    attention_shape,
    embed_layer_norm,
    multi_head_attention,
)
from anychip.ir.passes.rewrite import Names, attrs
from anychip.ir.value import Value
from anychip.opsets.schemas import resolve

__all__ = ["decompose_for_devices", "recompose_unmoved", "DECOMPOSABLE"]

MS = "com.microsoft"
#: graph.meta key: the decompositions made, (original node, its standard nodes, constants).
_GROUPS = "decomposed_contrib"
_FLOATS = (DType.FLOAT, DType.DOUBLE, DType.FLOAT16)


class _Builder:
    """Makes the standard nodes of one decomposition, typed like the node they replace."""

    def __init__(self, node: Node, names: Names, opset: int, outputs: list[Value]) -> None:
        self.node, self.names, self.opset = node, names, opset
        self.like = node.inputs[0]
        self.outputs = outputs  # the values the last nodes must produce
        self.nodes: list[Node] = []
        self.constants: list[Value] = []

    def const(self, value: float) -> Value:
        dtype = self.like.dtype.numpy
        v = Value(self.names.fresh(f"{self.node.name}_c"), const=np.array(value, dtype))
        self.constants.append(v)
        return v

    def op(
        self, op_type: str, inputs: list[Value | None], out: Value | None = None, **at: Any
    ) -> Value:
        if out is None:
            out = Value(self.names.fresh(f"{self.node.name}_{op_type.lower()}"), self.like.dtype)
            out.shape = self.like.shape
        node = Node(
            op_type,
            inputs,
            [out],
            version=self.opset,
            attributes=attrs(**at),
            name=self.names.fresh(f"{self.node.name}/{op_type}"),
        )
        self.nodes.append(node)
        return out


def _erf_gelu(b: _Builder, x: Value, out: Value) -> None:
    e = b.op("Erf", [b.op("Mul", [x, b.const(0.7071067811865476)])])
    half_x = b.op("Mul", [x, b.const(0.5)])
    b.op("Mul", [half_x, b.op("Add", [e, b.const(1.0)])], out)


def _gelu(b: _Builder) -> bool:
    _erf_gelu(b, b.node.inputs[0], b.outputs[0])
    return True


def _bias_gelu(b: _Builder) -> bool:
    _erf_gelu(b, b.op("Add", b.node.inputs[:2]), b.outputs[0])
    return True


def _fast_gelu(b: _Builder) -> bool:
    x = b.node.inputs[0]
    if len(b.node.inputs) > 1 and b.node.inputs[1] is not None:
        x = b.op("Add", [x, b.node.inputs[1]])
    cube = b.op("Mul", [b.op("Mul", [x, x]), x])
    inner = b.op("Add", [x, b.op("Mul", [cube, b.const(0.044715)])])
    t = b.op("Tanh", [b.op("Mul", [inner, b.const(0.7978845608028654)])])
    b.op("Mul", [b.op("Mul", [x, b.const(0.5)]), b.op("Add", [t, b.const(1.0)])], b.outputs[0])
    return True


def _quick_gelu(b: _Builder) -> bool:
    x = b.node.inputs[0]
    alpha = float(b.node.attr("alpha", 1.702))
    b.op("Mul", [x, b.op("Sigmoid", [b.op("Mul", [x, b.const(alpha)])])], b.outputs[0])
    return True


def _swap_last(b: _Builder, v: Value) -> Value | None:
    if v.rank is None or v.rank < 2:
        return None
    perm = list(range(v.rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    out = b.op("Transpose", [v], perm=perm)
    out.shape = tuple(v.shape[i] for i in perm)
    return out


def _fused_matmul(b: _Builder) -> bool:
    n = b.node
    if n.attr("transBatchA", 0) or n.attr("transBatchB", 0):
        return False
    a, m = n.inputs[0], n.inputs[1]
    if n.attr("transA", 0) and (a := _swap_last(b, a)) is None:
        return False
    if n.attr("transB", 0) and (m := _swap_last(b, m)) is None:
        return False
    alpha = float(n.attr("alpha", 1.0))
    if alpha == 1.0:
        b.op("MatMul", [a, m], b.outputs[0])
    else:
        product = b.op("MatMul", [a, m])
        product.shape = b.outputs[0].shape
        b.op("Mul", [product, b.const(alpha)], b.outputs[0])
    return True


#: FusedGemm activations with a standard op of the same name, and the attributes they take.
_ACTIVATIONS = {"Relu": (), "Tanh": (), "Sigmoid": (), "LeakyRelu": ("alpha",)}


def _fused_gemm(b: _Builder) -> bool:
    n = b.node
    act = n.attr("activation", "") or ""
    if act not in _ACTIVATIONS or any(v is None or v.rank != 2 for v in n.inputs[:2]):
        return False
    gemm_attrs = {k: n.attr(k, d) for k, d in (("alpha", 1.0), ("beta", 1.0))}
    gemm_attrs.update({k: int(n.attr(k, 0)) for k in ("transA", "transB")})
    gemm_attrs = {k: float(v) if k in ("alpha", "beta") else v for k, v in gemm_attrs.items()}
    y = b.op("Gemm", [v for v in n.inputs[:3] if v is not None], **gemm_attrs)
    y.shape = b.outputs[0].shape
    act_attrs = {"alpha": float(n.attr("activation_alpha", 0.01))} if act == "LeakyRelu" else {}
    b.op(act, [y], b.outputs[0], **act_attrs)
    return True


def _skip_sum(b: _Builder) -> Value | None:
    """``input + skip (+ bias)``, written to output 3 when the node has it; None when
    the node's mean or inv_std outputs are read (no standard op gives them)."""
    n = b.node
    outs = list(n.outputs) + [None] * (4 - len(n.outputs))
    read = [o is not None and (o.uses or o in n.graph.outputs) for o in outs[1:3]]
    if any(read):
        return None
    bias = n.inputs[4] if len(n.inputs) > 4 else None
    total = b.op("Add", n.inputs[:2])
    if bias is not None:
        return b.op("Add", [total, bias], b.outputs[3] if outs[3] is not None else None)
    if outs[3] is not None:
        return b.op("Identity", [total], b.outputs[3])
    return total


def _skip_layer_norm(b: _Builder) -> bool:
    """LayerNormalization (standard from opset 17) of the skip sum."""
    total = _skip_sum(b) if b.opset >= 17 else None
    if total is None:
        return False
    n = b.node
    ins = [total, n.inputs[2]] + ([n.inputs[3]] if len(n.inputs) > 3 and n.inputs[3] else [])
    eps = float(n.attr("epsilon", 1e-12))
    b.op("LayerNormalization", ins, b.outputs[0], axis=-1, epsilon=eps)
    return True


def _reduce_mean_last(b: _Builder, v: Value) -> Value:
    if b.opset >= 18:  # axes became an input
        axes = Value(b.names.fresh(f"{b.node.name}_axes"), const=np.array([-1], np.int64))
        b.constants.append(axes)
        out = b.op("ReduceMean", [v, axes], keepdims=1)
    else:
        out = b.op("ReduceMean", [v], axes=[-1], keepdims=1)
    out.shape = None if v.shape is None else (*v.shape[:-1], 1)
    return out


def _skip_layer_norm_expanded(b: _Builder) -> bool:
    """The same, with LayerNormalization written out (for a device without it):
    d = s - mean(s); y = d / sqrt(mean(d * d) + eps) * gamma (+ beta)."""
    total = _skip_sum(b)
    if total is None:
        return False
    n = b.node
    d = b.op("Sub", [total, _reduce_mean_last(b, total)])
    var = _reduce_mean_last(b, b.op("Mul", [d, d]))
    shifted = b.op("Add", [var, b.const(float(n.attr("epsilon", 1e-12)))])
    shifted.shape = var.shape
    std = b.op("Sqrt", [shifted])
    std.shape = var.shape
    beta = n.inputs[3] if len(n.inputs) > 3 else None
    scaled = b.op("Mul", [b.op("Div", [d, std]), n.inputs[2]], None if beta else b.outputs[0])
    if beta is not None:
        b.op("Add", [scaled, beta], b.outputs[0])
    return True


#: op_type -> its decompositions, most compact first; each builds into a ``_Builder`` and
#: says whether it could.
DECOMPOSABLE: dict[str, tuple[Callable[[_Builder], bool], ...]] = {
    "Gelu": (_gelu,),
    "BiasGelu": (_bias_gelu,),
    "FastGelu": (_fast_gelu,),
    "QuickGelu": (_quick_gelu,),
    "FusedMatMul": (_fused_matmul,),
    "FusedGemm": (_fused_gemm,),
    "SkipLayerNormalization": (_skip_layer_norm, _skip_layer_norm_expanded),
    "Attention": (attention,),
    "MultiHeadAttention": (multi_head_attention,),
    "EmbedLayerNormalization": (embed_layer_norm,),
}


def _broadcast(*shapes: tuple | None) -> tuple | None:
    """The broadcast of ``shapes`` (dims ints or names), or None when it is not known."""
    if any(sh is None for sh in shapes):
        return None
    rank = max(len(sh) for sh in shapes)
    out = []
    for i in range(rank):
        dims = {sh[i - rank + len(sh)] for sh in shapes if i - rank + len(sh) >= 0} - {1}
        if len(dims) > 1 or None in dims:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _matmul_shape(node: Node) -> tuple | None:
    a, b = (v.shape for v in node.inputs[:2])
    if a is None or b is None or len(a) < 2 or len(b) < 2:
        return None
    if node.attr("transBatchA", 0) or node.attr("transBatchB", 0):
        return None
    m = a[-1] if node.attr("transA", 0) else a[-2]
    n = b[-2] if node.attr("transB", 0) else b[-1]
    batch = _broadcast(tuple(a[:-2]), tuple(b[:-2]))
    return None if batch is None else (*batch, m, n)


def _gemm_shape(node: Node) -> tuple | None:
    a, b = (v.shape for v in node.inputs[:2])
    if a is None or b is None or len(a) != 2 or len(b) != 2:
        return None
    return (a[1] if node.attr("transA", 0) else a[0], b[0] if node.attr("transB", 0) else b[1])


def _infer(node: Node) -> None:
    """Shapes of a decomposable node's outputs where the model gave none (onnx's inference
    does not know contrib ops; the devices' capability checks need ranks)."""
    if node.op_type == "FusedMatMul":
        shape = _matmul_shape(node)
    elif node.op_type == "FusedGemm":
        shape = _gemm_shape(node)
    elif node.op_type == "SkipLayerNormalization":
        shape = node.inputs[0].shape
    elif node.op_type in ("Attention", "MultiHeadAttention"):
        shape = attention_shape(node)
    elif node.op_type == "EmbedLayerNormalization":
        ids, word = node.inputs[0], node.inputs[2]
        ok = ids.shape is not None and word.shape is not None and len(ids.shape) == 2
        shape = (*ids.shape, word.shape[-1]) if ok else None
    else:
        shape = _broadcast(*(v.shape for v in node.inputs if v is not None))
    embed = node.op_type == "EmbedLayerNormalization"
    attention = node.op_type in ("Attention", "MultiHeadAttention")  # output 3 is qk, 4-D
    outs = (0, 2) if embed else (0,) if attention else (0, 3)
    like = _typed_input(node)
    for i, o in enumerate(node.outputs):
        if o is not None and o.shape is None and i in outs and shape:
            o.shape = shape
            if not o.dtype:
                o.dtype = like.dtype


def _typed_input(node: Node) -> Value | None:
    """The input whose float type the node's outputs take (EmbedLayerNormalization's first
    input is its token ids: its word table then)."""
    i = 2 if node.op_type == "EmbedLayerNormalization" and len(node.inputs) > 2 else 0
    return node.inputs[i]


def _first_capable(nodes: list[Node], backends: list[Any], tables: dict[str, Any]) -> int:
    """The priority index of the first backend that can run every one of ``nodes``."""
    for i, backend in enumerate(backends):
        if all(backend.supports(n, tables.get(backend.name)) is None for n in nodes):
            return i
    return len(backends)


def _stand_ins(node: Node) -> list[Value]:
    """Typed copies of ``node``'s outputs for a trial build (the real ones stay untouched)."""
    return [
        Value(f"{o.name}__trial", o.dtype, o.shape) if o is not None else Value("", DType.FLOAT)
        for o in list(node.outputs) + [None] * (4 - len(node.outputs))
    ]


def _resolve(nodes: list[Node], schemas: Any) -> None:
    for n in nodes:
        n.meta["since"] = resolve(n.op_type, n.domain, n.version, schemas).since_version


def decompose_for_devices(
    model: Model, backends: list[Any], tables: dict[str, Any], pin_for: Any, schemas: Any
) -> int:
    """Rewrite the decomposable contrib nodes of ``model``'s main graph that a preferred
    device can run only once decomposed; returns how many were rewritten."""
    opset = model.opset_imports.get("", 0)
    if len(backends) < 2 or opset < 13:  # Erf, and the broadcasting forms used, by 13
        return 0
    graph = model.graph
    names = Names(graph)
    done = 0
    for node in list(graph.nodes):
        builds = DECOMPOSABLE.get(node.op_type, ()) if node.domain == MS else ()
        if not builds or pin_for(node) is not None or not node.inputs:
            continue
        typed = _typed_input(node)
        if typed is None or typed.dtype not in _FLOATS:
            continue
        _infer(node)
        as_is = _first_capable([node], backends, tables)
        for build in builds:
            if _preferred(node, build, names, opset, schemas, backends, tables) < as_is:
                _replace(graph, node, build, names, opset, schemas)
                done += 1
                break
    return done


def _preferred(
    node: Node,
    build: Callable[[_Builder], bool],
    names: Names,
    opset: int,
    schemas: Any,
    backends: list[Any],
    tables: dict[str, Any],
) -> int:
    """The priority index of the first device that runs ``build``'s subgraph of ``node``
    (a trial on stand-in outputs, detached after), or ``len(backends)`` when none can."""
    trial = _Builder(node, names, opset, _stand_ins(node))
    ok = build(trial)
    for n in trial.nodes:
        n.detach()
    if not ok:
        return len(backends)
    try:
        _resolve(trial.nodes, schemas)
    except AnychipError:  # a standard op this opset does not have: not decomposable here
        return len(backends)
    return _first_capable(trial.nodes, backends, tables)


def _replace(
    graph: Graph,
    node: Node,
    build: Callable[[_Builder], bool],
    names: Names,
    opset: int,
    schemas: Any,
) -> None:
    at = graph.nodes.index(node)
    outputs = list(node.outputs) + [None] * (4 - len(node.outputs))
    real = [o if o is not None else Value("", DType.FLOAT) for o in outputs]
    graph.remove(node)
    b = _Builder(node, names, opset, real)
    build(b)
    _resolve(b.nodes, schemas)
    for c in b.constants:
        graph.add_initializer(c)
    for i, n in enumerate(b.nodes):
        n.meta["decomposed_from"] = f"{MS}::{node.op_type} {node.name}"
        graph.insert(at + i, n)
    graph.meta.setdefault(_GROUPS, []).append((node, b.nodes, b.constants))


def recompose_unmoved(graph: Graph, backends: list[Any], tables: dict[str, Any]) -> int:
    """After placement: put back each decomposed node whose standard ops all landed on one
    device that runs the node as written (the cost model kept them on the CPU, say), so that
    device keeps its native kernel; returns how many were put back."""
    by_name = {b.name: b for b in backends}
    kept, restored = [], 0
    for original, nodes, constants in graph.meta.get(_GROUPS, []):
        devices = {n.meta.get("device") for n in nodes}
        device = devices.pop() if len(devices) == 1 else None
        backend = by_name.get(device)
        if backend is None or backend.supports(original, tables.get(device)) is not None:
            kept.append((original, nodes, constants))
            continue
        at = min(graph.nodes.index(n) for n in nodes)
        for n in nodes:
            graph.remove(n)
        for c in constants:
            graph.initializers.pop(c.name, None)
        for i, v in enumerate(original.inputs):
            if v is not None:
                v.uses.append((original, i))
        for i, v in enumerate(original.outputs):
            if v is not None:
                v.producer, v.index = original, i
        original.meta["device"] = device
        original.meta["placement_reason"] = nodes[-1].meta.get("placement_reason", "chosen")
        graph.insert(at, original)
        restored += 1
    graph.meta[_GROUPS] = kept
    return restored
