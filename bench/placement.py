"""Placement that pays: every model on every device set, against the fastest single device.

For each model (the nine light CNNs with seeded random weights, the held-out models of
``bench/models.py``, GPT-2's block ``attention_mix`` of ``bench/mixed_model.py`` whose parts
run fastest on different devices (also at sequence 512, ``attention_long``, and narrow at
sequence 1024, ``attention_1k``: d 128, 4 heads), and the Hugging Face BERT and GPT-2 exports of
``tests/data`` at batch 8, sequence 128) and each device set (``cpu``, ``xpu,cpu``,
``npu,cpu``, ``npu,xpu,cpu``, those available here), the session is loaded with measured costs
(``calibration="auto"``), warmed up through its feedback runs, then timed; each device alone
(``strict``, where it can run the whole model) is timed in the same interleaved rounds, in a
new (seeded) order each round, the sessions taking turns run by run (the best of ``--runs``
per round), each timed run after an untimed one. Printed
per row: median ms, ratio to the fastest single device among the set's own, copies and bytes
per run, and the nodes per device.

    python bench/placement.py [--rounds 5] [--runs 3] [--models resnet50,mlp]
                              [--sets "cpu;xpu,cpu"] [--cpu-time]

``--fresh`` measures what a user gets instead (issue 45): each device set and each device
alone in a fresh process, its first run, the mean of runs 2-10, the mean of runs 1-10 and the
steady time (the median of ``--runs`` runs after ``--settle`` more), each against the best
single device of the set by the same measure. Calibrations missing here are measured first
(``anychip calibrate``), as a user's second load would find them.

    python bench/placement.py --fresh [--models mlp,squeezenet] [--sets "xpu,cpu;npu,cpu"]
                              [--settle 100] [--runs 10] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import re
import statistics
import sys
import time

import numpy as np

import anychip

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from bench._timing import bars, progress
from bench.mixed_model import attention_mix
from bench.models import HELD_OUT

SETS = [["cpu"], ["xpu", "cpu"], ["npu", "cpu"], ["npu", "xpu", "cpu"]]
#: Runs 1 to EARLY are "the first runs" (issue 45: the mean of runs 1-10).
EARLY = 10
#: Runs at most before the timed rounds (a session whose feedback is still undecided is
#: flagged in the table).
WARMUP_CAP = 400


def _models(names: list[str] | None) -> dict[str, tuple[bytes, dict | None]]:
    from anychip.zoo import LIGHT_MODELS, light_model

    out = {}
    for name in LIGHT_MODELS:
        if names is None or name in names:
            out[name] = (light_model(name, seed=0).SerializeToString(), None)
    extra = {  # parts faster on different devices
        "attention_mix": (attention_mix, None),
        "attention_long": (lambda: attention_mix(batch=2, seq=512), None),
        # a narrow block over a long context: the attention is most of the work
        "attention_1k": (lambda: attention_mix(batch=1, seq=1024, d=128, heads=4), None),
    }
    for name, (make, shapes) in {**HELD_OUT, **extra}.items():
        if names is None or name in names:
            out[name] = (make(), shapes)
    # Hugging Face BERT and GPT-2 exports (tiny configs, torch.onnx dynamo; tests/data/README.md)
    data = os.path.join(os.path.dirname(__file__), "..", "tests", "data")
    for name in ("hf_bert_tiny", "hf_gpt2_tiny"):
        if names is None or name in names:
            with open(os.path.join(data, f"{name}.onnx"), "rb") as f:
                out[name] = (f.read(), {"B": 8, "S": 128})
    # the CNNs built in bench/cpu_models.py (resnet_like...), and its other names, when asked
    from bench.cpu_models import MODELS as CPU_MODELS
    from bench.cpu_models import build

    for name in CPU_MODELS:
        if names is not None and name in names and name not in out:
            m, feeds = build(name)
            out[name] = (m.SerializeToString(), {k: list(a.shape) for k, a in feeds.items()})
    return out


def _feeds(sess: anychip.Session, shapes: dict | None) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    dims = shapes or {}
    for i in sess.inputs:
        shape = dims.get(i.name) or [d if isinstance(d, int) else dims.get(d, 1) for d in i.shape]
        if i.dtype.numpy.kind in "iu":  # token ids, attention masks
            feeds[i.name] = rng.integers(0, 2 if "mask" in i.name else 100, shape).astype(
                i.dtype.numpy
            )
        else:
            feeds[i.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _sessions(
    model: bytes, available: set[str], sets: list[list[str]]
) -> dict[str, anychip.Session]:
    """Each device set's session, and each device alone where it runs the whole model."""
    out = {}
    for devices in sets:
        if set(devices) <= available:
            out[",".join(devices)] = anychip.load(model, devices=devices, calibration="auto")
    for dev in sorted({d for s in sets for d in s} & available):
        try:
            out[f"{dev} alone"] = anychip.load(model, devices=[dev], strict=True, cost_model=False)
        except anychip.AnychipError:
            pass  # the device cannot run the whole model
    return out


