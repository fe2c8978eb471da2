"""Why a placement kept every node on one device, in words, from the placement's own cost
decisions (issue 44: a demo "that shows a model split over devices that is faster than any one
device, or says why none is").

Placement records, on each node a cost rule moved, what it priced (``node.meta["priced"]``,
``core/plan/placement.py``): the islands rule an island's time saved on its device (negative:
lost) and its copies' cost; the whole-graph rule (``core/plan/uncertainty.py``) the placement so
far against the whole graph on one device, and the estimate's uncertainty. A node another
device cannot run says so in its reason (``fallback: npu: ...``). ``why_one_device`` sums these
per other device of the session::

    xpu: 69 node(s) cannot run there (Conv x53, Sum x16); moving the 41 it can run (Relu x33,
    ...) would save 0.42 ms but costs 1.31 ms of copies (82 per run)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["why_one_device"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if abs(seconds) >= 1e-5 else f"{seconds * 1e6:.1f} us"


def _ops(names: list[str], most: int = 4) -> str:
    common = Counter(names).most_common()
    text = ", ".join(f"{op} x{n}" for op, n in common[:most])
    return text + (", ..." if len(common) > most else "")


def _cannot(device: str, reason: str) -> bool:
    """Whether a node's reason says ``device`` cannot run it (``fallback: xpu: ...; npu: ...``)."""
    if not reason.startswith("fallback: "):
        return False
    return any(part.startswith(f"{device}: ") for part in reason[10:].split("; "))


def _islands(device: str, nodes: list[Any]) -> str | None:
    groups: dict[str, dict[str, Any]] = {}
    ops: list[str] = []
    for n in nodes:
        p = n.priced
        if p is not None and p.get("rule") == "island" and p["device"] == device:
            groups.setdefault(p["group"], p)
            ops.append(n.op_type)
    if not groups:
        return None
    saves = sum(g["saves_s"] for g in groups.values())
    copy_s = sum(g["copy_s"] for g in groups.values())
    copies = sum(g["copies"] for g in groups.values())
    what = f"moving the {len(ops)} node(s) it can run ({_ops(ops)}) to {device}"
    if saves > 0:
        return (
            f"{what} would save {_ms(saves)} but costs {_ms(copy_s)} of copies ({copies} per run)"
        )
    return f"{what} would take {_ms(-saves)} longer, and {_ms(copy_s)} of copies ({copies} per run)"


def _whole(device: str, kept: str, nodes: list[Any]) -> str | None:
    for n in nodes:
        p = n.priced
        if p is None or p.get("rule") != "whole" or device not in p["devices"]:
            continue
        mixed, alone, u = p["mixed_s"], p["alone_s"], p["uncertainty_s"]
        on = f"{p['devices'][device]} node(s) on {device}"
        if mixed is None or alone is None:
            return f"the placement with {on} could not be estimated (unknown shapes)"
        head = f"the placement with {on} ({p['mixed_copies']} copies per run) was estimated "
        if mixed >= alone:
            return f"{head}{_ms(mixed)}, {_ms(mixed - alone)} slower than {kept} alone"
        within = "unmeasured figures" if u == float("inf") else f"+-{_ms(u)}"
        return (
            f"{head}{_ms(mixed)} against {_ms(alone)} on {kept} alone: its gain of "
            f"{_ms(alone - mixed)} is within the estimate's uncertainty ({within})"
        )
    return None


def why_one_device(report: Any) -> list[str]:
    """One sentence per other device of ``report`` (a ``PlacementReport``) saying why no node
    runs there, from what placement priced; [] when the nodes are split over devices or the
    session has one device."""
    used = {n.device for n in report.nodes}
    if len(used) != 1:
        return []
    kept = used.pop()
    out = []
    for device in report.devices:
        if device == kept:
            continue
        parts = []
        cannot = [n.op_type for n in report.nodes if _cannot(device, n.reason)]
        if cannot:
            parts.append(f"{len(cannot)} node(s) cannot run there ({_ops(cannot)})")
        for sentence in (_islands(device, report.nodes), _whole(device, kept, report.nodes)):
            if sentence is not None:
                parts.append(sentence)
        if not parts:  # no rule priced it: the nodes' own reasons, the most common first
            reasons = Counter(n.reason for n in report.nodes).most_common(1)
            parts.append(f"{reasons[0][1]} node(s): {reasons[0][0]}")
        out.append(f"{device}: " + "; ".join(parts))
    return out
