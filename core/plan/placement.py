"""Placement: which device runs each node, and why.

Capability is separate from partitioning (torch.fx's OperatorSupport vs its partitioner,
onnxruntime's GetCapability): ``capability`` asks one backend about one node and returns the
reason it cannot run it, or None. ``place`` combines the answers with the user's pins, the
``devices`` priority order and the cost model (``core/plan/cost.py``), and writes
``node.meta["device"]`` and ``node.meta["placement_reason"]`` on every top-level node.

Reasons, as shown in the placement report:
    ``chosen``            the first device in priority order that can run the node;
    ``pinned``            a user pin (``placement={...}``) decided;
    ``fallback: <why>``   the preferred devices cannot run it, each with its reason;
    ``cost: <why>``       a capable preferred device was passed over by the cost model.
"""

from __future__ import annotations

import fnmatch
import math
from typing import TYPE_CHECKING

from anychip.core.plan.calibration import resolve_calibration_mode
from anychip.core.plan.cost import MIN_ISLAND_GAIN
from anychip.core.plan.cost_moves import move_faster_groups
from anychip.core.plan.cost_search import Costs, prefer_single_device
from anychip.core.plan.uncertainty import no_lone_cheap_ops, prefer_safe_device
from anychip.core.plugin.kernels import KernelTable, find_kernel, input_dtypes
from anychip.errors import PlacementError, UnsupportedOpError

if TYPE_CHECKING:
    from anychip.core.plugin.backend import Backend
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node
    from anychip.ir.value import Value

__all__ = [
    "PlacementOptions",
    "capability",
    "find_kernel",
    "place",
    "input_dtypes",
    "avoid_costly_islands",
]


#: Placement policies, after onnxruntime's device policies where one fits: ``latency``
#: (MAX_PERFORMANCE: the measured cost model decides), ``prefer-first`` (PREFER_NPU/GPU: the
#: first device takes every node it can run; the cost model is off), ``min-copies`` (the
#: candidate placement with the fewest copies per run, then the fastest).
POLICIES = ("latency", "prefer-first", "min-copies")


def set_policy(options: PlacementOptions, policy: str | None) -> None:
    """Apply a policy name to ``options`` (None: keep what ``cost_model`` said)."""
    if policy is None:
        return
    if policy not in POLICIES:
        raise PlacementError(f"placement_policy {policy!r} is unknown; use one of {POLICIES}")
    options.policy = policy
    options.cost_model = policy != "prefer-first"


class PlacementOptions:
    """What the user says about placement.

    Args:
        pins: maps a node name, an op type, or a glob on node names to a device name.
            Exact node names win over op types, which win over globs.
        strict: fail instead of falling back from the first device to a later one.
        max_copies: fail compilation when a run would make more device copies than this.
        max_copy_bytes: the same for the bytes one run copies (checked at compile time where
            sizes are static, and by each run for the others).
        cost_model: move islands whose copies cost more than they save, and the whole graph
            to one device when that is estimated faster (default True); False keeps the pure
            priority placement (conformance runs use it so that every node a device can run
            does run there).
        calibrations: measured figures per device name (``core/plan/calibration.py``).
        factors: feedback factors per device (measured / estimated partition time) and per
            ``"copy:<device>"`` (measured / estimated copy time); 1.0 where absent.
    """

    __slots__ = (
        "pins",
        "strict",
        "max_copies",
        "max_copy_bytes",
        "cost_model",
        "calibration",
        "failover",
        "policy",
        "calibrations",
        "factors",
        "explore_budget",
        "remember",
    )

    def __init__(
        self,
        pins: dict[str, str] | None = None,
        strict: bool = False,
        max_copies: int | None = None,
        cost_model: bool = True,
        max_copy_bytes: int | None = None,
        *,
        calibration: str | None = "off",
        failover: bool = True,
    ) -> None:
        self.pins = dict(pins or {})
        self.strict = strict
        self.max_copies = max_copies
        if max_copy_bytes is not None and int(max_copy_bytes) < 0:
            raise PlacementError(f"max_copy_bytes must be >= 0, got {max_copy_bytes}")
        self.max_copy_bytes = None if max_copy_bytes is None else int(max_copy_bytes)
        self.cost_model = cost_model
        #: "auto" | "cached" | "off" (None: $ANYCHIP_CALIBRATION): see core/plan/calibration.py.
        self.calibration = resolve_calibration_mode(calibration)
        #: A device failing during a run is marked unhealthy and the request re-runs without
        #: it (``core/run/failover.py``); never in strict mode.
        self.failover = failover
        #: "latency" (the cost model), "prefer-first" or "min-copies": see ``POLICIES``.
        self.policy = "latency" if cost_model else "prefer-first"
        self.calibrations: dict[str, object] = {}
        self.factors: dict[str, float] = {}
        #: The share of the run time the session's feedback may spend exploring (decisions/032).
        self.explore_budget = 0.05
        #: Start from a placement an earlier session measured (``core/api/remembered.py``;
        #: None: ``ANYCHIP_REMEMBER_PLACEMENT``, default on).
        self.remember: bool | None = None

    def pin_for(self, node: Node) -> str | None:
        if node.name in self.pins:
            return self.pins[node.name]
        if node.op_type in self.pins:
            return self.pins[node.op_type]
        for pattern, device in self.pins.items():
            if any(c in pattern for c in "*?[") and fnmatch.fnmatchcase(node.name, pattern):
                return device
        return None


