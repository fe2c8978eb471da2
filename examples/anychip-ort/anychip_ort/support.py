"""What the ``ort`` device claims: nodes onnxruntime's CPU provider has a kernel for.

onnxruntime lists its kernels (op, domain, version range, allowed types per type constraint);
a node is claimed when one kernel's range holds the node's schema version and every input and
output type is allowed by the constraint the ONNX schema binds it to. Besides, the node must be
something the exporter writes faithfully as a standalone model: no nested graphs (their captured
outer values may live in other partitions), and tensors only (inputs of known element type: a
standalone model's inputs must declare it).
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import TYPE_CHECKING

import onnx

if TYPE_CHECKING:
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = ["check_node", "cpu_kernels", "PROVIDER"]

PROVIDER = "CPUExecutionProvider"
_DOMAINS = {"": "", "ai.onnx": "", "ai.onnx.ml": "ai.onnx.ml"}

#: (domain, op) -> [(first version, last version, {type constraint: allowed type strings})]
KernelDefs = dict[tuple[str, str], list[tuple[int, int, dict[str, set[str]]]]]


@functools.cache
def cpu_kernels() -> KernelDefs:
    """onnxruntime's CPU kernels, read once from the installed onnxruntime."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    table: KernelDefs = defaultdict(list)
    for k in ort_c.get_all_opkernel_def():
        if k.provider == PROVIDER and k.domain in _DOMAINS:
            constraints = {name: set(types) for name, types in k.type_constraints.items()}
            first, last = k.version_range
            table[(k.domain, k.op_name)].append((first, last, constraints))
    return dict(table)


def _type_string(v: Value) -> str:
    """The ONNX type string of a tensor value: ``tensor(float)``, ``tensor(int64)``..."""
    return f"tensor({onnx.TensorProto.DataType.Name(int(v.dtype)).lower()})"


def _bindings(node: Node, schema: onnx.defs.OpSchema) -> list[tuple[str, str]]:
    """(type constraint or literal type, value type) for every input and output present."""
    out = []
    for values, formals in ((node.inputs, schema.inputs), (node.outputs, schema.outputs)):
        for i, v in enumerate(values):
            if v is not None and v.dtype and formals:
                out.append((formals[min(i, len(formals) - 1)].type_str, _type_string(v)))
    return out


def check_node(node: Node) -> str | None:
    """None when onnxruntime's CPU provider runs ``node`` in an exported partition, else why."""
    domain = _DOMAINS.get(node.domain)
    if domain is None:
        return f"domain {node.domain!r} is not an ONNX domain onnxruntime's CPU provider runs"
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for a in node.attributes.values()
    ):
        return f"{node.op_type} has nested graphs (left to devices that run them in place)"
    for v in node.inputs:
        if v is not None and not (v.is_tensor and v.dtype):
            return f"input {v.name!r} is not a tensor of known element type"
    for v in node.outputs:
        if v is not None and not v.is_tensor:
            return f"output {v.name!r} is not a tensor"
    version = int(node.meta.get("since", node.version or 1))
    defs = [d for d in cpu_kernels().get((domain, node.op_type), []) if d[0] <= version <= d[1]]
    if not defs:
        return f"onnxruntime has no CPU kernel for {node.op_type}-{version}"
    schema = onnx.defs.get_schema(node.op_type, version, domain)
    bindings = _bindings(node, schema)
    for _, _, constraints in defs:
        if all(t not in constraints or got in constraints[t] for t, got in bindings):
            return None
    types = ", ".join(sorted({got for _, got in bindings}))
    return f"onnxruntime's CPU {node.op_type}-{version} kernels do not take {types}"
