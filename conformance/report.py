"""The kit's results: one ``CaseResult`` per node case, one ``ContractResult`` per contract
check, and ``KitReport`` with counts, a table by op, the verdict and JSON for CI."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = [
    "PASS_ON_DEVICE",
    "PASS_VIA_FALLBACK",
    "REFUSED_AS_DECLARED",
    "FAIL",
    "CRASH",
    "SKIP",
    "STATUSES",
    "CaseResult",
    "ContractResult",
    "KitReport",
]

PASS_ON_DEVICE = "PASS-ON-DEVICE"
PASS_VIA_FALLBACK = "PASS-VIA-FALLBACK"
#: Right outputs, and every claimed node that ran elsewhere was refused by a constraint the
#: device declared on its claim (``core/plugin/claims.Constraint``): not a failure, even strict.
REFUSED_AS_DECLARED = "REFUSED-AS-DECLARED"
FAIL = "FAIL"
CRASH = "CRASH"
SKIP = "SKIP"
STATUSES = (PASS_ON_DEVICE, REFUSED_AS_DECLARED, PASS_VIA_FALLBACK, FAIL, CRASH, SKIP)


@dataclass
class CaseResult:
    """One ONNX node case: its label, largest error, and what explains the label."""

    case: str
    op: str
    status: str
    max_error: float = 0.0
    detail: str = ""
    nodes_on_device: int = 0
    nodes: int = 0
    seconds: float = 0.0

    def failed(self, strict: bool) -> bool:
        """Whether this result fails the kit (a fallback fails only in strict mode)."""
        return self.status in (FAIL, CRASH) or (strict and self.status == PASS_VIA_FALLBACK)


@dataclass
class ContractResult:
    """One contract check of the backend's hooks (copies, memory, capabilities)."""

    name: str
    ok: bool
    detail: str = ""


@dataclass
class KitReport:
    """Everything one ``run_kit`` found. ``ok`` is the verdict; ``str()`` the summary."""

    device: str
    strict: bool = False
    claims: list[Any] = field(default_factory=list)
    results: list[CaseResult] = field(default_factory=list)
    contract: list[ContractResult] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        """Cases per label, every label present."""
        c = Counter(r.status for r in self.results)
        return {s: c.get(s, 0) for s in STATUSES}

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if r.failed(self.strict)]

    @property
    def ok(self) -> bool:
        """No FAIL or CRASH, every contract check passed, no fallback in strict mode, and at
        least one case ran (a device that claims nothing passes nothing)."""
        ran = any(r.status != SKIP for r in self.results)
        return ran and not self.failures and all(c.ok for c in self.contract)

    def by_op(self) -> dict[str, dict[str, int]]:
        table: dict[str, Counter] = defaultdict(Counter)
        for r in self.results:
            table[r.op][r.status] += 1
        return {op: {s: c.get(s, 0) for s in STATUSES} for op, c in sorted(table.items())}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: verdict, counts, per-op table, every case and contract check."""
        return {
            "device": self.device,
            "strict": self.strict,
            "ok": self.ok,
            "counts": self.counts(),
            "by_op": self.by_op(),
            "cases": [_finite(asdict(r)) for r in self.results],
            "contract": [asdict(c) for c in self.contract],
        }

    def table(self) -> str:
        """The per-op table: one row per op with its count of each label."""
        head = ["op", "on device", "refused as declared", "via fallback", "fail", "crash", "skip"]
        rows = [head] + [[op] + [str(c[s]) for s in STATUSES] for op, c in self.by_op().items()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        lines = [
            "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))
            for r in rows
        ]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def __str__(self) -> str:
        counts = self.counts()
        mode = "strict" if self.strict else "fallback allowed"
        lines = [
            f"anychip conformance on {self.device} ({mode}): "
            + ", ".join(f"{k} {v}" for k, v in counts.items())
            + f"; contract {sum(c.ok for c in self.contract)}/{len(self.contract)} passed",
            self.table(),
        ]
        for c in self.contract:
            if not c.ok:
                lines.append(f"contract FAILED {c.name}: {c.detail}")
        for r in self.failures[:50]:
            err = f" max|err|={r.max_error:.3g}" if r.status == FAIL else ""
            lines.append(f"{r.status} {r.case} ({r.op}){err}: {r.detail}")
        if len(self.failures) > 50:
            lines.append(f"... and {len(self.failures) - 50} more (--json has them all)")
        if not any(r.status != SKIP for r in self.results):
            lines.append(f"no case ran on {self.device}: it claims no op of the ONNX node cases")
        lines.append("verdict: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


def _finite(d: dict[str, Any]) -> dict[str, Any]:
    """JSON has no inf: an unmeasurable difference (dtype or shape mismatch) is None."""
    if d.get("max_error") == float("inf"):
        d["max_error"] = None
    return d
