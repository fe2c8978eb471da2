"""``anychip conformance --device X [--strict] [--ops A,B] [--json F] [--bring-up]``: the kit
on the command line. Exit status 0 when the verdict is PASS, 1 when it is FAIL, 2 on a usage
error."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

__all__ = ["add_parser", "command"]


def add_parser(sub: Any) -> None:
    """Add the ``conformance`` subcommand to the ``anychip`` parser's subparsers."""
    p = sub.add_parser(
        "conformance",
        help="run the ONNX node cases a device claims: on the device, via fallback, or failing",
    )
    p.add_argument("--device", required=True, help="a registered device, e.g. xpu or toychip")
    p.add_argument("--strict", action="store_true", help="a fallback of a claimed op fails")
    p.add_argument("--ops", default=None, help="comma list of op types to run, e.g. Add,Relu")
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="the full report as JSON: on stdout instead of the summary, or written to FILE",
    )
    p.add_argument("--no-contract", action="store_true", help="skip the hook contract checks")
    p.add_argument(
        "--bring-up",
        action="store_true",
        help="each device node also compared with the CPU's kernel on the same inputs",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress line")


def command(args: argparse.Namespace) -> int:
    """Run the kit; print the summary; 0 on PASS, 1 on FAIL."""
    from anychip.conformance import run_kit

    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    tty = sys.stderr.isatty() and not args.quiet

    def progress(done: int, total: int, result: Any) -> None:
        if tty:
            print(
                f"\r[{done}/{total}] {result.status:<17} {result.case[:50]:<50}",
                end="",
                file=sys.stderr,
            )
        elif not args.quiet and (done % 100 == 0 or done == total):
            print(f"[{done}/{total}] cases run", file=sys.stderr)

    from anychip.viz.terminal import kit_progress

    with kit_progress(args.quiet) as bar:  # rich's bar in a terminal with rich installed
        tty = tty and bar is None
        report = run_kit(
            args.device,
            strict=args.strict,
            ops=ops,
            contract=not args.no_contract,
            progress=bar or progress,
            bring_up=args.bring_up,
        )
    if tty:
        print("\r" + " " * 80 + "\r", end="", file=sys.stderr)
    if args.json == "-":
        print(json.dumps(report.to_json(), indent=1))
        return 0 if report.ok else 1
    print(report)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=1)
        print(f"report written to {args.json}")
    return 0 if report.ok else 1
