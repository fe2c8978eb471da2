"""Fixtures of the IREE backend tests: ``iree-cpu`` and ``vulkan`` (Mesa's lavapipe in CI).

IREE is in the test extra and ``.ci/run`` installs lavapipe where it runs as root, so in CI
both devices are real and these tests run; elsewhere a missing IREE or Vulkan driver skips
them with the reason.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

DEVICES = ("iree-cpu", "vulkan")


def backend_or_skip(name: str):
    """The backend named ``name``, skipping the test with the reason where unavailable."""
    from anychip.core.plugin.host import get_registry

    backend = get_registry([name]).backends.get(name)
    if backend is None:
        pytest.skip(f"no {name} device registered (the IREE plugin did not load)")
    ok, why = backend.available()
    if not ok:
        pytest.skip(f"{name} is unavailable here: {why}")
    return backend


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    backend_or_skip(request.param)
    return request.param


def weight(rng: np.random.Generator, name: str, *shape: int, scale: float = 0.2):
    return numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)


def model(nodes, inputs, outputs, inits=(), opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(inits),
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def reference(m, feeds: dict) -> list[np.ndarray]:
    data = m if isinstance(m, str) else m.SerializeToString()
    return ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)


def close(got, ref, rtol=1e-4, atol=1e-4) -> None:
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.dtype == r.dtype and g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)
