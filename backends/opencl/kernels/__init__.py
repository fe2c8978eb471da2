"""The OpenCL kernels, one op family per module, registered into ``table.KERNELS``.

Importing this package imports every family module (each registers its kernels where it is
defined); the plugin hook then hands ``KERNELS`` to the registry.
"""

from __future__ import annotations

from anychip.backends.opencl.kernels import (  # noqa: F401 - imported for registration
    op_attention,
    op_conv,
    op_data,
    op_elementwise,
    op_fused,
    op_matmul,
    op_normalization,
    op_pool,
    op_reduce,
)
from anychip.backends.opencl.kernels.table import KERNELS

__all__ = ["KERNELS"]
