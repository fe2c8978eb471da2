"""What a device claims to run: ops x opset range x dtypes, as data.

A kernel-style backend claims what its kernel table registers, narrowed to the dtypes its
``DeviceModel`` computes. A graph-mode backend has no table; it states its claims by
overriding ``Backend.claims()``. The kit uses claims twice: to pick the ONNX node cases a
device must pass, and (strict mode) to call a fallback of a claimed op a failure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from anychip.ir.dtypes import ALL_TYPES, DType

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = [
    "Constraint",
    "OpClaim",
    "claims_of",
    "claim_for",
    "declared_refusal",
    "first_refusal",
]


@dataclass(frozen=True)
class Constraint:
    """A condition a claimed op must meet on this device, declared as data: ``holds(node)``
    is True where the device runs the node; ``reason`` says what it needs ("Softmax on the
    last axis only"). Placement names the reason, ``anychip devices --ops`` lists it, and the
    conformance kit counts a case refused by it as refused-as-declared, not as a failure."""

    reason: str
    holds: Callable[[Node], bool] = field(compare=False)
    #: Optional: the particular reason a node fails it ("IREE 3.13 vulkan-spirv: Sigmoid-13
    #: f32[?,9] mismatches the CPU by 3.4"), appended to ``reason`` in the refusal.
    explain: Callable[[Node], str | None] | None = field(default=None, compare=False)

    @staticmethod
    def attribute(name: str, allowed: Callable[[Any, Node], bool], reason: str) -> Constraint:
        """A constraint on one attribute's value, ``allowed(value, node)`` (``value`` is None
        where the node does not set the attribute)."""
        return Constraint(reason, lambda node: bool(allowed(node.attr(name), node)))

    @staticmethod
    def last_axis(name: str = "axis", default: int = -1) -> Constraint:
        """``axis`` (or ``name``) is the last axis of the first input: -1 or rank - 1."""

        def holds(node: Node) -> bool:
            axis = node.attr(name, default)
            x = node.inputs[0] if node.inputs else None
            rank = len(x.shape) if x is not None and x.shape is not None else None
            return axis == -1 or (rank is not None and axis == rank - 1)

        return Constraint(f"{name} on the last axis only", holds)


@dataclass(frozen=True)
class OpClaim:
    """One op a device claims: versions ``since..until`` (None: open), of ``dtypes``
    (None: any dtype the device computes) for its type-constrained input ``dtype_input``,
    under its declared ``constraints`` (all must hold)."""

    domain: str
    op: str
    since: int = 1
    until: int | None = None
    dtypes: frozenset[DType] | None = None
    dtype_input: int = 0
    constraints: tuple[Constraint, ...] = ()

    def refusal(self, node: Node) -> str | None:
        """The first declared constraint ``node`` does not meet, as a reason, or None."""
        return first_refusal(self.constraints, node)

    def covers(self, domain: str, op: str, version: int, dtype: DType | None) -> bool:
        """Whether a node of ``domain::op`` at opset ``version`` with input dtype ``dtype``
        falls under this claim (an unknown dtype counts as covered)."""
        if (self.domain, self.op) != (_domain(domain), op):
            return False
        if version < self.since or (self.until is not None and version > self.until):
            return False
        return self.dtypes is None or dtype is None or dtype in self.dtypes


#: How every refusal by a declared constraint starts (placement reasons, the kit's details).
DECLARED = "declared constraint"


def first_refusal(constraints: tuple[Constraint, ...], node: Node) -> str | None:
    """The first of ``constraints`` that ``node`` does not meet, as a placement reason
    (``declared constraint: ...``), or None when all hold."""
    for c in constraints:
        try:
            ok = c.holds(node)
        except Exception as e:  # a constraint that cannot decide refuses, saying why
            return f"{DECLARED} {c.reason!r} could not be checked: {e}"
        if not ok:
            detail = c.explain(node) if c.explain is not None else None
            return f"{DECLARED}: {c.reason}" + (f": {detail}" if detail else "")
    return None


def _domain(domain: str) -> str:
    return "" if domain == "ai.onnx" else domain


def claims_of(backend: Any) -> list[OpClaim]:
    """The backend's claims: ``backend.claims()`` where it states them, else its kernel table
    narrowed to the dtypes of its device model."""
    stated = backend.claims()
    if stated is not None:
        return [_as_claim(c) for c in stated]
    table = backend.kernels
    if table is None:
        return []
    device_dtypes = backend.device.dtypes
    sinces: dict[tuple[str, str], set[int]] = {}
    for k in table:
        sinces.setdefault((k.domain, k.op_type), set()).add(k.since)
    out = []
    for k in table:
        dtypes = k.dtypes
        if device_dtypes != ALL_TYPES:
            dtypes = (dtypes or device_dtypes) & device_dtypes
        until = k.until
        if until is None:  # a kernel serves up to the op's next registration (onnxruntime's rule)
            later = [s for s in sinces[(k.domain, k.op_type)] if s > k.since]
            until = min(later) - 1 if later else None
        out.append(
            OpClaim(k.domain, k.op_type, k.since, until, dtypes, k.dtype_input, k.constraints)
        )
    return out


def _as_claim(c: Any) -> OpClaim:
    """Claims stated by a backend may be ``OpClaim`` or any object with the same fields."""
    if isinstance(c, OpClaim):
        return c
    dtypes = getattr(c, "dtypes", None)
    return OpClaim(
        getattr(c, "domain", ""),
        getattr(c, "op", None) or c.op_type,
        getattr(c, "since", 1),
        getattr(c, "until", None),
        frozenset(dtypes) if dtypes is not None else None,
        getattr(c, "dtype_input", 0),
        tuple(getattr(c, "constraints", ())),
    )


def claim_for(
    claims: list[OpClaim], domain: str, op: str, version: int, dtype: DType | None
) -> OpClaim | None:
    """The first claim covering the node, or None."""
    for c in claims:
        if c.covers(domain, op, version, dtype):
            return c
    return None


def declared_refusal(claims: list[OpClaim], node: Node) -> str | None:
    """Why ``node`` is refused by a declared constraint of the claim covering it, or None
    (no claim covers it, or every constraint holds)."""
    x = next((v for v in node.inputs if v is not None and v.dtype is not None), None)
    dtype = x.dtype if x is not None else None
    claim = claim_for(claims, node.domain, node.op_type, int(node.version or 1), dtype)
    return None if claim is None else claim.refusal(node)
