"""The conformance kit on ``openvino:cpu`` in strict mode: every ONNX node case of the ops the
models use runs on OpenVINO or is refused by a declared constraint, and passes (the whole kit,
about 950 cases in a minute, is marked slow: ``pytest -m slow tests/backends/openvino``, or
``anychip conformance --device openvino:cpu --strict``)."""

from __future__ import annotations

import pytest

from anychip.conformance import run_kit
from anychip.conformance.report import FAIL, PASS_ON_DEVICE, PASS_VIA_FALLBACK
from tests.backends.openvino.conftest import DEVICE

pytestmark = pytest.mark.usefixtures("ov_cpu")

#: the ops of the CNN and transformer tests, a constrained op of each kind, and QDQ
MODEL_OPS = [
    "Conv", "MatMul", "Gemm", "MaxPool", "AveragePool", "GlobalAveragePool", "Relu", "Add",
    "Mul", "Div", "Erf", "Softmax", "LayerNormalization", "Transpose", "Reshape", "Flatten",
    "Gather", "Resize", "Attention", "LSTM", "QuantizeLinear", "DequantizeLinear", "Cast",
]  # fmt: skip


def _assert_clean(report) -> None:
    bad = [c for c in report.results if c.status in (FAIL, PASS_VIA_FALLBACK) or c.failed(True)]
    assert not bad, "\n".join(f"{c.status} {c.case}: {c.detail}" for c in bad[:10])
    assert report.ok, str(report)[-2000:]


def test_kit_strict_on_model_ops():
    report = run_kit(DEVICE, strict=True, ops=MODEL_OPS)
    counts = report.counts()
    assert counts[PASS_ON_DEVICE] > 150, counts
    _assert_clean(report)


@pytest.mark.slow
def test_kit_strict_everything_claimed():
    report = run_kit(DEVICE, strict=True)
    assert report.counts()[PASS_ON_DEVICE] > 600
    _assert_clean(report)
