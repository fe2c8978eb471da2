"""Declared intermediate and output shapes are hints, not facts: inference decides.

An exporter may declare a wrong shape in ``value_info`` or on a graph output (onnxruntime
warns and runs the model). onnx's non-strict shape inference keeps a declared shape over the
one it infers, so a wrong declaration of ``[100000, 100000, 64]`` made the memory planner
"need" terabytes at load. Shape inference therefore runs on a copy without the declared shapes
(``strip``); ``merge`` then puts back each declaration inference has nothing for (after an op
it cannot infer, say) and fills dimensions inference left unknown, but where both know a
dimension and they disagree, the inferred shape wins and one warning names the values.
Declared numbers are not taken for a value whose shape follows data fed at run time
(``_data_shaped``: an ONNX node inference left unshaped although it knew its inputs' shapes,
as a Reshape or ConstantOfShape whose shape is an input, or a Loop; and what is computed from
it): the exporter's one trace fixed them, onnxruntime runs with the actual sizes, and so does
anychip (the rank and the declared symbols are kept). Except where the rank is known otherwise:
a Reshape's output has as many axes as its shape input has elements, and a declaration of
another rank (onnxruntime's own ``reshape_fusion_with_graph_inputs.onnx`` declares
``[10,20,?]`` for a 2-D result) is dropped whole; so is one of GreedySearch's and Sampling's
``sequences``, ``[batch, max_length]`` in onnxruntime whatever the model declares (its
``tiny_gpt2_sampling.onnx`` declares BeamSearch's ``[batch, num_return_sequences, max_length]``).
"""

from __future__ import annotations

import onnx

__all__ = ["strip", "merge"]

Declared = dict[str, onnx.TypeProto]


def strip(graph: onnx.GraphProto) -> Declared:
    """Remove the declared tensor shapes of ``graph``'s value_info and outputs (a copy the
    caller owns); returns them by value name."""
    saved: Declared = {}
    for vi in (*graph.value_info, *graph.output):
        tp = vi.type
        if tp.WhichOneof("value") == "tensor_type" and tp.tensor_type.HasField("shape"):
            keep = onnx.TypeProto()
            keep.CopyFrom(tp)
            saved[vi.name] = keep
            tp.tensor_type.ClearField("shape")
    declared_only = [vi for vi in graph.value_info if vi.name in saved]
    for vi in declared_only:
        graph.value_info.remove(vi)
    return saved


def merge(graph: onnx.GraphProto, saved: Declared) -> str | None:
    """Put the declarations of ``saved`` back into the inferred ``graph``, in place; returns
    the warning naming the declarations ignored (None when none was), for the caller to
    issue."""
    inferred = {vi.name: vi for vi in (*graph.value_info, *graph.output)}
    guessed = _data_shaped(graph, inferred)
    ranks = _reshape_ranks(graph, inferred)
    conflicts: list[str] = []
    for name, declared in saved.items():
        if name in ranks and _rank(declared) not in (None, ranks[name]):
            conflicts.append(f"{name!r} declared of rank {_rank(declared)}, is {ranks[name]}")
            continue
        if name in guessed:
            declared = _symbols_only(declared)
        vi = inferred.get(name)
        if vi is None:
            graph.value_info.append(onnx.helper.make_value_info(name, declared))
            continue
        tt = vi.type.tensor_type
        if vi.type.WhichOneof("value") != "tensor_type" or not tt.HasField("shape"):
            vi.type.CopyFrom(declared)
            continue
        dims, want = tt.shape.dim, declared.tensor_type.shape.dim
        if len(dims) != len(want) or any(
            d.HasField("dim_value") and w.HasField("dim_value") and d.dim_value != w.dim_value
            for d, w in zip(dims, want)
        ):
            conflicts.append(f"{name!r} declared {_text(want)}, inferred {_text(dims)}")
            continue
        for d, w in zip(dims, want):
            if not d.HasField("dim_value") and (w.HasField("dim_value") or w.dim_param):
                d.CopyFrom(w)
    if not conflicts:
        return None
    return (
        "declared shapes that disagree with shape inference are ignored (onnxruntime "
        f"also runs with the actual shapes): {'; '.join(conflicts[:4])}"
        + (f"; and {len(conflicts) - 4} more" if len(conflicts) > 4 else "")
    )


_ONNX = ("", "ai.onnx", "ai.onnx.ml")


def _full(vi: onnx.ValueInfoProto | None) -> bool:
    if vi is None or vi.type.WhichOneof("value") != "tensor_type":
        return False
    tt = vi.type.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _data_shaped(graph: onnx.GraphProto, inferred: dict[str, onnx.ValueInfoProto]) -> set[str]:
    """Values whose shape follows data fed at run time: the outputs of an ONNX-domain node
    that inference, knowing every input's shape, left without a full shape (Reshape or
    ConstantOfShape from an input, Loop, NonZero...), and every value computed from one."""
    known = {vi.name for vi in graph.input if _full(vi)}
    known |= {t.name for t in graph.initializer}
    known |= {name for name, vi in inferred.items() if _full(vi)}
    tainted: set[str] = set()
    for node in graph.node:
        ins = [i for i in node.input if i]
        if any(i in tainted for i in ins):
            tainted.update(o for o in node.output if o)
        elif node.domain in _ONNX and all(i in known for i in ins):
            tainted.update(o for o in node.output if o and o not in known)
    return tainted


def _rank(declared: onnx.TypeProto) -> int | None:
    if declared.WhichOneof("value") != "tensor_type" or not declared.tensor_type.HasField("shape"):
        return None
    return len(declared.tensor_type.shape.dim)


def _reshape_ranks(graph: onnx.GraphProto, inferred: dict[str, onnx.ValueInfoProto]) -> dict:
    """The rank of each ONNX Reshape's output whose shape input has a known length."""
    lengths = {t.name: list(t.dims) for t in graph.initializer}
    for name, vi in inferred.items():
        if _full(vi):
            lengths[name] = [d.dim_value for d in vi.type.tensor_type.shape.dim]
    ranks = {}
    for node in graph.node:
        if node.op_type == "Reshape" and node.domain in _ONNX and len(node.input) > 1:
            dims = lengths.get(node.input[1])
            if dims is not None and len(dims) == 1:
                ranks[node.output[0]] = dims[0]
        elif node.op_type in _SEQUENCES_2D and node.domain == "com.microsoft" and node.output:
            ranks[node.output[0]] = 2
    return ranks


_SEQUENCES_2D = ("GreedySearch", "Sampling")  # com.microsoft ops whose output 0 is 2-D


def _symbols_only(declared: onnx.TypeProto) -> onnx.TypeProto:
    """``declared`` with its numbers dropped (its rank and symbols kept)."""
    out = onnx.TypeProto()
    out.CopyFrom(declared)
    if out.WhichOneof("value") == "tensor_type" and out.tensor_type.HasField("shape"):
        for d in out.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                d.Clear()
    return out


def _text(dims) -> str:
    return "[" + ",".join(str(d.dim_value) if d.HasField("dim_value") else "?" for d in dims) + "]"