def _timed_rounds(
    name: str, sessions: dict, feeds: dict, rounds: int, runs: int, clock
) -> dict[str, list[float]]:
    """Each session warmed up through its feedback, then timed in interleaved rounds (the
    best of ``runs`` per round)."""
    for sess in sessions.values():
        # Warm-up, then the feedback's runs and trials (re-placement happens here), until it
        # has decided: a trial still running would be timed in the rounds, under the current
        # placement's name (60 runs did not end zfnet512's trials on npu,xpu,cpu while the
        # NPU compiled them: 1.22x the CPU alone, every node on the CPU).
        for n in range(WARMUP_CAP):
            sess.run(None, feeds)
            if n >= 4 and (sess.feedback is None or sess.feedback.done):
                break
    times: dict[str, list[float]] = {k: [] for k in sessions}
    order = list(sessions.items())
    rng = random.Random(0)
    for _ in progress(range(rounds), f"{name}: rounds"):
        # A new order each round (seeded): a rotation keeps each session's predecessor, and a
        # session run right after another pays for what that one left behind (threads still
        # spinning, its data in the caches); the same predecessor every round made the all-CPU
        # `cpu` row of attention_mix 1.36x its "cpu alone" (which always followed another
        # all-CPU session). One untimed run before each timed one absorbs what is left, and
        # the sessions take turns run by run, so a burst of another process's work falls on
        # all of them alike, not on the one whose runs it overlapped.
        rng.shuffle(order)
        best = dict.fromkeys(sessions, float("inf"))
        for _ in range(runs):
            for key, sess in order:
                sess.run(None, feeds)
                t0 = clock()
                sess.run(None, feeds)
                best[key] = min(best[key], clock() - t0)
        for key, t in best.items():
            times[key].append(t)
    return times


def _child(model: str, devices: list[str], alone: bool, settle: int, runs: int) -> None:
    """One fresh process's session: its first ``EARLY`` runs timed one by one, ``settle``
    runs more, then ``runs`` timed; one JSON line."""
    import json

    m, shapes = _models([model])[model]
    if alone:
        sess = anychip.load(m, devices=devices, strict=True, cost_model=False)
    else:
        sess = anychip.load(m, devices=devices, calibration="auto")
    feeds = _feeds(sess, shapes)
    first = []
    for _ in range(EARLY):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        first.append(time.perf_counter() - t0)
    for _ in range(settle):
        sess.run(None, feeds)
    steady = []
    for _ in range(runs):
        t0 = time.perf_counter()
        sess.run(None, feeds)
        steady.append(time.perf_counter() - t0)
    fb = sess.feedback
    print(
        json.dumps(
            {
                "first": first,
                "steady": statistics.median(steady),
                "nodes": sess.placement().by_device(),
                "explored": None if fb is None else fb.explored,
                "session": None if fb is None else fb.session_time,
                "done": fb is None or fb.done,
            }
        )
    )


