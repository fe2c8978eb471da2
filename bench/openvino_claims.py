"""Measure what ``openvino:cpu`` should claim: the conformance kit with every ONNX op claimed
and no per-op constraint, then the tables of ``backends/openvino/claims.py`` as this OpenVINO
computes them. Run it after an OpenVINO upgrade and edit ``claims.py`` and
``constraints.py`` from what it prints.

    python bench/openvino_claims.py [--json kit.json] [--ops A,B]

Prints the ops with a case that ran on OpenVINO and passed (``MEASURED``), the ops whose
cases failed or crashed on OpenVINO (with each case and its error: a constraint to declare,
or an op for ``LEFT_OUT``), and the reasons claimed ops fell back (no conversion rule, a
refusal by ``Core.query_model``). The int64 and tensors-only constraints stay on: they are
about anychip's values, not about one op.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

__all__ = ["main"]


def claim_everything() -> None:
    """Every ONNX op claimed, no op left out, no per-op constraint."""
    import onnx.defs

    from anychip.backends.openvino import claims, constraints

    claims.MEASURED = frozenset(
        s.name for s in onnx.defs.get_all_schemas_with_history() if s.domain in claims.DOMAINS
    )
    claims.LEFT_OUT = {}
    constraints.BY_OP = {}
    claims.op_claims.cache_clear()
    claims.claims_by_op.cache_clear()


def main(argv: list[str] | None = None) -> None:
    from anychip.conformance import run_kit
    from anychip.conformance.report import CRASH, FAIL, PASS_ON_DEVICE, PASS_VIA_FALLBACK

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, metavar="FILE")
    ap.add_argument("--ops", default=None, help="comma list of ops (default: every one)")
    args = ap.parse_args(argv)
    os.environ.setdefault("ANYCHIP_COMPILE_CACHE", "0")
    os.environ.setdefault("ANYCHIP_CALIBRATION", "off")
    claim_everything()
    ops = args.ops.split(",") if args.ops else None
    report = run_kit("openvino:cpu", ops=ops, contract=False)
    by_op: dict[str, set[str]] = defaultdict(set)
    for r in report.results:
        by_op[r.op].add(r.status)
    measured = sorted(op for op, s in by_op.items() if PASS_ON_DEVICE in s)
    print(f"counts: {report.counts()}")
    print(f"\nMEASURED ({len(measured)}):\n  " + " ".join(measured))
    print("\nfailed or crashed on OpenVINO (declare a constraint, or leave the op out):")
    for r in report.results:
        if r.status in (FAIL, CRASH):
            print(f"  {r.status} {r.case} ({r.op}): {r.detail[:200]}")
    print("\nfell back (no conversion, or refused by query_model):")
    reasons: dict[str, list[str]] = defaultdict(list)
    for r in report.results:
        if r.status == PASS_VIA_FALLBACK:
            reasons[f"{r.op}: {r.detail[:160]}"].append(r.case)
    for why, cases in sorted(reasons.items()):
        print(f"  {len(cases)} x {why}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report.to_json(), f, indent=1)


if __name__ == "__main__":
    main()
