"""Measured placements remembered across processes: the feedback's decision, kept on disk.

A session over several devices starts on the placement the cost model trusts (decisions/032)
and its feedback measures the others within a 5% budget: a whole-graph compiler the per-op
calibration underrates (OpenVINO's CPU plugin ran Inception-v1 in 12.3 ms where the estimate
said 20.2 and anychip's CPU took 22.3) is found only after hundreds of requests, and every new
process paid for that search again. So when a feedback decides (a trial won, or every trial
lost), the decision is written under ``<cache>/placements/``: the next session of the same model
on the same devices, with the same calibrations, options and versions, starts on the measured
placement (compiled by the same recipe: the devices and policy a trial used, or the corrected
costs' factors) and explores nothing; its report says the placement was measured before,
when, and by how much it won. ``anychip calibrate MODEL --devices ...`` makes the decision ahead
of the requests (no budget: exploring is all that command does).

What the key holds: the model's ``graph_digest`` (structure and weights), the devices with
each backend's class, version and options, each calibration's key and version (a new
``anychip calibrate`` makes a new decision), the session's placement options and precision,
and anychip's version. Off with ``SessionOptions.remember_placement=False`` or
``ANYCHIP_REMEMBER_PLACEMENT=0`` (the test suite's default: a decision of one test must not
place the next). A record that does not parse, or whose recipe no longer compiles, is ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

__all__ = ["placement_key", "load_decision", "save_decision", "enabled"]

log = logging.getLogger("anychip")
FORMAT = 1


def enabled(option: bool | None) -> bool:
    """``option``, else ``ANYCHIP_REMEMBER_PLACEMENT`` (default on)."""
    if option is not None:
        return bool(option)
    return os.environ.get("ANYCHIP_REMEMBER_PLACEMENT", "1").strip().lower() not in (
        "0", "false", "no", "off",
    )  # fmt: skip


def placement_key(model: Any, backends: list[Any], options: Any) -> str:
    """What a measured decision depends on (module docstring), hashed."""
    from anychip.core.compile.cache import graph_digest
    from anychip.core.plan.calibration import cache_key, load_calibration
    from anychip.version import __version__

    parts = [f"format={FORMAT}", f"anychip={__version__}", f"graph={graph_digest(model.graph)}"]
    for b in backends:
        cal = load_calibration(b)
        parts.append(
            f"device={b.name}:{type(b).__module__}.{type(b).__qualname__}:{b.version}:"
            f"{sorted((str(k), repr(v)) for k, v in b.options.items())!r}:"
            f"{cache_key(b)}:{cal.version if cal else None}"
        )
    for name in ("policy", "strict", "calibration", "precision", "max_copies", "max_copy_bytes"):
        parts.append(f"{name}={getattr(options, name, None)!r}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]


def _path(key: str) -> Path:
    from anychip.paths import cache_root

    return cache_root() / "placements" / f"{key}.json"


def load_decision(key: str) -> dict[str, Any] | None:
    """The decision recorded under ``key``: ``{"label", "recipe", "decision", "when"}``
    (``recipe`` None: the cost model's own placement was kept), or None."""
    try:
        data = json.loads(_path(key).read_text(encoding="utf-8"))
        if data.get("format") != FORMAT or not isinstance(data.get("decision"), str):
            return None
        recipe = data.get("recipe")
        if recipe is not None and not (isinstance(recipe, list) and len(recipe) == 3):
            return None
        return data
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def save_decision(key: str, label: str, recipe: Any, decision: str) -> None:
    """Record a feedback's decision: ``recipe`` is how the winning placement was compiled,
    ``(factors, devices, policy)``, or None when the first placement was kept."""
    from anychip.paths import write_atomic

    data = {
        "format": FORMAT,
        "label": label,
        "recipe": None if recipe is None else [recipe[0], recipe[1], recipe[2]],
        "decision": decision,
        "when": time.time(),
        "load": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    try:  # atomic (a reader sees the old record or the new one), in the bounded store
        write_atomic(_path(key), json.dumps(data).encode("utf-8"))
    except (OSError, TypeError, ValueError) as e:  # a decision not kept is only slower later
        log.info("anychip: the measured placement was not recorded (%s)", e)


def start_from_memory(
    session: Any, model: Any, backends: list[Any], options: Any, compile_with: Any, remember: Any
) -> None:
    """Start ``session`` on the decision recorded for it, if any (its feedback then explores
    nothing); else have its feedback record the decision it makes."""
    fb = session.feedback
    if fb is None or not enabled(remember):
        return
    key = placement_key(model, backends, options)
    record = load_decision(key)
    if record is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(record.get("when", 0))))
        load = record.get("load")
        at = f", load average {load:.1f}" if isinstance(load, (int, float)) else ""
        why = f"measured in an earlier session ({when}{at}), nothing explored: {record['decision']}"
        try:
            if record["recipe"] is not None:
                factors, devices, policy = record["recipe"]
                compiled = compile_with(dict(factors), devices, policy)
                compiled.replaced = why
                session._use(compiled)
            fb.stop(why)
            return
        except Exception as e:  # the devices or the model changed beyond what the key sees
            log.info("anychip: the recorded placement was not used (%s: %s)", type(e).__name__, e)
    fb.on_decided = lambda label, recipe, decision: save_decision(key, label, recipe, decision)
