"""The CPU bench models on several engines alone and together, one interleaved run.

By default ``ort:cpu`` and ``cpu``; ``--devices openvino:cpu,ort:cpu,cpu`` puts three engines
side by side (each alone, and the three as one session's device set).

Each model of ``bench/cpu_models.py`` is loaded four ways: anychip on ``ort:cpu`` alone
(onnxruntime's CPU provider; ``cost_model=False`` so every node it claims stays on it), on
``cpu`` alone, on ``ort:cpu,cpu`` (the cost model and the run-time feedback choose per
partition), and onnxruntime's own session on the whole model (the reference for the outputs,
and what anychip's session adds around the provider). The untimed warm-up rounds, as many as
``anychip bench``'s, let the mixed set's feedback measure its trials and settle, and the cpu's
thread choice. Then every round runs the engines in a fresh random order, each once untimed
and once timed; the medians are reported, with the mixed set's ratio to its best single engine
(at most 1.05 is the issue's bar) and where it placed the nodes.

    python bench/ort_engines.py [--runs 15] [--warmup 40] [--models a,b] [--json FILE]
                                [--devices openvino:cpu,ort:cpu,cpu]

Prints ``lscpu``'s model name first: the figures belong to that machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

__all__ = ["ENGINES", "bench", "main"]

Runner = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
#: The default engines: each alone, then together; "onnxruntime" is the reference.
DEVICES = ("ort:cpu", "cpu")
ENGINES = (*DEVICES, ",".join(DEVICES), "onnxruntime")


def cpu_model() -> str:
    """``lscpu | grep 'Model name'``, or the platform's answer where lscpu is missing."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        if line.startswith("Model name"):
            return line.split(":", 1)[1].strip()
    import platform

    return platform.processor() or "unknown"


def _engines(
    model: Any, devices: tuple[str, ...] = DEVICES
) -> tuple[dict[str, Runner], dict[str, Any]]:
    import onnxruntime as ort

    import anychip

    # a vendor engine alone keeps every node it claims (no cost model); the CPU as it runs
    sessions = {}
    for d in devices:
        try:
            sessions[d] = anychip.load(model, devices=[d], cost_model=d == "cpu", strict=d != "cpu")
        except anychip.AnychipError as e:  # an engine that cannot run the whole model alone
            print(f"  {d} alone: {' '.join(str(e).split())[:160]}", flush=True)
    sessions[",".join(devices)] = anychip.load(model, devices=list(devices))
    runners: dict[str, Runner] = {
        k: (lambda feeds, s=s: s.run(None, feeds)) for k, s in sessions.items()
    }
    so = ort.SessionOptions()
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    raw = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runners["onnxruntime"] = lambda feeds: raw.run(None, feeds)
    return runners, sessions


def _max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        if x.shape != y.shape:
            return math.nan
        if x.size:
            worst = max(worst, float(np.max(np.abs(x - y))))
    return worst


def bench(name: str, runs: int, warmup: int, devices: tuple[str, ...] = DEVICES) -> dict[str, Any]:
    """One model: medians (ms) per engine, the mixed set's ratio and placement."""
    from anychip.core.api.feeds import random_feeds
    from bench.cpu_models import build

    model, feeds = build(name)
    runners, sessions = _engines(model, devices)
    mixed = ",".join(devices)
    if feeds is None:
        feeds = random_feeds(sessions[mixed], 0)
    outputs = {k: r(feeds) for k, r in runners.items()}
    for _ in range(warmup):  # the mixed set's feedback measures and settles here
        for r in runners.values():
            r(feeds)
    times: dict[str, list[float]] = {k: [] for k in runners}
    for i in range(runs):
        for k in random.Random(i).sample(list(runners), len(runners)):
            runners[k](feeds)  # untimed: what the engine before left running settles here
            t0 = time.perf_counter()
            runners[k](feeds)
            times[k].append(time.perf_counter() - t0)
    ms = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    best = min((d for d in devices if d in ms), key=lambda k: ms[k])
    return {
        "model": name,
        "devices": list(devices),
        "ms": ms,
        "best_single": best,
        "mixed_ratio": ms[mixed] / ms[best],
        "placed": {k: s.placement().by_device() for k, s in sessions.items()},
        "max_abs_diff": {
            k: _max_diff(outputs[k], outputs["onnxruntime"]) for k in (*devices, mixed) if k in ms
        },
    }


def _placed(counts: dict[str, int]) -> str:
    return " ".join(f"{d}={n}" for d, n in sorted(counts.items(), key=lambda t: -t[1]))


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of ``bench`` rows, with the geometric means."""
    devices = rows[0].get("devices", list(DEVICES)) if rows else list(DEVICES)
    mixed = ",".join(devices)
    cols = [*devices, mixed, "onnxruntime"]
    lines = [
        "| model | " + " | ".join(cols) + " | mixed / best | mixed placed |",
        "|---|" + "---:|" * (len(cols) + 1) + "---|",
    ]
    for r in rows:
        ms = r["ms"]
        lines.append(
            f"| {r['model']} | " + " | ".join(f"{ms[c]:.2f}" if c in ms else "-" for c in cols)
            + f" | {r['mixed_ratio']:.3f} ({r['best_single']}) | {_placed(r['placed'][mixed])} |"
        )  # fmt: skip
    geo = math.exp(statistics.fmean(math.log(r["mixed_ratio"]) for r in rows))
    worst = max(rows, key=lambda r: r["mixed_ratio"])
    lines.append("")
    lines.append(
        f"mixed / best single engine: geomean {geo:.3f}, worst {worst['mixed_ratio']:.3f} "
        f"({worst['model']}); {sum(r['mixed_ratio'] <= 1.05 for r in rows)}/{len(rows)} "
        "within 1.05"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from anychip.cli.bench import WARMUP
    from bench.cpu_models import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of names")
    ap.add_argument("--runs", type=int, default=15, help="interleaved rounds (medians)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=WARMUP,
        help="untimed rounds first: past the cpu's thread choice and the mixed set's feedback",
    )
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--devices",
        default=",".join(DEVICES),
        help="the engines, each alone and all together (e.g. openvino:cpu,ort:cpu,cpu)",
    )
    args = ap.parse_args(argv)
    devices = tuple(d.strip() for d in args.devices.split(",") if d.strip())
    names = [m for m in args.models.split(",") if m]
    print(f"Model name: {cpu_model()}; {os.cpu_count()} logical CPUs", flush=True)
    rows = []
    for name in names:
        rows.append(bench(name, args.runs, args.warmup, devices))
        r = rows[-1]
        print(f"{name}: mixed/best {r['mixed_ratio']:.3f}, ms {r['ms']}", flush=True)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
