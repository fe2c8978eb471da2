"""Contract checks of a backend's hooks, independent of any operator.

* ``copies/<dtype>``: every claimed dtype survives host -> device -> host byte for byte, in odd
  shapes (0-sized, 0-d, one element, odd extents, a non-contiguous view, a large array), and
  each device tensor is released after;
* ``memory``: the device's ``memory_stats()`` in-use figure is back where it started after the
  copies, and after every case of the kit (sessions dropped), so nothing leaks;
* ``streams`` (a device whose ``streams()`` is not None): ``conformance/streams.py``;
* ``capabilities``: every op the backend claims has a kernel that serves it (kernel style), a
  graph-mode backend claims something, and every claim names a dtype the device computes.
"""

from __future__ import annotations

import gc
from typing import Any

import numpy as np

from anychip.conformance.report import ContractResult
from anychip.core.plugin.claims import OpClaim
from anychip.ir.dtypes import ALL_TYPES, DType

__all__ = [
    "run_contract",
    "run_check",
    "contract_checks",
    "check_copies",
    "check_capabilities",
    "check_memory",
]

#: Dtypes tried when a device claims "any": the ones models use most.
_COMMON = (DType.FLOAT, DType.FLOAT16, DType.INT64, DType.INT32, DType.BOOL, DType.UINT8)
_LARGE_ELEMENTS = 1 << 21