def capability(backend: Backend, table: KernelTable | None, node: Node) -> str | None:
    """None when ``backend`` can run ``node``, else the reason it cannot
    (``Backend.supports`` with this kernel table)."""
    return backend.supports(node, table)


def place(
    graph: Graph,
    backends: list[Backend],
    tables: dict[str, KernelTable],
    options: PlacementOptions,
    excluded: dict[str, dict[str, str]] | None = None,
) -> None:
    """Choose a device for every node of ``graph`` (top level; nested graphs follow parents).

    Raises:
        UnsupportedOpError: no device among ``backends`` can run a node (each reason listed).
        PlacementError: a pin names an unknown device or one that cannot run the node, or
            ``strict`` is set and a node would fall back.
    """
    excluded = excluded or {}
    by_name = {b.name: b for b in backends}
    for pin_device in set(options.pins.values()):
        if pin_device not in by_name:
            raise PlacementError(
                f"placement pins name device {pin_device!r}, which is not among this "
                f"session's devices {list(by_name)}; add it to devices= or fix the pin"
            )
    refused: list[str] = []
    for node in graph.nodes:
        pin = options.pin_for(node)
        if pin is not None:
            _place_pinned(node, by_name[pin], tables)
        else:
            why = _place_by_priority(node, backends, tables, options, excluded.get(node.name, {}))
            if why:
                refused.append(why)
    if refused:
        raise PlacementError(
            f"strict placement: {len(refused)} node(s) would fall back from "
            f"{backends[0].name}:\n"
            + "\n".join(f"  {r}" for r in refused)
            + "\nPin them elsewhere, or load without strict=True."
        )
    if options.cost_model:
        _keep_shape_chains_on_host(graph, backends, tables)
        # Declared figures are trusted only when the user chose them (calibration "off"): a
        # device not measured here has an unbounded uncertainty (decisions/032).
        unmeasured = 0.0 if options.calibration == "off" else math.inf
        costs = Costs(backends, options.calibrations, options.factors, unmeasured=unmeasured)
        if options.policy != "min-copies":  # the islands rule and the moves are about time
            avoid_costly_islands(graph, backends, tables, options, costs)
            _move_faster_groups(graph, backends, tables, costs)
            for n, why in no_lone_cheap_ops(graph, backends, _capable_fn(tables), costs):
                _assign(n, backends[-1], tables, why)
        _prefer_single_device(graph, backends, tables, costs, options)


#: Ops that start a shape computation: their output describes a tensor, not its values.
SHAPE_SOURCES = frozenset({"Shape", "Size"})
#: A shape value is small: at most this many elements (a shape, an index, a size).
SHAPE_ELEMENTS = 64


def _is_shape_value(v: Value | None) -> bool:
    if v is None or v.dtype is None or v.dtype.numpy.kind not in "iub":
        return False
    return v.is_static and v.nbytes is not None and v.nbytes <= SHAPE_ELEMENTS * 8


