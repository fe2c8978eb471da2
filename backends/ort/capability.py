"""What an ``ort:`` device claims: per node, from onnxruntime's own registries.

onnxruntime lists its kernels (``get_all_opkernel_def``: provider, op, domain, the schema
versions a kernel serves, the types each type constraint allows) and its operator schemas
(``get_all_operator_schema``). For a provider with kernels there (the CPU; CUDA and DirectML
in their builds) a node is claimed when one kernel serves the node's schema version (resolved
from the node's opset by onnxruntime's schemas) and allows the type of every input and output
bound to a constrained type. Providers that compile graphs (TensorRT, OpenVINO, QNN, CoreML...)
list no kernels: they claim every op onnxruntime has a schema for, and the partition's
compile decides (``session.py``: a partition the provider cannot take whole is refused).

Whatever the provider, a node must be something a standalone exported partition expresses
faithfully: an ONNX or ``com.microsoft`` op onnxruntime knows at an opset it supports, no nested
graphs (If/Loop/Scan bodies read values of the enclosing graph, which may live in other
partitions), tensors of known element type only.

Claims (``Backend.claims()``, the conformance kit) are the same facts as data: one ``OpClaim``
per op and kernel version range, whose two declared constraints are the type combinations the
kernels register and "tensors only", so a claimed op refused for its types is refused as
declared, with the reason.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from anychip.backends.ort import deviations
from anychip.backends.ort.deviations import not_tensor_op
from anychip.core.plugin.claims import Constraint, OpClaim
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["Registry", "registry", "check_node", "claims"]

_MAX = 2**31 - 1
#: anychip's spelling of a domain -> onnxruntime's
_DOMAINS = {"": "", "ai.onnx": "", "ai.onnx.ml": "ai.onnx.ml", "com.microsoft": "com.microsoft"}
_GRAPH_OPS = {"If", "Loop", "Scan"}


class _Kernel:
    """One registered kernel: the schema versions it serves and its allowed types.

    onnxruntime's rule (``VerifyVersion``): a kernel registered open-ended (``last`` is
    INT_MAX) serves its ``first`` schema version only; a versioned one, ``first..last``. A
    schema version newer than every kernel has no kernel.
    """

    __slots__ = ("first", "last", "types")

    def __init__(self, first: int, last: int, types: dict[str, frozenset[str]]) -> None:
        self.first, self.last, self.types = first, last, types

    @property
    def newest(self) -> int:
        """The newest schema version it serves."""
        return self.first if self.last == _MAX else self.last

    def serves(self, since: int) -> bool:
        return self.first <= since <= self.newest


class Registry:
    """onnxruntime's schemas and one provider's kernels, read once per process and provider.

    Attributes:
        ep: the provider's onnxruntime name.
        schemas: (domain, op) -> schema objects sorted by ``since_version``.
        kernels: (domain, op) -> the provider's ``_Kernel``s (empty: a compiling provider).
        max_opset: domain -> the newest opset onnxruntime has a schema of.
    """

    def __init__(self, ep: str) -> None:
        from onnxruntime.capi import onnxruntime_pybind11_state as C

        self.ep = ep
        schemas: dict[tuple[str, str], list[Any]] = defaultdict(list)
        self.max_opset: dict[str, int] = defaultdict(int)
        for s in C.get_all_operator_schema():
            if s.domain in _DOMAINS.values() and not s.deprecated:
                schemas[(s.domain, s.name)].append(s)
                self.max_opset[s.domain] = max(self.max_opset[s.domain], s.since_version)
        self.schemas = {k: sorted(v, key=lambda s: s.since_version) for k, v in schemas.items()}
        kernels: dict[tuple[str, str], list[_Kernel]] = defaultdict(list)
        for k in C.get_all_opkernel_def():
            if k.provider == ep and k.domain in _DOMAINS.values():
                types = {name: frozenset(t) for name, t in k.type_constraints.items()}
                kernels[(k.domain, k.op_name)].append(_Kernel(*k.version_range, types))
        self.kernels = dict(kernels)

    def schema(self, domain: str, op: str, opset: int) -> Any | None:
        """The schema in force at ``opset`` (the newest whose since_version <= opset)."""
        found = None
        for s in self.schemas.get((domain, op), ()):
            if s.since_version > opset:
                break
            found = s
        return found


@functools.cache
def registry(ep: str) -> Registry:
    """The ``Registry`` of provider ``ep`` (built on first use; onnxruntime imported then)."""
    return Registry(ep)


def _type_string(dtype: DType) -> str:
    return f"tensor({dtype.name.lower()})"


def _bindings(node: Node, schema: Any) -> list[tuple[str, str]]:
    """(type constraint or literal type, value type) for every present input and output."""
    out = []
    for values, formals in ((node.inputs, schema.inputs), (node.outputs, schema.outputs)):
        for i, v in enumerate(values):
            if v is not None and v.dtype and formals:
                out.append((formals[min(i, len(formals) - 1)].typeStr, _type_string(v.dtype)))
    return out


def _types_hold(kernels: list[_Kernel], since: int, node: Node, schema: Any) -> bool:
    """Whether one kernel serving schema version ``since`` takes the node's types."""
    bindings = _bindings(node, schema)
    for k in kernels:
        if k.serves(since) and all(t not in k.types or got in k.types[t] for t, got in bindings):
            return True
    return False


