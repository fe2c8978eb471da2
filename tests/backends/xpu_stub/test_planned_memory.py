"""Planned device memory on the XPU (``Backend.device_arena``, ``driver/arena.py``): one block
per partition with the planned tensors as alias handles gives the same outputs as a tensor per
allocation, fewer driver allocations per run, and the heap back where it started at close."""

from __future__ import annotations

import numpy as np
import pytest

import anychip
from anychip.backends.xpu_stub.driver import XpuDriver, get_driver
from anychip.backends.xpu_stub.driver._launch_util import _output
from anychip.errors import DeviceError
from tests.models import transformer_layer


@pytest.fixture
def x():
    return np.random.default_rng(5).standard_normal((1, 64, 256)).astype(np.float32)


@pytest.fixture(scope="module")
def model():
    return transformer_layer()


def _mallocs(monkeypatch):
    count = [0]
    real = XpuDriver.malloc

    def malloc(self, nbytes):
        count[0] += 1
        return real(self, nbytes)

    monkeypatch.setattr(XpuDriver, "malloc", malloc)
    return count


def _session(model, monkeypatch, planned):
    monkeypatch.setenv("ANYCHIP_XPU_PLANNED", "1" if planned else "0")
    return anychip.load(model, devices=["xpu", "cpu"], cost_model=False)


def test_planned_outputs_equal_the_unplanned_and_the_cpu(model, x, monkeypatch):
    ref = anychip.load(model, devices=["cpu"]).run(None, {"x": x})[0]
    planned = _session(model, monkeypatch, True)
    plain = _session(model, monkeypatch, False)
    assert any(pm.device_views is not None for pm in planned.compiled.part_memory.values())
    assert all(pm.device_views is None for pm in plain.compiled.part_memory.values())
    want = plain.run(None, {"x": x})[0]
    for _ in range(3):  # the arena's views are reused run after run
        got = planned.run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    planned.close()
    plain.close()


def test_fewer_allocations_per_run(model, x, monkeypatch):
    count = _mallocs(monkeypatch)
    per_run = {}
    for planned in (False, True):
        sess = _session(model, monkeypatch, planned)
        sess.run(None, {"x": x})
        count[0] = 0
        for _ in range(4):
            sess.run(None, {"x": x})
        per_run[planned] = count[0] / 4
        sess.close()
    assert per_run[True] < per_run[False] * 0.6, per_run


def test_the_heap_is_back_where_it_started_at_close(model, x, monkeypatch):
    drv = get_driver()
    before = drv.mem_info().used
    sess = _session(model, monkeypatch, True)
    sess.run(None, {"x": x})
    assert drv.mem_info().used > before  # weights and the arena are held while open
    sess.close()
    assert drv.mem_info().used == before
    sess = _session(model, monkeypatch, True)
    sess.run(None, {"x": x})
    del sess  # a session never closed gives its arena back when collected
    import gc

    gc.collect()
    assert drv.mem_info().used == before


def test_alias_handles():
    drv = get_driver()
    before = drv.mem_info().used
    base = drv.malloc(4096)
    a = drv.alias(base, 1024, 400)
    drv.copy_in(a, np.arange(100, dtype=np.float32))
    np.testing.assert_array_equal(
        drv.copy_out(base, (100,), np.float32, offset=1024), np.arange(100, dtype=np.float32)
    )
    assert drv.buffer_size(a) == 400
    with pytest.raises(DeviceError, match="alias"):
        drv.free(base)  # aliases first
    with pytest.raises(DeviceError, match="outside"):
        drv.alias(base, 4000, 400)
    with pytest.raises(DeviceError, match="itself an alias"):
        drv.alias(a, 0, 4)
    with pytest.raises(DeviceError, match="out of bounds|outside|bytes"):
        drv.copy_in(a, np.zeros(101, np.float32))  # bounded by the alias, not the block
    drv.free(a)
    drv.free(base)
    assert drv.mem_info().used == before


def test_a_misfit_out_is_not_written():
    drv = get_driver()
    out = drv.empty((2, 3), np.float32)
    assert _output(drv, out, (2, 3), np.dtype(np.float32)) is out
    other = _output(drv, out, (3, 2), np.dtype(np.float32))
    assert other is not out and other.shape == (3, 2)
    other.free()
    out.free()
