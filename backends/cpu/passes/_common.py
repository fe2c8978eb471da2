"""What only the CPU's fusion passes ask: whether the CPU's kernel of the fused op is fast.

The graph helpers every fusion pass shares (``record``, ``fuse_each``, ``producer``,
``reader``, ``replace_chain``, ``kept_axes``, ``fused_node``) live in ``ir/passes/rewrite.py``.
"""

from __future__ import annotations

from typing import Any

from anychip.ir.dtypes import DType

__all__ = ["fast_kernel"]


def fast_kernel(domain: str, op_type: str, numpy_fn: Any) -> bool:
    """Whether the CPU's float32 kernel of ``domain::op_type`` is fast: its function says so
    with an attribute ``fast`` (a bool, or a callable answering at compile time, e.g. "oneDNN
    loaded"), else whether it is another function than ``numpy_fn``."""
    from anychip.core.plugin.host import get_registry

    found = get_registry(["cpu"]).kernel_table("cpu").lookup(domain, op_type, 1, DType.FLOAT)
    if found.kernel is None:
        return False
    fast = getattr(found.kernel.fn, "fast", None)
    if fast is not None:
        return bool(fast() if callable(fast) else fast)
    return found.kernel.fn is not numpy_fn
