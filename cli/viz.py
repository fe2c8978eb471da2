"""The bodies of the ``anychip`` subcommands that show things: ``partition`` (its pictures),
``inspect``, and ``run --profile`` / ``run --json``. ``cli/main.py`` declares the arguments and
calls these."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from anychip.viz.terminal import render

__all__ = [
    "add_arguments",
    "add_json",
    "emit_json",
    "partition",
    "inspect",
    "run_extras",
    "say",
]


def say(args: argparse.Namespace, text: str) -> None:
    """A note for people (stderr; not with ``--quiet``): stdout stays the result."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def add_json(p: Any, what: str) -> None:
    """The one ``--json [FILE]`` of every command: alone, ``what`` as JSON on stdout instead of
    the text; with FILE, written there and the text printed as usual."""
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help=f"{what} as JSON: on stdout instead of the text, or written to FILE",
    )


def emit_json(args: argparse.Namespace, data: Any) -> bool:
    """Write ``data`` where ``--json`` says; True when it went to stdout (no text then)."""
    dest = getattr(args, "json", None)
    if not dest:
        return False
    if dest == "-":
        print(json.dumps(data, indent=1))
        return True
    with open(dest, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    say(args, f"wrote {dest}")
    return False


def add_arguments(sub: Any, run: Any, part: Any) -> None:
    """``partition -o``, ``run --profile/--json``, ``inspect``, and ``--quiet`` on each."""
    part.add_argument(
        "-o",
        "--output",
        action="append",
        metavar="FILE",
        help="also draw the placement: .html (self-contained), .svg (Graphviz) or .dot "
        "(repeatable)",
    )
    run.add_argument(
        "--profile",
        metavar="FILE.html",
        help="time each node and copy; write an HTML timeline and a Perfetto trace (.json)",
    )
    add_json(run, "outputs and times")
    ins = sub.add_parser("inspect", help="opsets, inputs, ops, parameters, FLOPs, device support")
    ins.add_argument("model")
    ins.add_argument("--devices", default=None, help="comma list (default: every registered)")
    add_json(ins, "the summary")
    ins.add_argument(
        "--shape",
        action="append",
        metavar="NAME=[1,128]",
        help="an input's shape for its symbolic dimensions, or DIM=128 (repeatable)",
    )
    for p in (run, part, ins):
        p.add_argument("-q", "--quiet", action="store_true", help="no progress, no warnings")


def partition(args: argparse.Namespace, sess: Any) -> int:
    """Print the placement (table, or JSON), and draw it to each ``-o`` file."""
    from anychip.viz import save_placement

    for out in args.output or []:
        path = save_placement(sess, out)
        say(args, f"wrote {path}")
    report = sess.placement()
    if not emit_json(args, report.to_dict()) and (not args.quiet or not args.output):
        render(report)
    return 0


def inspect(args: argparse.Namespace) -> int:
    from anychip.cli.main import free_dims
    from anychip.viz.inspect import inspect_model

    devices = [d.strip() for d in args.devices.split(",")] if args.devices else None
    dims = free_dims(args.model, args.shape) if args.shape else None
    summary = inspect_model(args.model, devices, dims)
    if not emit_json(args, summary.to_dict()):
        render(summary)
    return 0


def run_extras(
    args: argparse.Namespace,
    sess: Any,
    feeds: dict,
    outs: list,
    times: list,
    phases: dict | None = None,
) -> bool:
    """``--json`` (print the result as JSON instead of text; True when it did; ``phases``:
    the first run, runs 2-10 and the steady time; ``times``: every run, the first included) and
    ``--profile``."""
    if args.profile:
        path = Path(args.profile)
        prof = sess.profile(feeds, runs=max(1, args.repeat))
        html = prof.save_html(path.with_suffix(".html"))
        trace = prof.save_trace(path.with_suffix(".json"))
        say(args, f"wrote {html} (timeline) and {trace} (Perfetto trace: ui.perfetto.dev)")
    if not args.json:
        return False
    from anychip.cli.main import _checksum

    result = {
        "devices": list(sess.devices),
        "outputs": [
            {
                "name": info.name,
                "dtype": str(np.asarray(out).dtype),
                "shape": list(np.shape(out)),
                "checksum": _checksum(out),
            }
            for info, out in zip(sess.outputs, outs)
        ],
        **run_stats(times),
        **(phases or {}),
        "runs": (phases or {}).get("steady_runs", len(times)),
        "device_failures": sess.placement().failures(),
    }
    if args.placement:
        result["placement"] = sess.placement().to_dict()
    return emit_json(args, result)


def run_stats(times: list[float]) -> dict[str, float]:
    """``anychip run``'s figures, in ms (onnxruntime_perf_test's and benchmark_app's): the
    first run, the mean of runs 2-10, the best, p50/p90/p99 of the runs after the first, and
    the throughput (runs per second over those runs)."""
    rest = times[1:] or times
    ms = np.asarray(rest) * 1e3
    return {
        "first_ms": times[0] * 1e3,
        "mean_2_10_ms": float(np.mean(ms[:9])),
        "best_ms": float(ms.min()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p90_ms": float(np.percentile(ms, 90)),
        "p99_ms": float(np.percentile(ms, 99)),
        "throughput_per_s": len(rest) / float(np.sum(rest)),
    }
