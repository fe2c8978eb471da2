"""The array-API kernel family, one op family per module, registered into ``FAMILY``.

Importing this package imports every module (each registers its kernels where it is
defined). ``FAMILY`` is a ``KernelTable`` named ``arrayapi``; each array-API backend merges it
into a table under its own name (``ArrayAPIBackend.kernel_table``).
"""

from __future__ import annotations

from anychip.backends.arrayapi.family import (  # noqa: F401 - imported for registration
    op_attention,
    op_conv,
    op_data,
    op_elementwise,
    op_fused,
    op_nn,
)
from anychip.backends.arrayapi.family._common import FAMILY

__all__ = ["FAMILY", "check"]


def check(node: object) -> str | None:
    """What the family cannot take beyond its table's ops, versions and dtypes (from the
    node's attributes, inputs and outputs alone)."""
    from anychip.backends.arrayapi.family.checks import check as _check

    return _check(node)
