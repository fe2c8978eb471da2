"""The conformance kit in strict mode on ``iree-cpu`` and ``vulkan``, on a bounded set of
ops (each case costs IREE compiles: a node probe and the partition): every case runs on the
device or is refused by the declared measured constraint with IREE's reason, and passes.
The whole kit is ``anychip conformance --device vulkan --strict`` (slow tier)."""

from __future__ import annotations

import os

import pytest

from anychip.conformance import run_kit
from anychip.conformance.report import FAIL, PASS_ON_DEVICE, PASS_VIA_FALLBACK
from tests.backends.iree.conftest import backend_or_skip

OPS = ["Relu", "Sigmoid", "MatMul", "Softmax", "Transpose"]


def _assert_clean(report) -> None:
    bad = [c for c in report.results if c.status in (FAIL, PASS_VIA_FALLBACK) or c.failed(True)]
    assert not bad, "\n".join(f"{c.status} {c.case}: {c.detail}" for c in bad[:10])
    assert report.ok, str(report)[-2000:]


@pytest.mark.parametrize("name", ["iree-cpu", "vulkan"])
def test_kit_strict_on_a_bounded_op_set(name):
    backend_or_skip(name)
    report = run_kit(name, strict=True, ops=OPS)
    assert report.counts()[PASS_ON_DEVICE] >= 10, report.counts()
    _assert_clean(report)


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("ANYCHIP_IREE_FULL_KIT") != "1",
    reason="the whole kit on an IREE device compiles every claimed node case (over 15 minutes "
    "here): ANYCHIP_IREE_FULL_KIT=1 runs it (docs/decisions/029)",
)
@pytest.mark.parametrize("name", ["iree-cpu", "vulkan"])
def test_kit_strict_everything_claimed(name):
    backend_or_skip(name)
    report = run_kit(name, strict=True)
    _assert_clean(report)
