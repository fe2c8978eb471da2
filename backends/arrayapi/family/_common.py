"""How the array-API kernels are written and registered (not a kernel module).

A family kernel is ``fn(s, *arrays, **attrs)``: ``s`` is the ``Space`` of its inputs
(``s.xp`` the standard namespace), the arrays are the inputs' namespace arrays (None for an
omitted optional input), and it returns an array or a tuple of arrays. ``@kernel`` turns it
into an anychip kernel over ``XTensor`` handles and registers it in ``FAMILY``, which every
array-API backend merges into its own table. Only functions of the array API standard are
used (``array-api-strict`` in the tests rejects anything else), plus ``array_api_extra``,
imported by ``extra()`` when a kernel first needs it: the family registers without it, so a
plain ``pip install anychip`` lists the CUDA device with the reason it is unavailable.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from anychip.backends.arrayapi.tensor import Space, XTensor
from anychip.core.plugin.kernels import KernelTable
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

__all__ = [
    "FAMILY",
    "kernel",
    "as_kernel",
    "F",
    "NUM",
    "ANY",
    "ints",
    "host",
    "norm_axis",
    "full_like",
    "extra",
]

FAMILY = KernelTable("arrayapi")
#: float types the arithmetic kernels take (narrowed per device to what its namespace has)
F = frozenset({DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BFLOAT16})
#: numeric types (no bool)
NUM = F | {DType.INT8, DType.INT16, DType.INT32, DType.INT64, DType.UINT8, DType.UINT16,
           DType.UINT32, DType.UINT64}  # fmt: skip
#: every type the family moves
ANY = NUM | {DType.BOOL}


def extra() -> Any:
    """``array_api_extra`` (``pad``...), imported on first use; a ``KernelError`` saying what to
    install when it is missing (the ``arrayapi`` and ``cuda`` extras bring it)."""
    try:
        import array_api_extra
    except ImportError as e:
        raise KernelError(
            f"the array-API kernels need array_api_extra ({e}); "
            "pip install 'anychip[arrayapi]' (or 'anychip[cuda]')"
        ) from e
    return array_api_extra


def _space(args: Iterable[Any]) -> Space:
    for a in args:
        if isinstance(a, XTensor):
            return a.space
        if a is not None and not isinstance(a, (int, float)):
            raise KernelError(f"expected an array-API device tensor, got {type(a).__name__}")
    raise KernelError("no input tensor")


def _unwrap(a: Any) -> Any:
    return a.array if isinstance(a, XTensor) else a


def kernel(
    op: str, *, since: int, until: int | None = None, dtypes: frozenset[DType] = F, **kw: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``fn(s, *arrays, **attrs)`` for ``op`` in ``FAMILY`` (see the docstring)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        FAMILY.register(op, since=since, until=until, dtypes=dtypes, **kw)(
            as_kernel(fn, kw.get("context", False))
        )
        return fn

    return deco


def as_kernel(fn: Callable[..., Any], context: bool = False) -> Callable[..., Any]:
    """``fn(s, *arrays, **attrs)`` as an anychip kernel over ``XTensor`` handles (what
    ``@kernel`` registers; a backend overriding one family kernel registers the same way)."""

    @functools.wraps(fn)
    def run(*args: Any, **attrs: Any) -> Any:
        lead, rest = (args[:1], args[1:]) if context else ((), args)
        s = _space(rest)
        _hosts.tensors = rest
        if s.scope is None:
            out = fn(*lead, s, *[_unwrap(a) for a in rest], **attrs)
        else:
            with s.scope():
                out = fn(*lead, s, *[_unwrap(a) for a in rest], **attrs)
        if isinstance(out, tuple):
            return tuple(None if o is None else s.wrap(o) for o in out)
        return s.wrap(out)

    return run


#: per thread, the current call's input tensors, so ``host`` finds an input's host copy
_hosts = threading.local()


def host(s: Space, a: Any) -> np.ndarray:
    """The values of an input array on the host (its upload copy when it has one)."""
    for t in getattr(_hosts, "tensors", ()):
        if isinstance(t, XTensor) and t.array is a and t.host is not None:
            return t.host
    return s.to_numpy(a)


def ints(s: Space, a: Any) -> list[int]:
    """The values of a small int input (shapes, axes, pads) as Python ints; [] for None."""
    if a is None:
        return []
    return [int(v) for v in np.asarray(host(s, a)).reshape(-1)]


def norm_axis(axis: int, rank: int, op: str) -> int:
    """``axis`` in ``[0, rank)``; a ``KernelError`` naming the op when out of range."""
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise KernelError(f"{op}: axis {axis} is out of range for rank {rank}")
    return a


def full_like(s: Space, x: Any, value: float | int | bool) -> Any:
    """An array of ``x``'s shape, dtype and device filled with ``value``."""
    return s.xp.full(x.shape, value, dtype=x.dtype, device=s.device)


def scalar(s: Space, x: Any, value: float | int | bool) -> Any:
    """A 0-d array of ``x``'s dtype on the space's device (standard type promotion needs it)."""
    return s.xp.asarray(value, dtype=x.dtype, device=s.device)