def _shapes(itemsize: int, capacity: int | None) -> list[tuple[str, tuple[int, ...]]]:
    large = _LARGE_ELEMENTS
    if capacity:
        large = max(1, min(large, capacity // (8 * itemsize)))
    return [
        ("0-sized", (0,)),
        ("0-sized 2-d", (3, 0)),
        ("0-d", ()),
        ("one element", (1,)),
        ("odd extents", (3, 5, 7)),
        ("non-contiguous", (-1,)),  # built below as a transposed, strided view
        ("large", (large,)),
    ]


def _sample(dtype: np.dtype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if shape == (-1,):
        base = _sample(dtype, (24, 34), rng)
        return base.T[::2, 1::3]
    if dtype.kind == "b":
        return rng.random(shape) > 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def claimed_dtypes(backend: Any, claims: list[OpClaim]) -> list[DType]:
    """The dtypes the claims name; the device's own list (or the common ones) for "any"."""
    named: set[DType] = set()
    for c in claims:
        if c.dtypes is not None:
            named |= set(c.dtypes)
    device = backend.device.dtypes
    if not named:
        named = set(_COMMON) if device == ALL_TYPES else set(device)
    out = [d for d in named if _numpy_dtype(d) is not None]
    return sorted(out, key=lambda d: d.value)


def _numpy_dtype(d: DType) -> np.dtype | None:
    try:
        dt = np.dtype(d.numpy)
    except Exception:
        return None
    return None if dt.kind == "O" else dt


def check_copies(backend: Any, dtype: DType, seed: int = 0) -> ContractResult:
    """Round-trip copies of ``dtype`` in odd shapes; byte-exact, released after."""
    name = f"copies/{dtype.short}"
    dt = _numpy_dtype(dtype)
    rng = np.random.default_rng(seed)
    before = in_use(backend)
    for label, shape in _shapes(dt.itemsize, backend.device.memory_capacity):
        host = _sample(dt, shape, rng)
        try:
            tensor = backend.to_device(host)
            back = backend.to_host(tensor)
            backend.release(tensor)
        except Exception as e:
            return ContractResult(name, False, f"{label} {list(host.shape)}: {e}")
        back = np.asarray(back)
        if back.dtype != host.dtype or back.shape != host.shape:
            return ContractResult(
                name,
                False,
                f"{label}: sent {host.dtype}{list(host.shape)}, got back "
                f"{back.dtype}{list(back.shape)}",
            )
        if np.ascontiguousarray(back).tobytes() != np.ascontiguousarray(host).tobytes():
            wrong = int(np.count_nonzero(np.ascontiguousarray(back) != host))
            return ContractResult(
                name, False, f"{label} {list(host.shape)}: {wrong} element(s) changed in transit"
            )
    after = in_use(backend)
    if before is not None and after != before:
        return ContractResult(
            name,
            False,
            f"device memory in use {before} B before the copies, {after} B after "
            "releasing every tensor: release() does not give the memory back",
        )
    return ContractResult(name, True)


def check_capabilities(backend: Any, claims: list[OpClaim]) -> ContractResult:
    """Claims and kernels agree, and name dtypes the device computes."""
    if not claims:
        return ContractResult(
            "capabilities",
            False,
            f"{backend.name} claims no op: register kernels, or (graph mode) override "
            "Backend.claims()",
        )
    device = backend.device.dtypes
    problems = []
    table = None if backend.graph_mode else backend.kernels
    for c in claims:
        opname = f"{c.domain}::{c.op}" if c.domain else c.op
        if c.dtypes is not None and not c.dtypes <= device:
            extra = sorted(d.short for d in c.dtypes - device)
            problems.append(f"{opname} claims {extra}, which the device model does not compute")
        if table is not None:
            dtypes = sorted(c.dtypes, key=lambda d: d.value) if c.dtypes else [None]
            for dt in dtypes:
                if not table.lookup(c.domain, c.op, c.since, dt):
                    what = f" {dt.short}" if dt is not None else ""
                    problems.append(f"{opname}{what} since {c.since} is claimed with no kernel")
    if problems:
        return ContractResult("capabilities", False, "; ".join(problems[:10]))
    return ContractResult("capabilities", True, f"{len(claims)} claims")


def in_use(backend: Any) -> int | None:
    """The bytes the backend's pool says are in use (None: it keeps no statistics)."""
    stats = getattr(backend, "memory_stats", None)
    if not callable(stats):
        return None
    st = stats()
    return None if st is None else st.in_use


def check_memory(backend: Any, in_use_before: int | None = None) -> ContractResult:
    """Device memory in use is back to ``in_use_before`` (every session dropped)."""
    gc.collect()
    now = in_use(backend)
    if backend.host_memory:
        return ContractResult("memory", True, "host memory: nothing to return")
    if now is None:
        return ContractResult(
            "memory",
            False,
            f"{backend.name} reports no memory_stats(): allocate through "
            "Backend.allocate() (a pool) or override memory_stats()",
        )
    if in_use_before is not None and now != in_use_before:
        return ContractResult(
            "memory",
            False,
            f"{now - in_use_before} B still in use on {backend.name} after every session "
            "of the kit was dropped: a tensor or constant is never released",
        )
    return ContractResult("memory", True, f"{now} B in use")


def contract_checks(backend: Any, claims: list[OpClaim]) -> list[str]:
    """The names of the checks ``run_contract`` makes for this backend, in order."""
    from anychip.conformance.streams import declares_streams

    copies = [] if backend.host_memory else claimed_dtypes(backend, claims)
    streams = ["streams"] if declares_streams(backend) else []
    return ["capabilities"] + [f"copies/{d.short}" for d in copies] + streams + ["memory"]


def run_check(
    backend: Any, claims: list[OpClaim], name: str, *, in_use_before: int | None = None
) -> ContractResult:
    """One contract check by name (see ``contract_checks``)."""
    if name == "capabilities":
        return check_capabilities(backend, claims)
    if name == "memory":
        return check_memory(backend, in_use_before)
    if name == "streams":
        from anychip.conformance.streams import check_streams

        return check_streams(backend)
    short = name.removeprefix("copies/")
    dtype = next(d for d in claimed_dtypes(backend, claims) if d.short == short)
    return check_copies(backend, dtype)


def run_contract(
    backend: Any, claims: list[OpClaim], *, in_use_before: int | None = None
) -> list[ContractResult]:
    """Every contract check; ``in_use_before`` is the device memory before the kit's cases."""
    return [
        run_check(backend, claims, name, in_use_before=in_use_before)
        for name in contract_checks(backend, claims)
    ]
