"""The cases the kit runs: onnx's node cases, and forms of them that reach what a device
claims but onnx's cases miss.

A ``KitCase`` is one onnx case (``cases.NodeCase``) in one form:

* **constant inputs**: an input of a dtype the device does not compute (Reshape's, Expand's
  and Slice's int64 shapes, Gather's indices) is fed as a constant (an initializer holding the
  data set's value), as a real model holds it: the device reads constants at compile time, so
  the op runs on the device instead of the case being dropped;
* **single-output forms**: a node whose trailing outputs are optional (LayerNormalization's
  Mean and InvStdDev, BatchNormalization's running statistics, Dropout's mask, MaxPool's
  Indices) also runs with its first output only, the form real models use, which takes other
  code paths (and other leaks) in a kernel;
* **float16 / bfloat16**: each float32 case, where the device claims the op in that dtype,
  converted (inputs, outputs, initializers and constants) and checked against the float32
  answer of the same rounded inputs, rounded: the exact answer in that dtype, within the
  tolerances of ``TOLERANCES`` (a few units in the last place).

``build(kit_case)`` gives the models and data sets to run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from anychip.conformance.cases import NodeCase, load_case
from anychip.ir.dtypes import DType

__all__ = ["KitCase", "TOLERANCES", "VARIANT_DTYPES", "forms", "build", "convert_model"]

#: (rtol, atol) of the derived low-precision cases: four units in the last place at 1.0
#: (float16 has 10 mantissa bits, bfloat16 7), against an answer that is exact but for the
#: final rounding; the case's own tolerances apply where they are looser.
TOLERANCES = {DType.FLOAT16: (2.0**-8, 2.0**-8), DType.BFLOAT16: (2.0**-5, 2.0**-5)}
VARIANT_DTYPES = tuple(TOLERANCES)
#: Attributes that name an element type: a node carrying one is not converted.
_TYPE_ATTRIBUTES = {"to", "dtype", "output_dtype", "stash_type_not_float"}


@dataclasses.dataclass(eq=False)
class KitCase:
    """One onnx case in one form (see the module docstring). ``constants`` are the graph
    inputs fed as initializers, with their dtypes; ``dtype`` the float16/bfloat16 a float32
    case is converted to; ``first_output`` keeps the tested node's first output only."""

    case: NodeCase
    ops: tuple[str, ...]
    constants: tuple[tuple[str, DType], ...] = ()
    dtype: DType | None = None
    first_output: bool = False

    @property
    def name(self) -> str:
        """The onnx case's name, with the form: ``test_gelu_default_2[f16]``."""
        name = self.case.name
        if self.first_output:
            name += "[1 output]"
        if self.dtype is not None:
            name += f"[{self.dtype.short}]"
        return name

    @property
    def tolerances(self) -> tuple[float, float]:
        """(rtol, atol): the case's, widened for a low-precision form."""
        rtol, atol = self.case.rtol, self.case.atol
        if self.dtype is not None:
            drtol, datol = TOLERANCES[self.dtype]
            rtol, atol = max(rtol, drtol), max(atol, datol)
        return rtol, atol

    def note(self, device: str) -> str:
        """What the kit changed to run this form, for the report."""
        parts = []
        if self.constants:
            names = ", ".join(f"{n!r} ({d.short})" for n, d in self.constants)
            kinds = ", ".join(sorted({d.short for _, d in self.constants}))
            parts.append(f"input(s) {names} fed as constants: {device} computes no {kinds}")
        if self.first_output:
            parts.append("the node's first output only (its optional outputs omitted)")
        if self.dtype is not None:
            rtol, atol = self.tolerances
            parts.append(
                f"the float32 case in {self.dtype.short} (expected: the float32 result of the "
                f"rounded inputs, rounded; rtol={rtol:.3g}, atol={atol:.3g})"
            )
        return "; ".join(parts)

    def __repr__(self) -> str:
        return self.name


def forms(
    case: NodeCase,
    model: onnx.ModelProto,
    op: str,
    claimed: Any,
) -> Iterator[KitCase]:
    """Every form of ``case`` the device claims. ``claimed(model) -> constants or None`` says
    whether a model (a form of the case) has a node of ``op`` the device claims, and which
    graph inputs it must then be fed as constants."""
    shapes = [(model, False)]
    single = first_output_only(model, op)
    if single is not None:
        shapes.append((single, True))
    for m, first in shapes:
        constants = claimed(m)
        if constants is not None:
            yield KitCase(case, (op,), constants, None, first)
        if not _tested_dtype_is_float(m, op):
            continue
        for dtype in VARIANT_DTYPES:
            converted = convert_model(m, dtype)
            if converted is None:
                continue
            constants = claimed(converted)
            if constants is not None:
                yield KitCase(case, (op,), constants, dtype, first)


def _tested_dtype_is_float(model: onnx.ModelProto, op: str) -> bool:
    """Whether the first input of every node of ``op`` is a float32 tensor."""
    types = _elem_types(model)
    nodes = [n for n in model.graph.node if n.op_type == op]
    return bool(nodes) and all(
        n.input and types.get(n.input[0]) == onnx.TensorProto.FLOAT for n in nodes
    )


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    g = model.graph
    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    return types


