"""A run that survives a failing device: the request re-runs on the remaining devices.

When a step of a run fails on a device other than the host (a kernel or driver error, the
device gone: anything but a bad feed or a broken transfer budget), and the session may fall
back (not ``strict``, not bring-up), the device is marked unhealthy with the error, the
session is placed again without it (``Session.replan``), and the same request runs on that
placement; the caller gets its outputs, the log a warning, and ``Session.placement()`` says in
its first line that the device failed, with the error (its nodes' reason: ``failover``). A failure
on the host itself, or in strict mode, reaches the caller as before.
"""

from __future__ import annotations

import logging
from typing import Any

from anychip.core.run.lifecycle import check_open
from anychip.errors import InputError, PlacementError

__all__ = ["run_request"]

log = logging.getLogger("anychip")


def run_request(session: Any, arrays: list[Any]) -> list[Any]:
    """One request: the feedback runs while they last, then the steps; failover on a device
    error (see the module docstring)."""
    check_open(session)
    try:
        outs = _run(session, arrays)
        for sp in session.compiled.specialized.values():
            sp.start_compiles()  # after the request: a compile thread slows what it overlaps
        return outs
    except Exception as e:
        device = getattr(e, "anychip_device", None)
        if not _fails_over(session, e, device):
            raise
        session.unhealthy[device] = f"{type(e).__name__}: {' '.join(str(e).split())}"
        graph = session.compiled.model.graph
        failed = getattr(session, "failed_over", None)
        if failed is not None:  # the nodes it ran, for the placement report
            failed[device] = [n.name for n in graph.nodes if n.meta.get("device") == device]
        log.warning(
            "anychip: %s failed during a run (%s); it is marked unhealthy and the request runs "
            "again on %s",
            device,
            session.unhealthy[device],
            ", ".join(d for d in session.devices if d not in session.unhealthy),
        )
        session.replan()
        if session.feedback is not None:  # what it measured was of the old device set
            session.feedback.stop(f"stopped: {device} failed and the model was placed again")
        return session.compiled.steps.run(arrays)


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
    if isinstance(e, (InputError, PlacementError)):
        return False  # the request or the budget is at fault, not the device
    return device in session.devices and device not in session.unhealthy
