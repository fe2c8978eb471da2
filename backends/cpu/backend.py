"""The CPU backend: host memory, numpy kernels; the reference every other backend is tested
against, and the fallback for every node no other device claims."""

from __future__ import annotations

import os

import numpy as np

from anychip.core.backend import Backend, DeviceModel
from anychip.ir.dtypes import ALL_TYPES

__all__ = ["CpuBackend"]


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class CpuBackend(Backend):
    """numpy on the host. Device tensors are ``np.ndarray``; transfers are no-ops."""

    name = "cpu"
    kind = "cpu"
    priority = 0
    host_memory = True

    def device_model(self) -> DeviceModel:
        # Rough figures for a few cores running BLAS: only their ratio to other devices matters.
        return DeviceModel(
            "cpu",
            "cpu",
            memory_capacity=_host_memory_bytes(),
            dtypes=ALL_TYPES,
            flops=5e10,
            mem_bandwidth=1e10,
            host_link=None,
            launch_overhead=2e-6,
        )

    def _copy_in(self, array: np.ndarray) -> np.ndarray:
        return array

    def _copy_out(self, tensor: np.ndarray) -> np.ndarray:
        return tensor
