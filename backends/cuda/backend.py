"""The CUDA backend: the array-API kernel family on CuPy, one ``Backend`` per device name.

Names: ``cuda`` (device 0) and ``cuda:0``, ``cuda:1``... (``cuda:i`` are used only when named;
``cuda`` and ``cuda:0`` share one device state, so a tensor moves between them without a
copy). Without CuPy, a driver or a GPU, ``cuda`` still registers, ``anychip devices`` gives
the reason, and a session that names it (``devices=["cuda", "cpu"]``) places every node
elsewhere with that reason in ``sess.placement()``.

Per device (``_GpuState``, made on first use): the array-API namespace of CuPy
(``array_api_compat.cupy``), CuPy's memory pool behind anychip's pool interface
(``memory.CupyPool``, its figures in ``Session.memory()``), pinned staging buffers and a
stream for copies (``memory.Staging``). Every kernel and copy runs inside the device's scope:
``cupy.cuda.Device(i)`` and CuPy's allocator set to the device's ``CupyPool``. CuPy is
imported only there, never at ``import anychip``.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from anychip.backends.arrayapi.backend import ArrayAPIBackend
from anychip.backends.arrayapi.tensor import Space
from anychip.backends.cuda.probe import GpuInfo, gpu_model, probe_once
from anychip.core.plugin.backend import DeviceModel
from anychip.errors import DeviceError
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.core.plugin.kernels import KernelTable
    from anychip.ir.node import Node

__all__ = ["CudaBackend", "backends"]

_STATES: dict[int, _GpuState] = {}
_LOCK = threading.Lock()


class _GpuState:
    """CuPy, the namespace, the pool and the staging buffers of one device."""

    def __init__(self, info: GpuInfo) -> None:
        import array_api_compat.cupy as xp
        import cupy

        from anychip.backends.cuda.memory import CupyPool, Staging

        self.info, self.cupy = info, cupy
        self.device = cupy.cuda.Device(info.index)
        with self.device:
            self.pool = CupyPool(
                f"cuda:{info.index}", cupy=cupy, cupy_pool=cupy.cuda.MemoryPool(),
                capacity=info.total_mem or None,
            )  # fmt: skip
            self.staging = Staging(cupy)
        self.space = Space(
            f"cuda:{info.index}", xp, self.device, to_numpy=self.staging.download,
            from_numpy=self.staging.upload, scope=self.scope, capacity=info.total_mem or None,
        )  # fmt: skip

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self.device, self.cupy.cuda.using_allocator(self.pool.cupy_malloc):
            yield


def _state(info: GpuInfo) -> _GpuState:
    with _LOCK:
        if info.index not in _STATES:
            _STATES[info.index] = _GpuState(info)
        return _STATES[info.index]


class CudaBackend(ArrayAPIBackend):
    """One CUDA device under one name (see the module docstring)."""

    priority = 20
    kept_when_unavailable = True

    def __init__(self, name: str, info: GpuInfo | None, why: str = "") -> None:
        super().__init__(name, kind="cuda", auto_select=(name == "cuda"))
        self.info = info
        self._why = why

    def make_space(self) -> Space:
        if self.info is None:
            raise DeviceError(f"{self.name}: {self._why or 'no CUDA device'}")
        return _state(self.info).space

    def _available(self) -> tuple[bool, str]:
        if self.info is None:
            return False, self._why or "no CUDA device"
        return super()._available()  # creates the device state: a broken driver fails here

    def device_model(self) -> DeviceModel:
        if self.info is None or not self.available()[0]:
            return DeviceModel(self.name, self.kind, dtypes=frozenset({DType.FLOAT}))
        return gpu_model(self.name, self.info)

    def supports(self, node: Node, table: KernelTable | None = None) -> str | None:
        ok, why = self.available()
        if not ok:
            return f"{self.name} is not available here: {why}"
        return super().supports(node, table)

    def kernel_table(self) -> KernelTable:
        """The family's kernels, with fused element-wise chains as one generated kernel."""
        from anychip.backends.cuda.fused import register

        table = super().kernel_table()
        register(table)
        return table

    def runner(self, partition: Any, memory: Any) -> Any:
        """A partition whose inputs all have static shapes is captured as a CUDA graph after
        its first runs and replayed (``graphs.ReplayedPartition``); others run as they are."""
        program = memory.runner
        if self.info is None or not _static(partition):
            return program
        from anychip.backends.cuda.graphs import ReplayedPartition

        info = self.info
        return ReplayedPartition(program, lambda: _state(info))

    @property
    def memory_pool(self) -> Any:
        """CuPy's pool of this device behind anychip's pool interface."""
        if self.info is None or not self.available()[0]:
            raise DeviceError(f"{self.name} is not available here: {self.available()[1]}")
        return _state(self.info).pool

    def memory_stats(self) -> Any:
        if self.info is None or self.info.index not in _STATES:
            return None
        return _STATES[self.info.index].pool.stats()


def _static(partition: Any) -> bool:
    """Whether every input of ``partition`` has a shape of known sizes."""
    return all(
        v.shape is not None and all(isinstance(d, int) for d in v.shape)
        for v in partition.graph.inputs
    )


def backends(found: tuple[tuple[GpuInfo, ...], str] | None = None) -> list[CudaBackend]:
    """``cuda`` and ``cuda:<i>`` for every device the probe found; ``cuda`` alone, with the
    reason, when it found none (``found`` defaults to the real probe)."""
    devices, why = found if found is not None else probe_once()
    if not devices:
        return [CudaBackend("cuda", None, why)]
    out = [CudaBackend("cuda", devices[0])]
    out += [CudaBackend(f"cuda:{d.index}", d) for d in devices]
    return out
