"""``anychip calibrate MODEL --devices a,b``: a model's placements measured now, the fastest
remembered (``core/api/remembered.py``), so its sessions start there and explore nothing.

The devices are calibrated first where they have no calibration here; then one session of the
model runs on random inputs of its declared shapes (symbolic dimensions 1) with no exploration
budget until its feedback has measured every placement worth trying (at most ``MAX_RUNS`` runs
or ``MAX_SECONDS``), which records the decision. This is the "in ``anychip calibrate``" of
decisions/032: the exploring a session would do within 5% of its requests, done ahead of them.
"""

from __future__ import annotations

import argparse
import time

__all__ = ["calibrate_model", "MAX_RUNS", "MAX_SECONDS"]

MAX_RUNS = 2000
MAX_SECONDS = 300.0


def calibrate_model(args: argparse.Namespace) -> int:
    import anychip
    from anychip.core.api.feeds import random_feeds
    from anychip.core.plan.calibration import calibration_for, resolve_calibration_mode
    from anychip.core.plugin.host import get_registry

    devices = [d.strip() for d in (args.devices or "").split(",") if d.strip()]
    if len(devices) < 2:
        raise anychip.AnychipError(
            "anychip calibrate MODEL needs --devices with two devices or more (e.g. "
            "--devices openvino:cpu,cpu): a placement over one device has nothing to decide"
        )
    registry = get_registry(devices)
    for name in devices:  # the declared figures only under ANYCHIP_CALIBRATION=off
        measure = resolve_calibration_mode(None) != "off"
        if (
            name in registry.backends
            and calibration_for(registry.backends[name], measure=measure) is None
        ):
            print(f"{name}: no calibration (its declared figures are used)")
    sess = anychip.load(
        args.model, devices=devices, explore_budget=float("inf"), remember_placement=True
    )
    fb = sess.feedback
    if fb is None:
        print(f"{args.model}: no placement to measure (the cost model is off or one device)")
        return 0
    if fb.done:
        print(f"{args.model}: {sess.placement().decision}")
        return 0
    feeds = random_feeds(sess, 0)
    t0, runs = time.perf_counter(), 0
    while not fb.done and runs < MAX_RUNS and time.perf_counter() - t0 < MAX_SECONDS:
        sess.run(None, feeds)
        runs += 1
    if not fb.done:
        print(f"{args.model}: undecided after {runs} runs ({fb.decision}); nothing recorded")
        return 1
    placed = ", ".join(f"{d}={n}" for d, n in sess.placement().by_device().items())
    print(f"{args.model}: decided in {runs} runs: {placed}")
    print(f"  {sess.placement().decision}")
    if fb.undecided:
        print("  not remembered: a trial stayed undecided (the machine busy?); run it again")
        return 1
    print("  remembered: its sessions over these devices start on this placement")
    return 0
