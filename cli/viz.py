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

__all__ = ["add_arguments", "partition", "inspect", "run_extras", "say"]


def say(args: argparse.Namespace, text: str) -> None:
    """A note for people (stderr; not with ``--quiet``): stdout stays the result."""
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


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
    run.add_argument("--json", action="store_true", help="outputs and time as JSON")
    ins = sub.add_parser("inspect", help="opsets, inputs, ops, parameters, FLOPs, device support")
    ins.add_argument("model")
    ins.add_argument("--devices", default=None, help="comma list (default: every registered)")
    ins.add_argument("--json", action="store_true", help="as JSON")
    for p in (run, part, ins):
        p.add_argument("-q", "--quiet", action="store_true", help="no progress, no warnings")


def partition(args: argparse.Namespace, sess: Any) -> int:
    """Print the placement (table, or JSON), and draw it to each ``-o`` file."""
    from anychip.viz import save_placement

    for out in args.output or []:
        path = save_placement(sess, out)
        say(args, f"wrote {path}")
    report = sess.placement()
    if args.json:
        print(json.dumps(report.to_dict(), indent=1))
    elif not args.quiet or not args.output:
        render(report)
    return 0


def inspect(args: argparse.Namespace) -> int:
    from anychip.viz.inspect import inspect_model

    devices = [d.strip() for d in args.devices.split(",")] if args.devices else None
    summary = inspect_model(args.model, devices)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1))
    else:
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
    the first run, runs 2-10 and the steady time) and ``--profile``."""
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
        "best_ms": min(times) * 1e3,
        "runs": len(times),
        **(phases or {}),
        "device_failures": sess.placement().failures(),
    }
    if args.placement:
        result["placement"] = sess.placement().to_dict()
    print(json.dumps(result, indent=1))
    return True
