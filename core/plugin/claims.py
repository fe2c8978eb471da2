"""What a device claims to run: ops x opset range x dtypes, as data.

A kernel-style backend claims what its kernel table registers, narrowed to the dtypes its
``DeviceModel`` computes. A graph-mode backend has no table; it states its claims by
overriding ``Backend.claims()``. The kit uses claims twice: to pick the ONNX node cases a
device must pass, and (strict mode) to call a fallback of a claimed op a failure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from anychip.ir.dtypes import ALL_TYPES, DType

__all__ = ["OpClaim", "claims_of", "claim_for"]


@dataclass(frozen=True)
class OpClaim:
    """One op a device claims: versions ``since..until`` (None: open), of ``dtypes``
    (None: any dtype the device computes) for its type-constrained input ``dtype_input``."""

    domain: str
    op: str
    since: int = 1
    until: int | None = None
    dtypes: frozenset[DType] | None = None
    dtype_input: int = 0

    def covers(self, domain: str, op: str, version: int, dtype: DType | None) -> bool:
        """Whether a node of ``domain::op`` at opset ``version`` with input dtype ``dtype``
        falls under this claim (an unknown dtype counts as covered)."""
        if (self.domain, self.op) != (_domain(domain), op):
            return False
        if version < self.since or (self.until is not None and version > self.until):
            return False
        return self.dtypes is None or dtype is None or dtype in self.dtypes


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
    out = []
    for k in table:
        dtypes = k.dtypes
        if device_dtypes != ALL_TYPES:
            dtypes = (dtypes or device_dtypes) & device_dtypes
        out.append(OpClaim(k.domain, k.op_type, k.since, k.until, dtypes, k.dtype_input))
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
    )


def claim_for(
    claims: list[OpClaim], domain: str, op: str, version: int, dtype: DType | None
) -> OpClaim | None:
    """The first claim covering the node, or None."""
    for c in claims:
        if c.covers(domain, op, version, dtype):
            return c
    return None
