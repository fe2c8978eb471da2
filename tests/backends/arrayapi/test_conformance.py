"""The conformance kit in strict mode on the test-only ``strict`` device (array-api-strict):
every ONNX node case of every op the family claims runs on the device and passes, and the
hooks' contract holds (copies byte for byte, memory back to where it started). The whole kit
takes about 15 s here (520 cases); the model ops' subset runs in the default selection.
"""

from __future__ import annotations

import pytest

from anychip.conformance import run_kit
from anychip.conformance.report import PASS_ON_DEVICE

pytestmark = pytest.mark.usefixtures("strict")

MODEL_OPS = [
    "Conv", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Sum",
    "Add", "Mul", "Div", "Erf", "Gelu", "Softmax", "LayerNormalization", "BatchNormalization",
    "Transpose", "Reshape", "Flatten", "Gather", "Slice", "Concat", "Unsqueeze", "Where", "Cast",
    "Attention",
]  # fmt: skip


def _assert_clean(report) -> None:
    bad = [c for c in report.results if c.status != PASS_ON_DEVICE]
    assert not bad, "\n".join(f"{c.status} {c.case}: {c.detail}" for c in bad[:10])
    assert report.ok


def test_kit_strict_on_model_ops():
    report = run_kit("strict", strict=True, ops=MODEL_OPS)
    assert len(report.results) > 100
    _assert_clean(report)


@pytest.mark.slow
def test_kit_strict_everything_claimed():
    _assert_clean(run_kit("strict", strict=True))
