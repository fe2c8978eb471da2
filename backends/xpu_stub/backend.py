"""The XPU backend: a simulated kernel-launch accelerator driven through its C driver.

Device tensors are ``XpuTensor`` handles into the driver's own heap; nothing is shared with
host memory, so a missing copy is an error, never a silently right answer. ``_copy_in`` and
``_copy_out`` are real memcpys through the C ABI; ``release`` returns buffers to the heap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.memory.stats import MemoryStats
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    pass

__all__ = ["XpuBackend"]


class XpuBackend(Backend):
    """Kernel mode: the runtime picks one C kernel per node (see ``ops.py``)."""

    name = "xpu"
    kind = "xpu"
    priority = 10
    simulated = True
    about = "a simulation on the host CPU (no hardware): a kernel-launch device in a C driver"

    @property
    def version(self) -> str:
        """The driver's C sources' hash: calibrations of other kernels are never read."""
        from anychip.backends.xpu_stub.driver.build import source_key

        return f"driver-{source_key()}"

    def device_model(self) -> DeviceModel:
        # Figures of the simulated chip: a small PCIe accelerator.
        capacity = None
        ok, _ = self.available()
        if ok:
            from anychip.backends.xpu_stub.driver import get_driver

            capacity = get_driver().mem_info().capacity
        return DeviceModel(
            "xpu",
            "xpu",
            memory_capacity=capacity,
            dtypes=frozenset({DType.FLOAT, DType.INT64}),
            flops=5e11,
            mem_bandwidth=1e11,
            host_link=1.6e10,
            launch_overhead=1e-5,
        )

    def runner(self, partition: Any, memory: Any) -> Any:
        """Runs the partition, then the driver's queue: launches are queued and would
        otherwise run inside the next copy out, so the feedback's timing of this partition
        (``core/run/feedback.py``) measured its launches, not its kernels, and charged them to the
        copy or the CPU partition after it. The copy out synchronizes anyway: no time added."""
        from anychip.backends.xpu_stub.driver import get_driver

        driver = get_driver()
        program = memory.runner

        def run(arrays: list[Any]) -> list[Any]:
            outs = program(arrays)
            driver.synchronize()
            return outs

        run.wrapped = program  # type: ignore[attr-defined]
        return run

    def device_arena(self, nbytes: int) -> Any:
        """One driver block per kernel-mode partition, its planned tensors aliases into it
        (``driver/arena.py``): no ``malloc``/``free`` per tensor and run, and no queue drain
        at each ``free``. Off with ``ANYCHIP_XPU_PLANNED=0``."""
        import os

        if os.environ.get("ANYCHIP_XPU_PLANNED") == "0":
            return None
        from anychip.backends.xpu_stub.driver import get_driver
        from anychip.backends.xpu_stub.driver.arena import XpuArena

        return XpuArena(get_driver(), nbytes)

    def _available(self) -> tuple[bool, str]:
        from anychip.backends.xpu_stub.driver import get_driver

        get_driver()  # builds the C library on first use; raises DeviceError with the reason
        return True, ""

    def _copy_in(self, array: np.ndarray):
        from anychip.backends.xpu_stub.driver import get_driver

        return get_driver().upload(array)

    def _copy_out(self, tensor) -> np.ndarray:
        return tensor.numpy()

    def release(self, tensor) -> None:
        tensor.free()

    def memory_stats(self) -> MemoryStats:
        """The device heap as the C driver accounts it (device-wide, all sessions).

        ``reserved`` is the whole heap (the driver holds it from start-up); ``in_use`` and
        ``peak`` are the driver's own counters since the driver was created. The driver keeps
        live blocks, not call counts, so ``alloc_count`` is the live block count and
        ``free_count`` 0.
        """
        from anychip.backends.xpu_stub.driver import get_driver

        drv = get_driver()
        info = drv.mem_info()
        heap = drv.heap_stats()
        free = info.capacity - info.used
        live = heap.blocks - heap.free_blocks
        return MemoryStats(
            device=self.name,
            capacity=info.capacity,
            in_use=info.used,
            requested=info.used,
            peak=info.peak,
            reserved=info.capacity,
            alloc_count=live,
            free_count=0,
            fragmentation=1.0 - heap.largest_free / free if free else 0.0,
            largest_free=heap.largest_free,
        )