def _keep_shape_chains_on_host(
    graph: Graph, backends: list[Backend], tables: dict[str, KernelTable]
) -> None:
    """Shape computations (``Shape``/``Size`` and the small integer arithmetic on their
    results: Gather, Concat, Unsqueeze, Add...) run on the host: moving a few integers to a
    device and back costs more than computing them, and the host reads them anyway."""
    host = backends[-1]
    shape_values: set[Value] = set()
    for node in graph.nodes:
        tensors = [v for v in node.inputs if v is not None and v.const is None]
        if node.op_type in SHAPE_SOURCES:
            chain = True
        else:
            chain = bool(tensors) and all(v in shape_values for v in tensors)
        if not chain or not all(_is_shape_value(v) for v in node.outputs if v is not None):
            continue
        shape_values.update(v for v in node.outputs if v is not None)
        reason = node.meta.get("placement_reason", "")
        if node.meta.get("device") == host.name or reason == "pinned":
            continue
        if capability(host, tables.get(host.name), node) is None:
            _assign(node, host, tables, "shape computation: stays on the host")


def _capable_fn(tables: dict[str, KernelTable]):
    def capable(b: Backend, n: Node) -> bool:
        return n.meta["device"] == b.name or capability(b, tables.get(b.name), n) is None

    return capable


def _move_faster_groups(
    graph: Graph, backends: list[Backend], tables: dict[str, KernelTable], costs: Costs
) -> None:
    """Each kernel-mode device takes the connected groups of nodes it is estimated faster
    at, copies included (``core/plan/cost_moves.py``)."""

    def assign(n: Node, b: Backend, why: str) -> None:
        _assign(n, b, tables, why)

    move_faster_groups(graph, backends, _capable_fn(tables), costs, assign)


def _prefer_single_device(
    graph: Graph,
    backends: list[Backend],
    tables: dict[str, KernelTable],
    costs: Costs,
    options: PlacementOptions,
) -> None:
    """Move every node to one device when that is estimated faster than the placement so far
    (mixed, or on another device alone; ``min-copies``: when it makes fewer copies per run)."""

    capable = _capable_fn(tables)
    by_copies = options.policy == "min-copies"
    if not by_copies:  # the reference and the uncertainty (core/plan/uncertainty.py)
        safe = prefer_safe_device(graph, backends, capable, costs)
        if safe is not None:
            for n in graph.nodes:
                if n.meta["device"] != safe[0].name:
                    _assign(n, safe[0], tables, safe[1])
                    n.meta["priced"] = safe[2]
        return
    found = prefer_single_device(graph, backends, capable, costs, by_copies)
    if found is None:
        return
    target, alone, mixed = found
    rule = "fewest copies" if by_copies else "cost"
    devices = {n.meta["device"] for n in graph.nodes}
    before = "the mixed placement" if len(devices) > 1 else f"on {devices.pop()}"
    why = f"{rule}: the whole graph on {target.name} is estimated {alone}, {before} {mixed}"
    for n in graph.nodes:
        if n.meta["device"] != target.name:
            _assign(n, target, tables, why)


