"""The kit's ``streams`` contract check (``conformance/streams.py``): the OpenCL streams pass it,
a device whose ``copy_out`` reads a released tensor's reused memory fails it, and so does a
``streams()`` that returns something else than a ``Streams``."""

from __future__ import annotations

import numpy as np

from anychip.conformance.contract import contract_checks, run_check
from anychip.conformance.streams import check_streams
from anychip.core.plugin.host import get_registry
from tests.core.test_streams import LazyStreams, _Tensor


class _LazyDevice:
    """A device on ``LazyStreams`` whose released memory is reused at once (poisoned)."""

    name = "lazy"
    host_memory = False

    def __init__(self, streams):
        self._streams = streams

    def streams(self):
        return self._streams

    def to_device(self, array):
        t = _Tensor(np.shape(array))
        t.data[...] = array
        return t

    def release(self, t):
        t.data[...] = -1.0  # the memory goes to someone else right away


def test_the_opencl_streams_pass():
    backend = get_registry().backends["opencl"].configure(streams=True)
    assert "streams" in contract_checks(backend, [])
    result = run_check(backend, [], "streams")
    assert result.ok, result.detail
    backend.streams().device.use_copy_queue(False)


def test_no_check_without_streams():
    assert "streams" not in contract_checks(get_registry().backends["opencl"], [])


def test_a_download_reading_reused_memory_fails():
    result = check_streams(_LazyDevice(LazyStreams()))
    assert not result.ok
    assert "released" in result.detail and "copy_out" in result.detail


def test_streams_of_the_wrong_type_fail():
    dev = _LazyDevice(object())
    result = check_streams(dev)
    assert not result.ok and "not a Streams" in result.detail
