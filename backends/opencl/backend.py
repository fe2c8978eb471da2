"""The OpenCL backend: kernel mode over PyOpenCL, one ``Backend`` object per device name.

Device tensors are ``ClTensor`` handles on ``cl.Buffer`` objects from the device's caching
pool; ``_copy_in`` enqueues a host-to-device copy on the device's in-order queue (it overlaps
with the kernels already queued), ``_copy_out`` waits for the queue and reads. Aliases
(``opencl`` and ``opencl:0`` may name one device) share the device's context, queue and pool,
and a tensor moves between them without a copy.

Selection: a device listed by name is always used. With no device list, ``opencl`` joins the
session only when it is a GPU or accelerator: an OpenCL CPU device (PoCL) runs on the cores
the ``cpu`` backend already uses, and the aliases would name the same device twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.opencl.driver.discovery import DeviceInfo, default_index, find_devices
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.errors import DeviceError
from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["OpenClBackend", "backends"]

#: element types every device moves (1/2/4/8-byte words); float16/float64 only when reported
_MOVED = {
    DType.FLOAT, DType.INT64, DType.INT32, DType.INT16, DType.INT8, DType.UINT64,
    DType.UINT32, DType.UINT16, DType.UINT8, DType.BOOL,
}  # fmt: skip


#: bumped when the kernels change speed enough that cached calibrations should be measured again
_KERNELS_REVISION = 4


class OpenClBackend(Backend):
    """One OpenCL device under one name (see the module docstring)."""

    kind = "opencl"
    priority = 5

    def __init__(self, name: str, index: int | None, why: str = "") -> None:
        super().__init__()
        self.name = name
        self.index = index
        self._why = why

    @property
    def info(self) -> DeviceInfo:
        devices, why = find_devices()
        if self.index is None or self.index >= len(devices):
            raise DeviceError(f"{self.name}: {why or 'no such OpenCL device'}")
        return devices[self.index]

    @property
    def version(self) -> str:
        """In the calibration key: the kernels' revision and the device and driver measured."""
        ok, _ = self.available()
        return f"{_KERNELS_REVISION}-{self.info.key if ok else 'none'}"

    @property
    def auto_select(self) -> bool:
        """Whether a session with no device list uses this device (see the module docstring)."""
        if self.name != "opencl" or not self.available()[0]:
            return False
        return self.info.type != "cpu"

    def _cl(self) -> Any:
        from anychip.backends.opencl.driver import get_device

        return get_device(self.info.index)

    def device_model(self) -> DeviceModel:
        ok, _ = self.available()
        if not ok:
            return DeviceModel(self.name, self.kind, dtypes=frozenset({DType.FLOAT}))
        info = self.info
        dtypes = set(_MOVED)
        if info.fp64:
            dtypes.add(DType.DOUBLE)
        if info.fp16:
            dtypes.add(DType.FLOAT16)
        # Priors only (the cost model measures): 16 float lanes x 2 per cycle per unit.
        flops = info.compute_units * info.clock_mhz * 1e6 * 32
        on_host = info.type == "cpu"
        return DeviceModel(
            self.name,
            self.kind,
            memory_capacity=info.global_mem,
            dtypes=frozenset(dtypes),
            flops=flops,
            mem_bandwidth=2e10 if on_host else 2e11,
            host_link=1e10 if on_host else 1.2e10,
            launch_overhead=2e-5,
        )

    def available(self) -> tuple[bool, str]:
        """As ``Backend.available``, and False in a child forked after OpenCL was set up."""
        why = self.fork_unsafe_reason()
        return (False, why) if why is not None else super().available()

    def fork_unsafe_reason(self) -> str | None:
        """Why this device cannot run in this (forked) process, or None (``core/run/forks``)."""
        from anychip.backends.opencl.driver import FORKED

        return FORKED[0]

    def _available(self) -> tuple[bool, str]:
        if self.index is None:
            return False, self._why or "no OpenCL device"
        self._cl()  # creates the context and queue: a broken driver fails here, with its words
        return True, ""

    def check_node(self, node: Node) -> str | None:
        """Limits the kernel table cannot state (per-op checks in ``kernels/checks.py``)."""
        from anychip.backends.opencl.kernels.checks import check

        return check(node)

    @property
    def passes(self) -> list[Any]:
        """The registered passes (the attention and element-wise fusions) minus those named
        in ``ANYCHIP_DISABLED_PASSES`` (``all`` for every one), as on the CPU."""
        import os

        off = {s.strip() for s in os.environ.get("ANYCHIP_DISABLED_PASSES", "").split(",")}
        if "all" in off:
            return []
        return [p for p in super().passes if p.name not in off]

    # -- memory and copies -------------------------------------------------------------------
    def _copy_in(self, array: np.ndarray) -> Any:
        return self._cl().upload(array)

    def _copy_out(self, tensor: Any) -> np.ndarray:
        return tensor.numpy()

    def _copy_device(self, tensor: Any, src: Backend) -> Any | None:
        if isinstance(src, OpenClBackend) and src.index == self.index:
            return tensor.view(tensor.shape)  # an alias of the same device: share the buffer
        return None

    def release(self, tensor: Any) -> None:
        tensor.release()

    def _configure(self, **options: Any) -> None:
        unknown = set(options) - {"streams"}
        if unknown:
            raise DeviceError(
                f"{self.name}: unknown device options {sorted(unknown)}; it takes 'streams' "
                "(True: copies on a second queue, ordered by events)"
            )

    def streams(self) -> Any:
        """The two-queue streams (``driver/streams.py``) when asked for with
        ``device_options={"opencl": {"streams": True}}`` or ``ANYCHIP_OPENCL_STREAMS=1``."""
        import os

        on = self.options.get("streams")
        if on is None:
            on = os.environ.get("ANYCHIP_OPENCL_STREAMS") == "1"
        if not on or not self.available()[0]:
            return None
        from anychip.backends.opencl.driver.streams import ClStreams

        return ClStreams(self._cl())

    def memory_stats(self) -> Any:
        """The device pool's figures (shared by the device's aliases)."""
        if not self.available()[0]:
            return None
        return self._cl().pool.stats()


def backends() -> list[OpenClBackend]:
    """One backend per name: ``opencl``, ``opencl:<i>``, ``opencl:gpu`` / ``opencl:cpu``."""
    devices, why = find_devices()
    if not devices:
        return [OpenClBackend("opencl", None, why)]
    out = [OpenClBackend("opencl", default_index(devices))]
    out += [OpenClBackend(f"opencl:{d.index}", d.index) for d in devices]
    for kind in ("gpu", "cpu", "accelerator"):
        first = next((d for d in devices if d.type == kind), None)
        if first is not None:
            out.append(OpenClBackend(f"opencl:{kind}", first.index))
    return out
