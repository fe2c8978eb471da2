"""``anychip inspect MODEL``: what a model is, before placing it.

Opsets, inputs and outputs with their shapes, the operator histogram, the parameters (count
and bytes of the initializers), a FLOPs estimate, and which registered device can run which op
(each backend's own capability answer, ``Backend.supports(node)``, which placement asks too;
no device hardware is needed, as for ``anychip devices --ops``).

FLOPs count a multiply-add as two: Conv ``2 * out elements * (C/group * kernel)``,
ConvTranspose ``2 * in elements * (M/group * kernel)``, MatMul ``2 * out elements * K``, Gemm
``2 * M * N * K``; element-wise ops count one per output element; other ops (data movement,
shape computation) count nothing. Nodes whose shapes are not known statically are listed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ModelSummary", "inspect_model", "node_flops"]

_ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Erf", "Exp", "Log", "Sqrt", "Pow",
    "LeakyRelu", "Clip", "HardSigmoid", "HardSwish", "Gelu", "Sum", "Max", "Min", "Neg",
    "Abs", "Softmax", "BatchNormalization", "LayerNormalization", "Where",
}  # fmt: skip


def _numel(shape: Any) -> int | None:
    if shape is None or any(not isinstance(d, int) or d < 0 for d in shape):
        return None
    return math.prod(shape)


def _shape(v: Any) -> tuple | None:
    return None if v is None or v.shape is None else tuple(v.shape)


def node_flops(node: Any) -> int | None:
    """The FLOPs of one node (module docstring), 0 for ops not counted, None when a shape
    it needs is unknown."""
    op = node.op_type
    out = _numel(_shape(node.outputs[0])) if node.outputs and node.outputs[0] else None
    if op in ("Conv", "ConvTranspose"):
        w = _shape(node.inputs[1])
        if w is None or _numel(w[1:]) is None:
            return None
        if op == "Conv":
            return None if out is None else 2 * out * math.prod(w[1:])
        x = _numel(_shape(node.inputs[0]))
        return None if x is None else 2 * x * math.prod(w[1:])
    if op == "MatMul":
        a = _shape(node.inputs[0])
        if out is None or not a or not isinstance(a[-1], int):
            return None
        return 2 * out * a[-1]
    if op == "Gemm":
        a = _shape(node.inputs[0])
        if out is None or a is None or len(a) != 2 or _numel(a) is None:
            return None
        k = a[0] if node.attr("transA", 0) else a[1]
        return 2 * out * k
    if op in _ELEMENTWISE:
        return out
    return 0


@dataclass
class ModelSummary:
    """What ``inspect_model`` found; ``to_dict()`` for JSON, ``str()`` for the terminal."""

    name: str
    producer: str
    ir_version: int
    opsets: dict[str, int]
    inputs: list[tuple[str, str, list]]
    outputs: list[tuple[str, str, list]]
    ops: dict[str, int]
    parameters: int
    parameter_bytes: int
    initializers: int
    flops: int
    flops_by_op: dict[str, int]
    unknown_flops: list[str] = field(default_factory=list)
    #: device -> op -> [nodes it can run, nodes of the op, first reason it cannot]
    devices: dict[str, dict[str, list]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "producer": self.producer,
            "ir_version": self.ir_version,
            "opsets": self.opsets,
            "inputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in self.inputs],
            "outputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in self.outputs],
            "ops": self.ops,
            "nodes": sum(self.ops.values()),
            "parameters": self.parameters,
            "parameter_bytes": self.parameter_bytes,
            "initializers": self.initializers,
            "flops": self.flops,
            "flops_by_op": self.flops_by_op,
            "unknown_flops": self.unknown_flops,
            "devices": {
                d: {op: {"can": c, "of": n, "reason": why} for op, (c, n, why) in ops.items()}
                for d, ops in self.devices.items()
            },
        }

    def __str__(self) -> str:
        from anychip.viz.inspect_text import summary_text

        return summary_text(self)

    def __rich__(self) -> Any:
        from anychip.viz.inspect_text import summary_rich

        return summary_rich(self)


def _io(values: list[Any]) -> list[tuple[str, str, list]]:
    out = []
    for v in values:
        dtype = v.dtype.short if v.dtype else "?"
        out.append((v.name, dtype, [] if v.shape is None else list(v.shape)))
    return out


def inspect_model(
    model: Any, devices: list[str] | None = None, free_dims: dict[str, int] | None = None
) -> ModelSummary:
    """Summarise ``model`` (a path, bytes, ``onnx.ModelProto`` or ``ir.Model``) and what each
    of ``devices`` (default: every backend a session with no device list uses; the others
    when named) can run of it; ``free_dims`` sizes
    symbolic input dimensions by name (so their nodes' FLOPs are counted)."""
    from anychip.core.compile.pipeline import resolve_schemas
    from anychip.core.plugin.host import get_registry
    from anychip.errors import DeviceError
    from anychip.ir.graph import Model
    from anychip.ir.onnx import import_model

    registry = get_registry(devices or None)  # the plugins of ``devices``, else every one
    if not isinstance(model, Model):
        model = import_model(model, custom_schemas=registry.schemas, free_dims=free_dims)
    resolve_schemas(model, registry.schemas)
    g = model.graph
    inits = [v for v in g.initializers.values() if v.const is not None]
    flops_by: Counter[str] = Counter()
    unknown = []
    for n in g.nodes:
        f = node_flops(n)
        if f is None:
            unknown.append(n.name or n.op_type)
        elif f:
            flops_by[n.op_type] += f
    # by default the devices a session with no device list would use: a device that joins
    # only when named (a vendor runtime, IREE) may compile to answer (IREE probes each node)
    names = devices or [n for n, b in registry.backends.items() if getattr(b, "auto_select", True)]
    if missing := [d for d in names if d not in registry.backends]:
        raise DeviceError(f"no device {missing} is registered (have: {sorted(registry.backends)})")
    can: dict[str, dict[str, list]] = {}
    for d in names:
        backend = registry.backends[d]
        table = can[d] = {}
        for n in g.nodes:
            row = table.setdefault(n.op_type, [0, 0, ""])
            why = backend.supports(n)
            row[1] += 1
            if why is None:
                row[0] += 1
            elif not row[2]:
                row[2] = why
    ops = Counter(n.op_type for n in g.nodes)
    return ModelSummary(
        name=model.path or g.name or "model",
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        ir_version=model.ir_version,
        opsets={(k or "ai.onnx"): v for k, v in model.opset_imports.items()},
        inputs=_io([v for v in g.inputs if v.const is None]),
        outputs=_io(g.outputs),
        ops=dict(ops.most_common()),
        parameters=sum(int(v.const.size) for v in inits),
        parameter_bytes=sum(int(v.nbytes or 0) for v in inits),
        initializers=len(inits),
        flops=sum(flops_by.values()),
        flops_by_op=dict(flops_by.most_common()),
        unknown_flops=unknown,
        devices=can,
    )
