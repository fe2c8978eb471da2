"""Fixtures of the OpenCL backend tests: the device (PoCL on CI; a missing one fails, it is
never skipped: pyopencl[pocl] is in the test extra)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def cl_device():
    """The ``ClDevice`` behind ``opencl`` (built programs are reused by every test)."""
    from anychip.backends.opencl.driver import get_device
    from anychip.core.plugin.host import get_registry

    backend = get_registry().backends["opencl"]
    ok, why = backend.available()
    assert ok, f"no OpenCL device: {why} (pyopencl[pocl] is in the test extra)"
    return get_device(backend.index)
