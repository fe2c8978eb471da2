"""A first placement that is right or safe (decisions/032).

An estimate is only as good as its figures: a device's calibration records how far its two
sweeps disagreed (``Calibration.spread``), and a device with no calibration here has only its
datasheet (``Costs.unmeasured``: infinite, unless calibration is ``off``, where the declared
figures are what the user chose). So the cost model's last word on a placement
(``prefer_safe_device``) is a comparison with an uncertainty:

- the *reference* is the host alone (every op runs there), or the fastest single device by
  estimate when the host cannot run the whole graph;
- another device alone replaces it only when its estimated gain exceeds the uncertainty of the
  difference (``difference_uncertainty``: the nodes placed differently, on both sides, and the
  copies only one of the two makes; a figure shared by both cancels out), and ``MARGIN``;
- the mixed placement the islands and moves produced is kept over the best single device only
  under the same rule; otherwise every node goes to that device.

A new device's first load thus runs on the host (nothing of an unmeasured device can be
trusted), and the session's feedback explores from there within its budget
(``core/run/feedback.py``).

Lone cheap ops (``no_lone_cheap_ops``): a node alone on an accelerator (no neighbour on the
same device) that the host runs in under ``LONE_CHEAP`` seconds goes to the host: its copies
and its launch cost more than it can save, and its estimate is the least certain part of the
placement (issue 40: three lone Transposes parked on a new device took 60 runs to come back).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING, Any

from anychip.core.plan.cost_search import MARGIN, Estimate, estimate

if TYPE_CHECKING:
    from anychip.core.plan.cost_search import Costs
    from anychip.core.plugin.backend import Backend
    from anychip.ir.graph import Graph
    from anychip.ir.node import Node

__all__ = ["difference_uncertainty", "prefer_safe_device", "no_lone_cheap_ops", "LONE_CHEAP"]

#: A lone node the host runs faster than this (seconds) never stays on an accelerator.
LONE_CHEAP = 50e-6


def _scaled(relative: float, seconds: float) -> float:
    return 0.0 if seconds == 0 else relative * seconds


def _copy_set(graph: Graph, device_of: dict[Node, str], host: str) -> set[tuple[Any, str, str]]:
    """(value, from, to) of every per-run copy of a placement (as ``cost_search._copies``)."""
    outputs = set(graph.outputs)
    out = set()
    for v in graph.values():
        if v.const is not None:
            continue
        src = device_of.get(v.producer, host) if v.producer is not None else host
        readers = {device_of[u] for u, _ in v.uses if u in device_of}
        if v in outputs:
            readers.add(host)
        out.update((v, src, dst) for dst in readers - {src})
    return out


def difference_uncertainty(
    graph: Graph, a: dict[Node, str], b: dict[Node, str], costs: Costs, host: str
) -> float:
    """Seconds of uncertainty in ``estimate(a) - estimate(b)``: each node placed differently,
    on both devices, and each copy one placement makes and the other does not, each time its
    relative uncertainty (``Costs.uncertainty``); inf when a time is unknown."""
    total = 0.0
    for n in graph.nodes:
        if a[n] == b[n]:
            continue
        for dev in (a[n], b[n]):
            t = costs.node(n, dev)
            if t is None:
                return math.inf
            total += _scaled(costs.uncertainty(n, dev), t)
    for v, src, dst in _copy_set(graph, a, host) ^ _copy_set(graph, b, host):
        for dev in {src, dst} - {host}:
            total += _scaled(costs.copy_uncertainty(dev), costs.copy(v.nbytes, dev))
    return total


def _pays(ref: Estimate, cand: Estimate, uncertainty: float) -> bool:
    """Whether ``cand`` is estimated faster than ``ref`` by more than ``MARGIN`` of ``ref``
    and more than the difference's uncertainty."""
    if ref.seconds is None or cand.seconds is None:
        return False
    gain = ref.seconds - cand.seconds
    return gain > MARGIN * ref.seconds and gain > uncertainty


