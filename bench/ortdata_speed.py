"""Speed of anychip against onnxruntime on the passing models of a ``wild_ortdata`` run.

    python bench/ortdata_speed.py ROWS.json [--scratch DIR] [--repeat 20] [--sample N]
                                  [--seed 0] [--only SUBSTR] [--timeout 120] [--json FILE]

Each model runs in its own process (a fresh interpreter: the load is a first load's), fed the
inputs ``wild_ortdata`` scored it with (its first feed onnxruntime accepted). Phases, as in
``wild_corpus.py``: ``load`` (``anychip.load`` against an onnxruntime session with its default
optimizations, both from the file; anychip's includes the modules its first load imports),
``first`` (the first run), ``2-10`` (the median of runs 2 to 10, the two alternating),
``steady`` (the best of ``--repeat`` interleaved runs) and ``reload`` (a second load of the
model in the same process: the per-model cost without first imports). Run it with Python's
bytecode cache on (``PYTHONDONTWRITEBYTECODE`` unset), as an installed package has it. The
table gives each phase's geomean ratio anychip / onnxruntime (below 1: anychip is faster),
over all models and over those onnxruntime runs in under 1 ms, with the worst models.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench.wild_corpus import PHASES, _early_runs, _interleaved
from bench.wild_ortdata import FEED_TRIES, TESTDATA, make_feeds

__all__ = ["time_one", "summary", "main"]

SUB_MS = 1e-3  # onnxruntime's steady time under which a model is "sub-ms"


def time_one(path: str, seed: int = 0, repeat: int = 20) -> dict[str, Any]:
    """The phases of one model, in this process: ``{phase: [anychip_s, onnxruntime_s]}``."""
    import onnx
    import onnxruntime as ort

    model = onnx.load(path, load_external_data=False)
    plain = ort.SessionOptions()
    plain.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain.log_severity_level = 4
    probe = ort.InferenceSession(path, plain, providers=["CPUExecutionProvider"])
    for symbolic, high in FEED_TRIES:  # the feeds wild_ortdata scored the model with
        feeds = make_feeds(model, seed, symbolic, high)
        try:
            probe.run(None, feeds)
            break
        except Exception:
            continue
    del probe
    import anychip

    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sess = anychip.load(path, devices=["cpu"])
    t1 = time.perf_counter()
    sess.run(None, feeds)
    t2 = time.perf_counter()
    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    ref = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    t3 = time.perf_counter()
    ref.run(None, feeds)
    t4 = time.perf_counter()
    ours, theirs = (lambda: sess.run(None, feeds)), (lambda: ref.run(None, feeds))
    phases = {"load": (t1 - t0, t3 - t2), "first": (t2 - t1, t4 - t3)}
    phases["2-10"] = _early_runs(ours, theirs, 9)
    phases["steady"] = _interleaved(ours, theirs, repeat)
    t5 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        anychip.load(path, devices=["cpu"])
    t6 = time.perf_counter()
    ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    phases["reload"] = (t6 - t5, time.perf_counter() - t6)
    return {"phases": {k: list(v) for k, v in phases.items()}}


def _in_subprocess(path: str, seed: int, repeat: int, timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--one", path]
    cmd += ["--seed", str(seed), "--repeat", str(repeat)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    return {"error": (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:100]}


def _geomean(values: list[float]) -> float:
    import math

    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def summary(rows: list[dict[str, Any]]) -> str:
    """The markdown table: per phase, the geomean ratio over all models and sub-ms ones."""
    timed = [r for r in rows if "phases" in r]
    small = [r for r in timed if r["phases"]["steady"][1] < SUB_MS]
    lines = [
        f"{len(timed)} models timed, {len(small)} of them under 1 ms on onnxruntime",
        "",
        "| phase | geomean (all) | geomean (sub-ms) | worst (all) |",
        "|---|---|---|---|",
    ]
    for phase in (*PHASES, "reload"):
        ratios = [r["phases"][phase][0] / r["phases"][phase][1] for r in timed]
        sub = [r["phases"][phase][0] / r["phases"][phase][1] for r in small]
        worst = max(ratios) if ratios else float("nan")
        lines.append(f"| {phase} | {_geomean(ratios):.2f}x | {_geomean(sub):.2f}x | {worst:.1f}x |")
    lines += ["", "| model | load ms (ort) | steady us (ort) | steady ratio |", "|---|---|---|---|"]
    by_ratio = sorted(timed, key=lambda r: -r["phases"]["steady"][0] / r["phases"]["steady"][1])
    for r in by_ratio[:15]:
        p = r["phases"]
        lines.append(
            f"| {r['model']} | {1e3 * p['load'][0]:.0f} ({1e3 * p['load'][1]:.0f}) | "
            f"{1e6 * p['steady'][0]:.0f} ({1e6 * p['steady'][1]:.0f}) | "
            f"{p['steady'][0] / p['steady'][1]:.2f}x |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="?", help="the --json of a wild_ortdata run")
    ap.add_argument("--scratch", default=os.path.join(tempfile.gettempdir(), "wild-ortdata"))
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sample", type=int, default=0, help="a seeded random sample of N models")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="models whose path contains this")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", help="write the timed rows here")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(time_one(args.one, args.seed, args.repeat)))
        return 0
    if not args.rows:
        ap.error("ROWS.json is required")
    with open(args.rows) as f:
        rows = [r for r in json.load(f) if r["status"] == "pass" and args.only in r["model"]]
    if args.sample:
        rows = random.Random(args.seed).sample(rows, min(args.sample, len(rows)))
    timed = []
    for i, row in enumerate(sorted(rows, key=lambda r: r["model"])):
        path = os.path.join(args.scratch, TESTDATA, row["model"])
        got = _in_subprocess(path, args.seed, args.repeat, args.timeout)
        timed.append({"model": row["model"], "class": row.get("class"), **got})
        steady = got.get("phases", {}).get("steady")
        said = f"{steady[0] / steady[1]:.2f}x" if steady else got.get("error", "")
        print(f"[{i + 1}/{len(rows)}] {row['model']} {said}", flush=True)
    text = summary(timed)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(timed, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
