"""Shape policies a device declares: bucketed dimensions (``{"S": "pow2"}`` or sizes).

Part of the backend contract: a graph-compiling device takes ``buckets`` in its options and
checks them here; ``core/compile/bucketing.py`` proves a partition safe to pad and pads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from anychip.errors import AnychipError

__all__ = ["parse_buckets", "bucket_size"]


def parse_buckets(spec: Any, where: str = "buckets") -> dict[str, Any]:
    """``{"S": "pow2"}`` or ``{"S": [32, 64, 128]}`` checked: symbol -> "pow2" or sizes."""
    if not isinstance(spec, Mapping) or not spec:
        raise AnychipError(
            f"{where} must map a symbolic dimension to 'pow2' or a list of sizes, e.g. "
            f"{{'S': 'pow2'}} or {{'S': [32, 64, 128]}}; got {spec!r}"
        )
    out: dict[str, Any] = {}
    for sym, rule in spec.items():
        if rule == "pow2":
            out[str(sym)] = "pow2"
            continue
        try:
            sizes = sorted({int(s) for s in rule})
        except (TypeError, ValueError):
            sizes = []
        if not sizes or sizes[0] < 1 or isinstance(rule, str):
            raise AnychipError(
                f"{where}[{sym!r}] must be 'pow2' or a list of positive sizes, got {rule!r}"
            )
        out[str(sym)] = tuple(sizes)
    return out


def bucket_size(rule: Any, n: int) -> int:
    """The size ``n`` is padded to: the next power of two, or the smallest listed size >= n
    (``n`` itself when it is larger than every listed size)."""
    if rule == "pow2":
        return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()
    return next((s for s in rule if s >= n), int(n))
