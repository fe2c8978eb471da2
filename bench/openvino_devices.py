"""OpenVINO's CPU as an anychip device: the CPU bench models (``bench/cpu_models.py``) on
``openvino:cpu``, on ``cpu``, and on the two together, one interleaved run, with each
engine's median, the mixed placement's ratio to the best single engine, and OpenVINO and
onnxruntime run directly (f32, every graph optimization) for reference.

    python bench/openvino_devices.py [--models a,b] [--runs 20] [--warmup 40] [--threads N]
                                     [--cpu-time] [--json F]

(Not ``bench/openvino.py``: run as a script, that name would shadow the ``openvino`` package.)

Engines (every one loads the same ONNX file):

* ``openvino:cpu``: ``devices=["openvino:cpu", "cpu"]`` with the cost model off, so every
  node OpenVINO takes runs there (the nodes it refuses, listed per model, stay on the CPU);
* ``cpu``: anychip's CPU backend alone;
* ``mixed``: ``devices=["openvino:cpu", "cpu"]`` with the cost model on (measured costs:
  calibration as by default), which places each partition where it measures faster;
* ``ov-direct`` and ``onnxruntime``: the peers of ``anychip bench`` (OpenVINO at f32);
* with ``--bf16``, ``openvino:cpu bf16``: as ``openvino:cpu`` at precision bf16 (opted in),
  with its largest difference from onnxruntime beside f32's.

``mixed/best`` is the mixed placement's median over the faster of ``openvino:cpu`` and
``cpu``: at most 1.05 is the target (a device added never makes a model slower), below 1 a
mixed placement that beats both. Timing as ``anychip bench`` (``cli/bench.py``): every
engine's timed run after an untimed one of its own, in a new seeded order each round.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from typing import Any

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

__all__ = ["main", "bench"]

SINGLE = ("openvino:cpu", "cpu")
BF16 = "openvino:cpu bf16"


def cpu_model() -> str:
    """``lscpu``'s model name (the platform's processor where lscpu is missing)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _engines(path: str, threads: int | None, bf16: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    import anychip
    from anychip.cli.bench import _onnxruntime, _openvino

    options = {"openvino:cpu": {"threads": threads}} if threads else None
    sessions = {
        "openvino:cpu": anychip.load(
            path, devices=["openvino:cpu", "cpu"], cost_model=False, device_options=options
        ),
        "cpu": anychip.load(path, devices=["cpu"]),
        "anychip": anychip.load(path, devices=["openvino:cpu", "cpu"], device_options=options),
    }
    if bf16:
        opted = {"openvino:cpu": {"precision": "bf16", **({"threads": threads} if threads else {})}}
        sessions[BF16] = anychip.load(
            path, devices=["openvino:cpu", "cpu"], cost_model=False, device_options=opted
        )
    engines = {k: (lambda feeds, s=s: s.run(None, feeds)) for k, s in sessions.items()}
    engines["ov-direct"] = _openvino(path, threads)
    engines["onnxruntime"] = _onnxruntime(path, threads)
    return engines, sessions


def _placed(sess: Any) -> str:
    counts = sess.placement().by_device()
    return ", ".join(f"{d} {n}" for d, n in sorted(counts.items()))


def bench(
    names: list[str],
    runs: int,
    warmup: int,
    threads: int | None,
    cpu_time: bool = False,
    bf16: bool = False,
) -> dict[str, Any]:
    """Time every model on every engine; a JSON-ready dict."""
    from anychip.cli.bench import _max_diff, _thread_limit, _time_model, geomean
    from bench.cpu_models import build

    rows = []
    with _thread_limit(threads), tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            model, feeds = build(name)
            path = os.path.join(tmp, f"{name}.onnx")
            with open(path, "wb") as f:
                f.write(model.SerializeToString())
            engines, sessions = _engines(path, threads, bf16)
            timed = _time_model(engines, feeds, runs, warmup, cpu_time)
            if bf16:  # bf16's error against onnxruntime at f32, beside openvino:cpu's at f32
                ref = engines["onnxruntime"](feeds)
                timed["max_abs_diff"][BF16] = _max_diff(engines[BF16](feeds), ref)
                timed["max_abs_diff"]["openvino:cpu"] = _max_diff(
                    engines["openvino:cpu"](feeds), ref
                )
            ms = timed["ms"]
            best = min(ms[k] for k in SINGLE)
            row = {
                "model": name,
                "ms": {("mixed" if k == "anychip" else k): v for k, v in ms.items()},
                "mixed/best": ms["anychip"] / best,
                "max_abs_diff_vs_onnxruntime": timed["max_abs_diff"]["onnxruntime"],
                "diff_vs_onnxruntime": timed["max_abs_diff"],
                "placed": {
                    ("mixed" if k == "anychip" else k): _placed(s)
                    for k, s in sessions.items()
                    if k != "cpu"
                },
            }
            rows.append(row)
            print(
                f"[{i + 1}/{len(names)}] {name}: mixed/best {row['mixed/best']:.2f}",
                file=sys.stderr,
            )
    ratios = {
        "mixed/best": geomean([r["mixed/best"] for r in rows]),
        "openvino:cpu/cpu": geomean([r["ms"]["openvino:cpu"] / r["ms"]["cpu"] for r in rows]),
        "openvino:cpu/ov-direct": geomean(
            [r["ms"]["openvino:cpu"] / r["ms"]["ov-direct"] for r in rows]
        ),
    }
    return {
        "cpu_model": cpu_model(),
        "threads": threads,
        "clock": "process CPU time" if cpu_time else "wall",
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "runs": runs,
        "warmup": warmup,
        "models": rows,
        "geomean": ratios,
    }


def format_table(result: dict[str, Any]) -> str:
    cols = ["openvino:cpu", "cpu", "mixed", "ov-direct", "onnxruntime"]
    if result["models"] and BF16 in result["models"][0]["ms"]:
        cols.append(BF16)
    head = ["model"] + [f"{c} ms" for c in cols] + ["mixed/best", "max|diff| vs ort"]
    body = [
        [r["model"]]
        + [f"{r['ms'][c]:.2f}" for c in cols]
        + [f"{r['mixed/best']:.2f}", f"{r['max_abs_diff_vs_onnxruntime']:.1e}"]
        for r in result["models"]
    ]
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    lines = [
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
        for row in [head] + body
    ]
    geo = ", ".join(f"{k} {v:.2f}" for k, v in result["geomean"].items())
    lines.append(f"geomean: {geo}")
    if BF16 in cols:
        for r in result["models"]:
            d = r["diff_vs_onnxruntime"]
            lines.append(
                f"  {r['model']}: max|diff| vs onnxruntime: openvino:cpu f32 "
                f"{d['openvino:cpu']:.1e}, bf16 {d[BF16]:.1e}"
            )
    lines.append(
        f"CPU: {result['cpu_model']}; threads: {result['threads'] or 'default'}; medians of "
        f"{result['runs']} interleaved rounds ({result['clock']} clock) after "
        f"{result['warmup']} warm-up runs each; load average {result['load_average']:.1f}"
    )
    for r in result["models"]:
        placed = "; ".join(f"{k}: {v}" for k, v in r["placed"].items())
        lines.append(f"  {r['model']}: {placed}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from bench.cpu_models import MODELS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=40)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--cpu-time", action="store_true", help="process CPU time, not wall clock")
    ap.add_argument("--bf16", action="store_true", help="also openvino:cpu at precision bf16")
    ap.add_argument("--json", default=None, metavar="FILE")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; choose from {', '.join(MODELS)}")
    result = bench(names, args.runs, args.warmup, args.threads, args.cpu_time, args.bf16)
    print(format_table(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