def _tensors_only(node: Node) -> bool:
    """Inputs are tensors of known element type (a standalone model's inputs declare it),
    outputs are tensors (onnxruntime infers a type anychip left unknown)."""
    inputs = all(v.is_tensor and v.dtype for v in node.inputs if v is not None)
    return inputs and all(v.is_tensor for v in node.outputs if v is not None)


def check_node(ep: str, node: Node) -> str | None:
    """None when provider ``ep`` may take ``node`` in an exported partition, else why."""
    domain = _DOMAINS.get(node.domain)
    if domain is None:
        return f"domain {node.domain!r} is not one onnxruntime runs"
    if node.op_type in _GRAPH_OPS or any(
        a.type.name in ("GRAPH", "GRAPHS") for a in node.attributes.values()
    ):
        return f"{node.op_type} has nested graphs (left to devices that run them in place)"
    if not _tensors_only(node) or not_tensor_op(node.op_type):
        return "an input is not a tensor of known element type, or an output not a tensor"
    if ep == deviations.CPU and (why := deviations.UNCLAIMED.get((domain, node.op_type))):
        return why
    for c in deviations.constraints(ep, domain, node.op_type):
        if not c.holds(node):
            return f"declared constraint: {c.reason}"
    reg = registry(ep)
    opset = int(node.version or 1)
    newest = reg.max_opset.get(domain, 0)
    if opset > newest:
        return f"onnxruntime {_version()} knows {domain or 'ai.onnx'} up to opset {newest}"
    schema = reg.schema(domain, node.op_type, opset)
    if schema is None:
        return f"onnxruntime {_version()} has no schema of {node.op_type} at opset {opset}"
    if not reg.kernels:
        return None  # a compiling provider: the partition's compile decides
    kernels = reg.kernels.get((domain, node.op_type), [])
    since = schema.since_version
    if not any(k.serves(since) for k in kernels):
        return f"onnxruntime's {_short(ep)} has no {node.op_type}-{since} kernel"
    if not _types_hold(kernels, since, node, schema):
        types = ", ".join(sorted({got for _, got in _bindings(node, schema)}))
        return f"onnxruntime's {_short(ep)} {node.op_type}-{since} kernels do not take {types}"
    return None


def claims(ep: str) -> list[OpClaim]:
    """Provider ``ep``'s claims as data: op x opset range x dtypes of the first constrained
    input, with the type combinations and "tensors only" as declared constraints."""
    return list(_claims(ep))


@functools.cache
def _claims(ep: str) -> tuple[OpClaim, ...]:
    reg = registry(ep)
    out = []
    for (domain, op), schemas in sorted(reg.schemas.items()):
        if op in _GRAPH_OPS or any(_graph_attr(a) for a in schemas[-1].attributes.values()):
            continue
        if not_tensor_op(op) or (ep == deviations.CPU and (domain, op) in deviations.UNCLAIMED):
            continue
        kernels = reg.kernels.get((domain, op), [])
        if reg.kernels and not kernels:
            continue
        ranges = sorted({(k.first, k.newest) for k in kernels})
        if not ranges:  # a compiling provider: every schema version
            ranges = [(schemas[0].since_version, schemas[-1].since_version)]
        for first, newest in ranges:
            claim = _claim(reg, domain, op, schemas, first, newest, kernels)
            if claim is not None:
                out.append(claim)
    return tuple(out)


def _claim(
    reg: Registry,
    domain: str,
    op: str,
    schemas: list[Any],
    first: int,
    newest: int,
    kernels: list[_Kernel],
) -> OpClaim | None:
    """The claim of the kernels serving schema versions ``first..newest``, as opsets: up to
    the opset before the next schema version (the newest opset onnxruntime knows if none)."""
    later = [s.since_version for s in schemas if s.since_version > newest]
    until = min(later) - 1 if later else reg.max_opset[domain]
    if until < first:
        return None
    schema = reg.schema(domain, op, first) or schemas[0]
    served = [k for k in kernels if (k.first, k.newest) == (first, newest)]
    dtypes, index = None, 0
    for i, formal in enumerate(schema.inputs):
        allowed = [k.types[formal.typeStr] for k in served if formal.typeStr in k.types]
        if allowed:
            dtypes = frozenset(d for t in frozenset().union(*allowed) if (d := _dtype(t)))
            index = i
            break
    constraints: tuple[Constraint, ...] = (
        Constraint("tensors only, inputs of known element type", _tensors_only),
    )
    if served:
        reason = f"the type combinations onnxruntime's {_short(reg.ep)} kernels register"
        constraints += (Constraint(reason, functools.partial(_holds_types, reg, domain)),)
    constraints += deviations.constraints(reg.ep, domain, op)
    return OpClaim(domain, op, first, until, dtypes, index, constraints)


def _holds_types(reg: Registry, domain: str, node: Node) -> bool:
    schema = reg.schema(domain, node.op_type, int(node.version or 1))
    if schema is None:
        return False
    kernels = reg.kernels.get((domain, node.op_type), [])
    return _types_hold(kernels, schema.since_version, node, schema)


def _graph_attr(attribute: Any) -> bool:
    return "GRAPH" in str(attribute.type).upper()


def _dtype(type_string: str) -> DType | None:
    """``tensor(float)`` -> ``DType.FLOAT``; None for sequences, maps and unknown types."""
    if not type_string.startswith("tensor(") or not type_string.endswith(")"):
        return None
    return DType.__members__.get(type_string[len("tensor(") : -1].upper())


def _short(ep: str) -> str:
    return ep.removesuffix("ExecutionProvider") + " provider"


@functools.cache
def _version() -> str:
    import onnxruntime

    return onnxruntime.__version__
