"""The CPU backend's kernel table and its ``kernel`` decorator.

Every module in ``backends/cpu/kernels/`` registers its kernels here at import time; the plugin
hook imports the whole ``ops`` package (no hand-kept list) and hands the table to the registry.
"""

from __future__ import annotations

from anychip.core.plugin.kernels import KernelTable

__all__ = ["CPU_KERNELS", "kernel"]

CPU_KERNELS = KernelTable("cpu")
kernel = CPU_KERNELS.register