def _islands(graph: Graph, host: str) -> list[list[Node]]:
    """Connected groups of top-level nodes placed on the same non-host device."""
    parent: dict[Node, Node] = {}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    for n in graph.nodes:
        if n.meta["device"] != host:
            parent[n] = n
    for n in parent:
        for v in n.inputs:
            p = v.producer if v is not None else None
            if p in parent and p.meta["device"] == n.meta["device"]:
                parent[find(n)] = find(p)
    groups: dict[Node, list[Node]] = {}
    for n in graph.nodes:
        if n in parent:
            groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def avoid_costly_islands(
    graph: Graph,
    backends: list[Backend],
    tables: dict[str, KernelTable],
    options: PlacementOptions,
    costs: Costs | None = None,
) -> None:
    """Move islands whose copies cost more than they save to the next capable device."""
    costs = costs or Costs(backends, options.calibrations, options.factors)
    host = backends[-1].name
    by_name = {b.name: b for b in backends}
    outputs = set(graph.outputs)
    for island in _islands(graph, host):
        dev = by_name[island[0].meta["device"]]
        if any(n.meta["placement_reason"] == "pinned" for n in island):
            continue
        members = set(island)
        later = backends[backends.index(dev) + 1 :]
        target = next(
            (b for b in later if all(capability(b, tables.get(b.name), n) is None for n in island)),
            None,
        )
        if target is None:
            continue
        # A graph-mode device launches the compiled partition once, not once per node.
        gain = costs.island_launches(dev.name, len(island))
        for n in island:
            t_dev, t_alt = costs.node(n, dev.name), costs.node(n, target.name)
            if t_dev is None or t_alt is None:
                gain = float("inf")
                break
            gain += t_alt - t_dev
        if gain == float("inf"):
            continue
        crossing: set[Value] = set()
        for n in island:
            crossing.update(
                v
                for v in n.inputs
                if v is not None and v.const is None and v.producer not in members
            )
            crossing.update(
                v
                for v in n.outputs
                if v is not None and (v in outputs or any(u not in members for u, _ in v.uses))
            )
        cost = sum(costs.copy(v.nbytes, dev.name) for v in crossing)
        if gain < cost + MIN_ISLAND_GAIN:
            why = (
                f"cost: island of {len(island)} node(s) on {dev.name} saves "
                f"{gain * 1e6:.1f} us but its {len(crossing)} copies cost {cost * 1e6:.1f} us"
                if gain > 0
                else f"cost: island of {len(island)} node(s) would take {-gain * 1e6:.1f} us "
                f"longer on {dev.name} than on {target.name}, and its {len(crossing)} "
                f"copies {cost * 1e6:.1f} us more"
            )
            # The alternative priced, as data (``core/report/why_one_device.py`` sums them)
            priced = {
                "rule": "island",
                "group": island[0].name,
                "device": dev.name,
                "nodes": len(island),
                "saves_s": gain,
                "copies": len(crossing),
                "copy_s": cost,
            }
            for n in island:
                _assign(n, target, tables, why)
                n.meta["priced"] = priced


def _place_pinned(node: Node, b: Backend, tables: dict[str, KernelTable]) -> None:
    why = capability(b, tables.get(b.name), node)
    if why is not None:
        raise PlacementError(
            f"node {node.name!r} ({node.op_type}) is pinned to {b.name}, which cannot run "
            f"it: {why}. Remove the pin or pin it to another device."
        )
    _assign(node, b, tables, "pinned")


def _place_by_priority(
    node: Node,
    backends: list[Backend],
    tables: dict[str, KernelTable],
    options: PlacementOptions,
    excluded: dict[str, str],
) -> str | None:
    """The first device that can run ``node``; every earlier device's reason is recorded.
    Returns what strict placement refuses (the fallback it would make), else None."""
    reasons: list[tuple[str, str]] = []
    for b in backends:
        why = excluded.get(b.name) or capability(b, tables.get(b.name), node)
        if why is not None:
            reasons.append((b.name, why))
            continue
        if not reasons:
            _assign(node, b, tables, "chosen")
            return None
        if options.strict:
            return f"{node.name} ({node.op_type}) -> {b.name}: {reasons[0][0]}: {reasons[0][1]}"
        _assign(node, b, tables, "fallback: " + "; ".join(f"{d}: {r}" for d, r in reasons))
        return None
    lines = "\n".join(f"  {d}: {r}" for d, r in reasons)
    raise UnsupportedOpError(
        f"no device can run node {node.name!r} ({node.qualified_op}, opset version "
        f"{node.version}):\n{lines}\nAdd a device that supports it (devices=...), or "
        "install a plugin with a kernel for it."
    )


def _assign(node: Node, backend: Backend, tables: dict[str, KernelTable], reason: str) -> None:
    node.meta["device"] = backend.name
    node.meta.pop("priced", None)  # what a cost rule priced: set by it after the move
    node.meta["placement_reason"] = reason
    if not backend.graph_mode:
        kernel, _ = find_kernel(tables.get(backend.name), node)
        node.meta["kernel"] = kernel
        if kernel is not None and kernel.reference:
            node.meta["placement_reason"] = reason + " (reference kernel)"