def _fresh(
    names: list[str] | None, sets: list[list[str]], settle: int, runs: int, repeat: int = 1
) -> None:
    """The table of ``--fresh`` (module docstring)."""
    import json
    import subprocess

    from anychip.core.plan.calibration import calibration_for
    from anychip.core.plugin.host import get_registry

    devices = sorted({d for s in sets for d in s})
    registry = get_registry(devices)
    for d in devices:  # measured up front, as `anychip calibrate` does
        calibration_for(registry.backends[d])

    def one(model: str, devs: list[str], alone: bool) -> dict | None:
        cmd = [sys.executable, __file__, "--child", model, "--sets", ",".join(devs)]
        cmd += ["--settle", str(settle), "--runs", str(runs)] + (["--alone"] if alone else [])
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return None  # a device alone that cannot run the whole model
        return json.loads(done.stdout.strip().splitlines()[-1])

    def median_of(got: list[dict]) -> dict:
        """Per run index and for the steady time, the median over the processes (one fresh
        process's runs 1-10 vary 1.5x and more between identical placements)."""
        out = dict(got[len(got) // 2])
        out["first"] = [statistics.median(col) for col in zip(*(g["first"] for g in got))]
        out["steady"] = statistics.median(g["steady"] for g in got)
        out["spread"] = max(g["steady"] for g in got) / min(g["steady"] for g in got)
        return out

    print(
        f"{'model':<14} {'devices':<14} {'run 1':>8} {'2-10':>8} {'1-10':>8} {'x best':>7} "
        f"{'steady':>8} {'x best':>7} {'explored':>8}  nodes"
    )
    rng = random.Random(0)
    for mname in _models(names):
        # The processes of all rows of a model interleaved, in a new (seeded) order each
        # repeat: taken row after row, a drift of the machine (another tenant, the page
        # cache) fell on whole rows and read as the device set's doing.
        configs = [((d,), True) for d in devices] + [
            (tuple(s), False) for s in sets if s != ["cpu"]
        ]
        runs_of: dict = {c: [] for c in configs}
        for _ in range(repeat):
            rng.shuffle(configs)
            for devs, alone_ in configs:
                got = one(mname, list(devs), alone_)
                if got is not None:
                    runs_of[(devs, alone_)].append(got)
        rows = {c: median_of(g) for c, g in runs_of.items() if g}
        alone = {d: rows.get(((d,), True)) for d in devices}
        for devs in sets:
            got = alone[devs[0]] if devs == ["cpu"] else rows.get((tuple(devs), False))
            if got is None:
                continue
            singles = [alone[d] for d in devs if alone.get(d)]
            best_early = min(statistics.fmean(a["first"]) for a in singles)
            best_steady = min(a["steady"] for a in singles)
            f = got["first"]
            early, mean = statistics.fmean(f[1:]), statistics.fmean(f)
            share = (
                f"{got['explored'] / got['session']:.1%}"
                if got["explored"] is not None and got["session"]
                else "-"  # no feedback, or one that stopped before its first run
            )
            print(
                f"{mname:<14} {','.join(devs):<14} {f[0] * 1e3:8.2f} {early * 1e3:8.2f} "
                f"{mean * 1e3:8.2f} {mean / best_early:7.2f} {got['steady'] * 1e3:8.2f} "
                f"{got['steady'] / best_steady:7.2f} {share:>8}  {got['nodes']}"
                + ("" if got["done"] else " (still exploring)")
            )
        if alone.get("cpu") and repeat > 1:
            print(
                f"{mname:<14} (the cpu alone's steady time varied {alone['cpu']['spread']:.2f}x "
                f"over its {repeat} processes)"
            )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3, help="runs per round (best taken)")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the process's CPU time (all its threads) instead of wall time: on a loaded "
        "machine it counts each session's own work; a second thread's gain does not show",
    )
    ap.add_argument("--models", default=None)
    ap.add_argument(
        "--sets",
        default=None,
        help="device sets, ';'-separated (default: cpu;xpu,cpu;npu,cpu;npu,xpu,cpu)",
    )
    ap.add_argument("--fresh", action="store_true", help="each session in a fresh process")
    ap.add_argument("--settle", type=int, default=100, help="--fresh: runs before steady")
    ap.add_argument("--repeat", type=int, default=1, help="--fresh: processes per row (medians)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.sets.split(","), args.alone, args.settle, args.runs)
        return
    sets = [s.split(",") for s in args.sets.split(";")] if args.sets else SETS
    clock = time.process_time if args.cpu_time else time.perf_counter
    available = {d.name for d in anychip.devices() if d.available}
    unusable = sorted({d for s in sets for d in s} - available)
    if unusable:
        ap.error(
            f"--sets names {', '.join(unusable)}, not an available device here "
            f"(available: {', '.join(sorted(available))}; `anychip devices` says why)"
        )
    names = args.models.split(",") if args.models else None
    if args.fresh:
        _fresh(names, sets, args.settle, args.runs, args.repeat)
        return
    print(
        f"{'model':<14} {'devices':<12} {'ms':>9} {'vs best single':>14} {'copies':>6} "
        f"{'bytes/run':>10}  nodes"
    )
    worst = 0.0
    for mname, (model, shapes) in _models(names).items():
        sessions = _sessions(model, available, sets)
        feeds = _feeds(next(iter(sessions.values())), shapes)
        times = _timed_rounds(mname, sessions, feeds, args.rounds, args.runs, clock)
        med = {k: statistics.median(v) for k, v in times.items()}
        for key, sess in sessions.items():
            if key.endswith("alone"):
                continue
            # The fastest single device of this set (a cpu-only set cannot use the NPU).
            single = min(
                t for k, t in med.items() if k.endswith("alone") and k.split()[0] in key.split(",")
            )
            rep = sess.placement()
            ratio = med[key] / single
            worst = max(worst, ratio)
            took = re.search(r"re-placed to [^:]*", rep.decision)
            took = took.group(0) if took else ""
            if sess.feedback is not None and not sess.feedback.done:
                took += " (feedback undecided: trials ran in the rounds)"
            print(
                f"{mname:<14} {key:<12} {med[key] * 1e3:9.2f} {ratio:14.2f} "
                f"{rep.copy_count:>6} {rep.copy_bytes:>10}  {rep.by_device()} {took}"
            )
        alone = ", ".join(f"{k} {t * 1e3:.2f} ms" for k, t in med.items() if k.endswith("alone"))
        print(f"{'':<14} single devices: {alone}")
    print(f"worst ratio to the fastest single device: {worst:.2f}")


if __name__ == "__main__":
    with bars():
        main()
