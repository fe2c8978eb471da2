"""Sessions the viz tests draw: the light ResNet-50 and a transformer layer on ``npu,cpu``
(each entirely on the NPU, as placement decides), and the transformer on ``xpu,cpu`` without
the cost model (LayerNormalization falls back to the CPU: four partitions, copies between)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import anychip
from tests.models import light, transformer_layer

CASES = {
    "resnet50-npu": (lambda: light("resnet50", seed=0), ["npu", "cpu"], {}),
    "transformer-npu": (lambda: transformer_layer(), ["npu", "cpu"], {}),
    "transformer-xpu": (
        lambda: transformer_layer(ln_mean=True),
        ["xpu", "cpu"],
        {"cost_model": False},
    ),
}


@pytest.fixture(scope="package", params=sorted(CASES))
def session(request: pytest.FixtureRequest) -> Iterator[Any]:
    make, devices, options = CASES[request.param]
    sess = anychip.load(make(), devices=devices, **options)
    yield sess
    sess.close()


@pytest.fixture(scope="package")
def mixed() -> Iterator[Any]:
    """The transformer on ``xpu,cpu`` with fallbacks and copies between partitions."""
    make, devices, options = CASES["transformer-xpu"]
    sess = anychip.load(make(), devices=devices, **options)
    yield sess
    sess.close()
