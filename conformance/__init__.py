"""The backend author's conformance kit: which ONNX ops really run on your chip.

    from anychip.conformance import run_kit
    report = run_kit("mychip", strict=True)     # or: anychip conformance --device mychip
    print(report)                               # counts, table by op, failures, verdict
    assert report.ok

It runs every bundled ONNX node case (from the installed onnx package) with a node the device
claims, labels each PASS-ON-DEVICE, REFUSED-AS-DECLARED (refused by a constraint the device
declared on its claim), PASS-VIA-FALLBACK, FAIL (with the largest error) or CRASH
(``kit.py``), and checks the hooks' contract: byte-exact copies of every claimed dtype in odd
shapes, memory that returns to where it started, claims backed by kernels (``contract.py``).
``--strict`` makes any fallback of a claimed op a failure. The pytest plugin
(``pytest --anychip-device=mychip``) runs the same checks as test items.
"""

from anychip.conformance.kit import run_kit
from anychip.conformance.report import (
    CRASH,
    FAIL,
    PASS_ON_DEVICE,
    PASS_VIA_FALLBACK,
    REFUSED_AS_DECLARED,
    SKIP,
    CaseResult,
    ContractResult,
    KitReport,
)
from anychip.core.plugin.claims import OpClaim, claims_of

__all__ = [
    "run_kit",
    "KitReport",
    "CaseResult",
    "ContractResult",
    "OpClaim",
    "claims_of",
    "PASS_ON_DEVICE",
    "PASS_VIA_FALLBACK",
    "REFUSED_AS_DECLARED",
    "FAIL",
    "CRASH",
    "SKIP",
]
