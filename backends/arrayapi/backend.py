"""``ArrayAPIBackend``: any array-API namespace on one device as an anychip kernel-mode backend.

The kernels are the family in ``family/``, written once against the array API standard; a
backend is a namespace, a device, a name and the figures placement needs::

    import torch
    from anychip.backends.arrayapi import ArrayAPIBackend, register_backend
    register_backend(ArrayAPIBackend("mps", torch, device="mps", host_link=2e10))

The namespace is made standard by ``array_api_compat.array_namespace`` (NumPy, CuPy, PyTorch,
JAX, Dask and array-api-strict are covered); the device object is passed to every array the
kernels create. Device tensors are ``XTensor`` handles (``tensor.py``); the memory statistics
are the bytes of live tensors, since the namespace owns its allocator (a backend whose library
exposes its pool, like CuPy, overrides ``memory_stats``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.arrayapi.tensor import SMALL, Space, XTensor
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.kernels import KernelTable
from anychip.errors import KernelError
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.core.plugin.registry import Registry
    from anychip.ir.node import Node

__all__ = ["ArrayAPIBackend", "ArrayAPIPlugin", "register_backend", "standard_namespace"]


def standard_namespace(xp: Any) -> Any:
    """The array-API-compatible namespace of library ``xp`` (``array_api_compat``'s wrapper
    for NumPy, CuPy, PyTorch...; a namespace that already is standard is returned as is)."""
    if hasattr(xp, "__array_api_version__") and not hasattr(xp, "ndarray"):
        return xp
    import array_api_compat

    return array_api_compat.array_namespace(xp.asarray(0.0))


def _same_device(found: Any, wanted: Any) -> bool:
    """Whether an array's device is the backend's (PyTorch reports ``mps:0`` for ``mps``)."""
    return bool(found == wanted) or str(found) in (str(wanted), f"{wanted}:0")


class ArrayAPIBackend(Backend):
    """One array-API namespace on one device (see the module docstring).

    ``xp`` is the library (``torch``, ``cupy``, ``array_api_strict``); ``device`` the device
    object or string arrays are made on (None: the namespace's default). ``to_numpy`` reads an
    array back to the host (default: ``numpy.from_dlpack``, which needs host-readable memory).
    The figures (``flops``, ``mem_bandwidth``, ``host_link``, ``launch_overhead``,
    ``memory_capacity``) go to the ``DeviceModel``; ``host_link`` must be given for a device
    behind a bus, or the cost model thinks its copies are free.
    """

    kind = "arrayapi"
    priority = 5

    def __init__(
        self,
        name: str,
        xp: Any = None,
        device: Any = None,
        *,
        kind: str | None = None,
        priority: int | None = None,
        to_numpy: Any = None,
        auto_select: bool = True,
        **figures: Any,
    ) -> None:
        super().__init__()
        self.name = name
        self.kind = kind or name
        if priority is not None:
            self.priority = priority
        self.auto_select = auto_select
        self._xp, self._xdevice, self._reader = xp, device, to_numpy
        self._figures = {"host_link": 1e10, "launch_overhead": 1e-5, **figures}
        self._space: Space | None = None
        self._space_lock = threading.Lock()

    # -- the namespace -----------------------------------------------------------------------
    def make_space(self) -> Space:
        """The ``Space`` of this backend (override to import the library lazily)."""
        cap = self._figures.get("memory_capacity")
        return Space(
            self.name, standard_namespace(self._xp), self._xdevice, to_numpy=self._reader,
            capacity=cap,
        )  # fmt: skip

    @property
    def space(self) -> Space:
        if self._space is None:
            with self._space_lock:
                if self._space is None:
                    self._space = self.make_space()
        return self._space

    def _available(self) -> tuple[bool, str]:
        s = self.space
        probe = s.from_numpy(np.arange(3, dtype=np.float32))
        if not np.array_equal(s.to_numpy(probe), np.arange(3, dtype=np.float32)):
            return False, "a probe array did not come back from the device unchanged"
        return True, ""

    def device_model(self) -> DeviceModel:
        if not self.available()[0]:
            return DeviceModel(self.name, self.kind, dtypes=frozenset({DType.FLOAT}))
        dtypes = frozenset(DType.from_numpy(d) for d in self.space.from_np)
        return DeviceModel(self.name, self.kind, dtypes=dtypes, **self._figures)

    def check_node(self, node: Node) -> str | None:
        from anychip.backends.arrayapi.family import check

        return check(node)

    def kernel_table(self) -> KernelTable:
        """The family's kernels under this backend's name (for ``anychip_register_kernels``)."""
        from anychip.backends.arrayapi.family import FAMILY

        table = KernelTable(self.name)
        table.merge(FAMILY)
        return table

    # -- memory and copies -------------------------------------------------------------------
    def _copy_in(self, array: np.ndarray) -> XTensor:
        s = self.space
        host = np.array(array, copy=True) if array.size <= SMALL else None
        if s.scope is None:
            return s.wrap(s.from_numpy(array), host)
        with s.scope():
            return s.wrap(s.from_numpy(array), host)

    def to_device(self, array: Any) -> Any:
        """A host array's copy; a device tensor of this device (an adopted feed) as it is."""
        if isinstance(array, XTensor) and array.space is self.space:
            return self.space.wrap(array.array, array.host)
        return super().to_device(array)

    adopts_arrays = True

    def adopt(self, x: Any) -> XTensor | None:
        """``x`` as a device tensor of this device without a copy, or None when ``x`` is not
        an array of this namespace on this device (``core/api/dlpack.py``). Not counted: the
        caller owns the array."""
        if isinstance(x, XTensor):
            return x if x.space is self.space else None
        if not self.available()[0]:
            return None
        import array_api_compat

        s = self.space
        try:
            if array_api_compat.array_namespace(x) is not s.xp:
                return None
            if s.device is not None and not _same_device(array_api_compat.device(x), s.device):
                return None
            return XTensor(s, x)
        except (TypeError, KernelError):
            return None

    def to_native(self, host: np.ndarray) -> Any:
        """A copy of a host array as this namespace's array on this device (not counted)."""
        s = self.space
        if s.scope is None:
            return s.from_numpy(np.require(host, None, "C"))  # keeps rank 0
        with s.scope():
            return s.from_numpy(np.require(host, None, "C"))  # keeps rank 0

    def _copy_out(self, tensor: XTensor) -> np.ndarray:
        return tensor.numpy()

    def _copy_device(self, tensor: Any, src: Backend) -> Any | None:
        if isinstance(src, ArrayAPIBackend) and src.space is self.space:
            return self.space.wrap(tensor.array, tensor.host)  # an alias: share the array
        return None

    def release(self, tensor: XTensor) -> None:
        tensor.release()

    def memory_stats(self) -> Any:
        return self.space.stats() if self._space is not None else None


class ArrayAPIPlugin:
    """A pluggy plugin registering array-API backends and the family under their names."""

    ANYCHIP_API_VERSION = 1

    def __init__(self, backends: list[ArrayAPIBackend]) -> None:
        self.backends = list(backends)

    @hookimpl
    def anychip_register_backends(self, registry: Registry) -> None:
        for b in self.backends:
            registry.add_backend(b)

    @hookimpl
    def anychip_register_kernels(self, registry: Registry) -> None:
        for b in self.backends:
            registry.add_kernels(b.kernel_table())

    @hookimpl
    def anychip_register_passes(self, registry: Registry) -> None:
        # element-wise chains become one FusedElementwise (family/op_fused.py): the shared
        # pattern of ir/passes/patterns
        from anychip.ir.passes import patterns

        patterns.enable(registry, "elementwise", backends=[b.name for b in self.backends])


def register_backend(*backends: ArrayAPIBackend, name: str | None = None) -> str:
    """Make ``backends`` usable by the next ``anychip.load`` (a plugin added in-process;
    ``anychip.core.plugin.host.unregister_plugin(name)`` removes it). Returns the plugin name."""
    from anychip.core.plugin.host import register_plugin

    plugin_name = name or backends[0].name
    register_plugin(ArrayAPIPlugin(list(backends)), plugin_name)
    return plugin_name
