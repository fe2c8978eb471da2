"""A graph-mode compile that fails is visible (issue 47): ``strict=True`` is honoured by
background compiles, a compile at load that fails moves its partition with the reason, and
``Session.placement()`` says how many runs the host served for a device's partition."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.npu_stub.backend import NpuBackend
from anychip.errors import OutOfMemoryError
from tests.reliability.test_termination import _layer_norm_scale

pytestmark = pytest.mark.usefixtures("no_compile_cache")  # they watch the compile itself


@pytest.fixture
def npu_out_of_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def compile(self: NpuBackend, graph: object) -> object:
        raise OutOfMemoryError("npu: out of memory compiling", device="npu", need=1 << 30)

    monkeypatch.setattr(NpuBackend, "compile", compile)


def _x() -> np.ndarray:
    return np.random.default_rng(9).standard_normal((1, 4, 8, 8)).astype(np.float32)


def test_strict_session_gets_the_background_compiles_error(npu_out_of_memory: None) -> None:
    sess = anychip.load(
        _layer_norm_scale(True), devices=["npu"], strict=True, background_compile=True
    )
    (sp,) = sess.compiled.specialized.values()
    sess.run(None, {"x": _x()})  # served by the host while the device compiles
    assert sp.wait(60)
    with pytest.raises(anychip.DeviceError, match="out of memory.*strict=True"):
        sess.run(None, {"x": _x()})


def test_the_report_says_the_host_served_the_runs(npu_out_of_memory: None) -> None:
    model = _layer_norm_scale(True)
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=True)
    (sp,) = sess.compiled.specialized.values()
    sess.run(None, {"x": _x()})
    assert sp.wait(60)
    got = sess.run(None, {"x": _x()})[0]
    want = anychip.load(model, devices=["cpu"]).run(None, {"x": _x()})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    text = str(sess.placement())
    assert "runs_on_host=2 of 2" in text and "OutOfMemoryError" in text, text


def test_a_compile_at_load_that_fails_moves_the_partition_as_before(
    npu_out_of_memory: None,
) -> None:
    model = _layer_norm_scale(True)
    sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=False)
    assert sess.placement().by_device() == {"cpu": 4}
    assert "(out of memory)" in str(sess.placement())
    with pytest.raises(anychip.AnychipError, match="out of memory compiling"):
        anychip.load(model, devices=["npu"], strict=True, background_compile=False)
