"""The conformance kit on ``opencl`` in strict mode: every ONNX node case of the ops the models
use runs on the device and passes (the whole kit, 406 cases in about 35 s on PoCL, is marked
slow: `pytest -m slow tests/backends/opencl`, or `anychip conformance --device opencl --strict`).
"""

from __future__ import annotations

import pytest

from anychip.conformance import run_kit
from anychip.conformance.report import PASS_ON_DEVICE

pytestmark = pytest.mark.usefixtures("cl_device")

#: the ops of the light ResNet-50 and the transformer layers, and the kit's contract checks
MODEL_OPS = [
    "Conv", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Sum",
    "Add", "Mul", "Div", "Erf", "Softmax", "LayerNormalization", "Transpose", "Reshape",
    "Flatten",
]  # fmt: skip


def _assert_clean(report) -> None:
    bad = [c for c in report.results if c.status != PASS_ON_DEVICE]
    assert not bad, "\n".join(f"{c.status} {c.case}: {c.detail}" for c in bad[:10])
    assert report.ok


def test_kit_strict_on_model_ops():
    report = run_kit("opencl", strict=True, ops=MODEL_OPS)
    assert len(report.results) > 60
    _assert_clean(report)


@pytest.mark.slow
def test_kit_strict_everything_claimed():
    _assert_clean(run_kit("opencl", strict=True))