def first_output_only(model: onnx.ModelProto, op: str) -> onnx.ModelProto | None:
    """``model`` with each node of ``op`` keeping its first output only, or None where no
    such node has more than one, an omitted output is not optional in the schema, another
    node reads it, or onnx's checker (full type and shape inference) refuses the result."""
    g = model.graph
    nodes = [n for n in g.node if n.op_type == op]
    if not nodes or not all(len([o for o in n.output if o]) > 1 for n in nodes):
        return None
    dropped: set[str] = set()
    versions = {o.domain or "": o.version for o in model.opset_import}
    for n in nodes:
        try:
            schema = onnx.defs.get_schema(n.op_type, versions.get(n.domain or "", 1), n.domain)
        except Exception:
            return None
        for i, name in enumerate(n.output[1:], 1):
            if not name:
                continue
            param = schema.outputs[min(i, len(schema.outputs) - 1)]
            if param.option != onnx.defs.OpSchema.FormalParameterOption.Optional:
                return None
            dropped.add(name)
    if any(i in dropped for n in g.node for i in n.input):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for n in out.graph.node:
        if n.op_type == op:
            del n.output[1:]
    kept = [o for o in out.graph.output if o.name not in dropped]
    del out.graph.output[:]
    out.graph.output.extend(kept)
    infos = [v for v in out.graph.value_info if v.name not in dropped]
    del out.graph.value_info[:]
    out.graph.value_info.extend(infos)
    try:  # onnx's own rules: BatchNormalization in training mode needs all three outputs
        onnx.checker.check_model(out, full_check=True)
    except Exception:
        return None
    return out


def convert_model(model: onnx.ModelProto, dtype: DType) -> onnx.ModelProto | None:
    """``model`` with every float32 tensor (inputs, outputs, value infos, initializers,
    constant attributes) in ``dtype``; None where that is not a faithful conversion: a node
    naming an element type (Cast, EyeLike...), nested graphs, or a node whose schema does not
    take ``dtype`` (onnx's checker with full type inference says so)."""
    f32, to = onnx.TensorProto.FLOAT, int(dtype.value)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type == f32:
            vi.type.tensor_type.elem_type = to
    for i, t in enumerate(g.initializer):
        if t.data_type == f32:
            g.initializer[i].CopyFrom(_tensor_in(t, dtype))
    for n in g.node:
        for a in n.attribute:
            if a.name in _TYPE_ATTRIBUTES or a.type in (
                onnx.AttributeProto.GRAPH,
                onnx.AttributeProto.GRAPHS,
            ):
                return None
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f32:
                a.t.CopyFrom(_tensor_in(a.t, dtype))
    try:
        onnx.checker.check_model(out, full_check=True)
    except Exception:
        return None
    return out


def _tensor_in(t: onnx.TensorProto, dtype: DType) -> onnx.TensorProto:
    return numpy_helper.from_array(numpy_helper.to_array(t).astype(dtype.numpy), t.name)


Sets = list[tuple[list[Any], list[Any]]]


def build(kc: KitCase) -> list[tuple[onnx.ModelProto, Sets]]:
    """The models to load and the (inputs, expected outputs) data sets to run on each: one
    model for every data set when inputs are fed as constants (their values differ per set),
    else one model for all of them."""
    model, sets = load_case(kc.case)
    op = kc.ops[0]
    if kc.first_output:
        trimmed = first_output_only(model, op)
        assert trimmed is not None, f"{kc.case.name} has no single-output form"
        keep = [i for i, o in enumerate(model.graph.output) if o.name in _names(trimmed)]
        model, sets = trimmed, [(ins, [outs[i] for i in keep]) for ins, outs in sets]
    if kc.dtype is not None:
        converted = convert_model(model, kc.dtype)
        assert converted is not None, f"{kc.case.name} has no {kc.dtype.short} form"
        sets = [_rounded(model, ins, kc.dtype) for ins, _ in sets]
        model = converted
    if not kc.constants:
        return [(model, sets)]
    return [_frozen(model, ins, outs, [n for n, _ in kc.constants]) for ins, outs in sets]


def _names(model: onnx.ModelProto) -> set[str]:
    return {o.name for o in model.graph.output}


def _rounded(model: onnx.ModelProto, ins: list[Any], dtype: DType) -> tuple[list, list]:
    """Inputs rounded to ``dtype`` and the float32 model's answer on them (the CPU, which
    passes the float32 case), rounded to ``dtype``."""
    import anychip

    low = [_cast(x, np.float32, dtype.numpy) for x in ins]
    sess = anychip.load(model, ["cpu"], cost_model=False, optimize=False, calibration="off")
    names = [i.name for i in sess.inputs]
    want = sess.run(None, dict(zip(names, [_cast(x, dtype.numpy, np.float32) for x in low])))
    sess.close()
    return low, [_cast(y, np.float32, dtype.numpy) for y in want]


def _cast(x: Any, src: Any, dst: Any) -> Any:
    if isinstance(x, (np.ndarray, np.generic)) and x.dtype == np.dtype(src):
        return np.asarray(x).astype(dst)
    return x


def _frozen(
    model: onnx.ModelProto, ins: list[Any], outs: list[Any], names: list[str]
) -> tuple[onnx.ModelProto, Sets]:
    """``model`` with the graph inputs ``names`` turned into initializers of this data set's
    values; the data set without them."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    inputs = list(g.input)
    feeds = []
    del g.input[:]
    for vi, x in zip(inputs, ins):
        if vi.name in names:
            g.initializer.append(numpy_helper.from_array(np.asarray(x), vi.name))
        else:
            g.input.append(vi)
            feeds.append(x)
    return out, [(feeds, outs)]