def prefer_safe_device(
    graph: Graph, backends: list[Backend], capable: Any, costs: Costs
) -> tuple[Backend, str, dict[str, Any]] | None:
    """The device every node should move to, with the reason and the comparison as data
    (``rule`` "whole": the placement so far on ``devices``, ``mixed_s``, against ``alone_s``
    on the target, with ``uncertainty_s``), or None to keep the placement (see the module
    docstring). ``capable(backend, node)`` as placement answers it."""
    host = backends[-1].name
    current = {n: n.meta["device"] for n in graph.nodes}
    if any(n.meta["placement_reason"] == "pinned" for n in graph.nodes):
        return None
    singles: dict[str, tuple[Backend, dict[Node, str], Estimate]] = {}
    for b in backends:
        if all(capable(b, n) for n in graph.nodes):
            where = dict.fromkeys(graph.nodes, b.name)
            singles[b.name] = (b, where, estimate(graph, where, costs, host))
    if not singles:
        return None
    mixed = estimate(graph, current, costs, host)

    def seconds(e: Estimate) -> float:
        return math.inf if e.seconds is None else e.seconds

    if host in singles:
        ref = host
    else:
        ref = min(singles, key=lambda k: seconds(singles[k][2]))
    best = ref
    for name, (_, where, est) in singles.items():
        if name == ref or seconds(est) >= seconds(singles[best][2]):
            continue
        ref_where, ref_est = singles[ref][1], singles[ref][2]
        if _pays(ref_est, est, difference_uncertainty(graph, ref_where, where, costs, host)):
            best = name
    target, where, alone = singles[best]
    if current == where:
        return None
    if mixed.seconds is None and costs.unmeasured == 0:
        return None  # unknown shapes, declared figures chosen: priority and the islands rule
    u = difference_uncertainty(graph, where, current, costs, host)
    if _pays(alone, mixed, u):
        return None
    devices = set(current.values())
    before = "the mixed placement" if len(devices) > 1 else f"on {devices.pop()}"
    why = f"cost: the whole graph on {target.name} is estimated {alone}, {before} {mixed}"
    if seconds(mixed) < seconds(alone):
        unc = f"+-{u * 1e3:.3f} ms"
        if math.isinf(u):  # a device not calibrated here: say how to measure it now
            new = sorted({str(d) for d in current.values()} - {target.name})
            unc = "unmeasured figures; measured in the background by a load with calibration "
            unc += '"auto" that lives long enough, or now by '
            unc += " ".join(["anychip calibrate"] + [f"--device {d}" for d in new])
        why += f" (its gain is within the estimate's uncertainty, {unc})"
    priced = {
        "rule": "whole",
        "device": target.name,
        "devices": dict(Counter(current.values())),
        "alone_s": alone.seconds,
        "mixed_s": mixed.seconds,
        "mixed_copies": mixed.copies,
        "uncertainty_s": u,
    }
    return target, why, priced


def no_lone_cheap_ops(graph: Graph, backends: list[Backend], capable: Any, costs: Costs) -> list:
    """The nodes alone on an accelerator that are not worth it (module docstring), each with
    the reason to move it to the host; placement moves them."""
    host = backends[-1]
    out = []
    for n in graph.nodes:
        dev = n.meta["device"]
        if dev == host.name or n.meta["placement_reason"] == "pinned":
            continue
        neighbours = [v.producer for v in n.inputs if v is not None and v.producer is not None]
        neighbours += [u for v in n.outputs if v is not None for u, _ in v.uses]
        if any(m.meta.get("device") == dev for m in neighbours):
            continue
        on_host = costs.node(n, host.name)
        if on_host is not None and on_host < LONE_CHEAP and capable(host, n):
            t = f"{on_host * 1e6:.1f} us"
            out.append((n, f"cost: a lone {n.op_type} ({t} on {host.name}) is not worth a device"))
    return out
