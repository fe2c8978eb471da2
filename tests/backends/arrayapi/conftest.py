"""Fixtures of the array-API family tests: the test-only ``strict`` device, registered as an
in-process plugin for the module and removed afterwards (``strict_device.py``)."""

from __future__ import annotations

import pytest

from tests.backends.arrayapi.strict_device import registered


@pytest.fixture(scope="module")
def strict():
    with registered() as backend:
        yield backend
