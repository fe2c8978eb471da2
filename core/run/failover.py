"""A run that survives a failing device, blaming the device only when it is at fault.

When a step of a run fails on a device other than the host (anything but a bad feed or a
broken transfer budget), and the session may fall back (not ``strict``, not bring-up), the
request runs again on a placement without that device, and the outcome decides the blame
(issue 47: one bad or oversized request used to put the session on the CPU for good):

* it fails there too: the request is at fault (an index out of range, say). The caller gets
  that error, and the session keeps its placement and its device;
* the device ran out of memory (``OutOfMemoryError``): the request is too large for it. That
  request's outputs come from the other placement, the session keeps its own for the next
  requests, and ``Session.placement()`` counts the requests that ran elsewhere and why;
* otherwise the device is at fault: it is marked unhealthy with the error (``Session.
  unhealthy``, its nodes in ``Session.failed_over``), the session keeps the placement without
  it, the log warns, and the placement report's first line says so. After a back-off
  (``BACKOFF`` seconds, doubling at each new failure up to ``MAX_BACKOFF``) the next request
  places the model with the device again; if it fails again it is marked again.

A failure on the host itself, or in strict mode, reaches the caller as before.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from anychip.core.run.lifecycle import check_open
from anychip.errors import InputError, OutOfMemoryError, PlacementError, RunTerminatedError

__all__ = ["run_request", "BACKOFF", "MAX_BACKOFF"]

log = logging.getLogger("anychip")

#: Seconds an unhealthy device stays out before a request tries it again (doubles per failure).
BACKOFF = 30.0
MAX_BACKOFF = 1800.0


def _now() -> float:
    return time.monotonic()


def run_request(session: Any, arrays: list[Any]) -> list[Any]:
    """One request: the feedback runs while they last, then the steps; failover on a device
    error (see the module docstring)."""
    check_open(session)
    _retry_after_backoff(session)
    try:
        outs = _run(session, arrays)
        for sp in session.compiled.specialized.values():
            sp.start_compiles()  # after the request: a compile thread slows what it overlaps
        return outs
    except Exception as e:
        device = getattr(e, "anychip_device", None)
        if device is None or not _fails_over(session, e, device):
            raise
        return _fail_over(session, arrays, e, device)


def _fail_over(session: Any, arrays: list[Any], e: Exception, device: str) -> list[Any]:
    why = f"{type(e).__name__}: {' '.join(str(e).split())}"
    keep = [d for d in session.devices if d not in session.unhealthy and d != device]
    factors = session.compiled.costs.factors if session.compiled.costs else {}
    other = session._compile_with(factors, devices=keep)
    try:
        outs = other.steps.run(arrays)
    except Exception as again:
        other.close()
        raise again from e  # the request fails everywhere: it is at fault, not the device
    if isinstance(e, OutOfMemoryError):  # too large for the device: this request only
        other.close()
        rerouted = _state(session)["rerouted"]
        count, _ = rerouted.get(device, (0, ""))
        rerouted[device] = (count + 1, why)
        log.warning("anychip: a request too large for %s ran on %s (%s)", device, keep, why)
        return outs
    state = _state(session)
    backoff = min(state["backoff"].get(device, BACKOFF / 2) * 2, MAX_BACKOFF)
    state["backoff"][device] = backoff
    state["retry_at"][device] = _now() + backoff
    session.unhealthy[device] = why
    graph = session.compiled.model.graph
    failed = getattr(session, "failed_over", None)
    if failed is not None:  # the nodes it ran, for the placement report
        failed[device] = [n.name for n in graph.nodes if n.meta.get("device") == device]
    log.warning(
        "anychip: %s failed during a run (%s); it is marked unhealthy, the request ran again "
        "on %s, and %s is tried again in %.0f s",
        device,
        why,
        ", ".join(keep),
        device,
        backoff,
    )
    old = session.compiled
    session._use(other)
    old.close()  # its graph-mode executables go back to their devices now
    if session.feedback is not None:  # what it measured was of the old device set
        session.feedback.stop(f"stopped: {device} failed and the model was placed again")
    return outs


def _state(session: Any) -> dict[str, dict[str, Any]]:
    state = getattr(session, "_failover", None)
    if state is None:
        state = session._failover = {"backoff": {}, "retry_at": {}, "rerouted": {}}
    return state


def _retry_after_backoff(session: Any) -> None:
    """Put back the unhealthy devices whose back-off is over (the model placed again)."""
    # a session's own attribute, read from its __dict__ (getattr with a default raised and
    # caught AttributeError on every request of a session that never failed over)
    state = session.__dict__.get("_failover") if hasattr(session, "__dict__") else None
    if state is None or not state["retry_at"]:
        return
    due = [d for d, at in state["retry_at"].items() if at <= _now() and d in session.unhealthy]
    if not due:
        return
    for d in due:
        del state["retry_at"][d]
        del session.unhealthy[d]
        getattr(session, "failed_over", {}).pop(d, None)
        log.info("anychip: %s is tried again after its back-off", d)
    session.replan()


def _run(session: Any, arrays: list[Any]) -> list[Any]:
    fb = session.feedback
    if fb is None or fb.done:
        return session.compiled.steps.run(arrays)
    outs, compiled = fb.run(session.compiled, arrays)
    if compiled is not session.compiled:
        session._use(compiled)
    return outs


def _fails_over(session: Any, e: Exception, device: str | None) -> bool:
    options = session.options
    if device is None or device == session.devices[-1] or options.strict or not options.failover:
        return False
    if session._compile_with is None:
        return False
    if isinstance(e, (InputError, PlacementError, RunTerminatedError)):
        return False  # the request, the budget or a cancel: not the device
    return device in session.devices and device not in session.unhealthy
