"""``anychip conformance --device ort:cpu --strict``: every onnx node case of an op onnxruntime's
CPU provider claims runs on it, or is refused by a constraint it declares; none falls back
otherwise, fails or crashes."""

from __future__ import annotations

from anychip.conformance import (
    CRASH,
    FAIL,
    PASS_ON_DEVICE,
    PASS_VIA_FALLBACK,
    REFUSED_AS_DECLARED,
    run_kit,
)


def test_the_kit_passes_strict_on_ort_cpu() -> None:
    report = run_kit("ort:cpu", strict=True)
    counts = report.counts()
    assert report.ok, str(report)
    assert counts[FAIL] == counts[CRASH] == counts[PASS_VIA_FALLBACK] == 0
    # onnxruntime 1.32 with onnx 1.23: 1,125 on the device, 57 refused as declared
    assert counts[PASS_ON_DEVICE] > 1000 and counts[REFUSED_AS_DECLARED] < 100, counts
    assert all(c.ok for c in report.contract), report.contract
