"""The conformance kit in strict mode on the test-only ``strict`` device (array-api-strict):
every ONNX node case of every op the family claims runs on the device and passes, and the
hooks' contract holds (copies byte for byte, memory back to where it started). The whole kit,
626 cases with its derived forms, runs in the default selection
(``pytest tests/backends/arrayapi/test_conformance.py -s`` prints the figures).
"""

from __future__ import annotations

import pytest

from anychip.conformance import run_kit
from anychip.conformance.report import PASS_ON_DEVICE

pytestmark = pytest.mark.usefixtures("strict")

#: ops the CNN and transformer exports need; each must have cases on the device (Cast has
#: none: every ONNX Cast case involves a type the standard lacks; test_models covers it)
MODEL_OPS = {
    "Conv", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Sum",
    "Add", "Mul", "Div", "Erf", "Gelu", "Softmax", "LayerNormalization", "BatchNormalization",
    "Transpose", "Reshape", "Flatten", "Gather", "Slice", "Concat", "Unsqueeze", "Where",
    "Attention",
}  # fmt: skip


def test_kit_strict_everything_claimed():
    report = run_kit("strict", strict=True)
    print(str(report).splitlines()[0])  # the figures, with -s
    bad = [c for c in report.results if c.status != PASS_ON_DEVICE]
    assert not bad, "\n".join(f"{c.status} {c.case}: {c.detail}" for c in bad[:10])
    assert report.ok and len(report.results) >= 620
    assert MODEL_OPS <= {c.op for c in report.results}
