"""Finding NVIDIA GPUs through CuPy without crashing, and what placement is told about one.

``probe()`` imports CuPy, asks the CUDA runtime for the device count and each device's
properties, and returns ``(devices, why)``: an empty list with a sentence when CuPy is not
installed, the driver is missing or broken, or there is no device. It never raises. The CuPy
module is a parameter so the tests drive every branch with a stand-in.

``gpu_model`` turns a device's properties into a ``DeviceModel``: FP32 throughput from the SM
count and clock, memory bandwidth from the memory clock and bus width, and the link and launch
figures of a real discrete GPU: 20 GB/s over PCIe 4.0 x16 with pinned buffers (its 31.5 GB/s
peak is never reached) and 15 µs per kernel (a CUDA launch is about 5 µs, CuPy's Python
dispatch adds about 10). The cost model measures the real figures when calibration runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from anychip.core.plugin.backend import DeviceModel
from anychip.ir.dtypes import DType

__all__ = ["GpuInfo", "probe", "gpu_model", "PCIE_BYTES_PER_S", "LAUNCH_S", "GPU_DTYPES"]

#: host <-> device bytes/s with pinned buffers over PCIe 4.0 x16 (measured figures run 20-25)
PCIE_BYTES_PER_S = 2.0e10
#: seconds per kernel: CUDA launch latency plus CuPy's Python dispatch
LAUNCH_S = 1.5e-5
#: what CuPy computes (no bfloat16 in CuPy)
GPU_DTYPES = frozenset({
    DType.FLOAT, DType.FLOAT16, DType.DOUBLE, DType.BOOL, DType.INT8, DType.INT16, DType.INT32,
    DType.INT64, DType.UINT8, DType.UINT16, DType.UINT32, DType.UINT64,
})  # fmt: skip


@dataclass(frozen=True)
class GpuInfo:
    """One CUDA device as the runtime describes it."""

    index: int
    name: str
    total_mem: int
    sm_count: int
    clock_khz: int
    mem_clock_khz: int
    bus_width: int
    capability: tuple[int, int]

    @property
    def arch(self) -> str:
        """``sm_80``-style architecture name (NVRTC's ``--gpu-architecture``)."""
        return f"sm_{self.capability[0]}{self.capability[1]}"


def _import_cupy() -> Any:
    import cupy

    return cupy


def _info(index: int, props: dict[str, Any]) -> GpuInfo:
    name = props.get("name", b"CUDA device")
    return GpuInfo(
        index=index,
        name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
        total_mem=int(props.get("totalGlobalMem", 0)),
        sm_count=int(props.get("multiProcessorCount", 1)),
        clock_khz=int(props.get("clockRate", 1_000_000)),
        mem_clock_khz=int(props.get("memoryClockRate", 5_000_000)),
        bus_width=int(props.get("memoryBusWidth", 256)),
        capability=(int(props.get("major", 7)), int(props.get("minor", 0))),
    )


def probe(import_cupy: Callable[[], Any] = _import_cupy) -> tuple[list[GpuInfo], str]:
    """The CUDA devices here and, when there are none, why (see the module docstring)."""
    try:
        cp = import_cupy()
    except ImportError as e:
        return [], f"CuPy is not installed ({e}); pip install 'anychip[cuda]'"
    except Exception as e:
        return [], f"CuPy failed to import: {type(e).__name__}: {e}"
    runtime = cp.cuda.runtime
    try:
        count = int(runtime.getDeviceCount())
    except Exception as e:
        return [], f"no usable CUDA driver ({type(e).__name__}: {' '.join(str(e).split())})"
    if count == 0:
        return [], "the CUDA driver reports no GPU"
    out = []
    for i in range(count):
        try:
            out.append(_info(i, runtime.getDeviceProperties(i)))
        except Exception as e:
            return out, f"cuda:{i}: properties unreadable ({type(e).__name__}: {e})"
    return out, ""


@functools.lru_cache(maxsize=1)
def probe_once() -> tuple[tuple[GpuInfo, ...], str]:
    """``probe()`` with the real CuPy, once per process."""
    devices, why = probe()
    return tuple(devices), why


def gpu_model(name: str, info: GpuInfo) -> DeviceModel:
    """A ``DeviceModel`` of a discrete NVIDIA GPU from its properties (module docstring)."""
    fp32_lanes = 64  # per SM since Volta (128 on consumer Ampere and later: a floor)
    flops = info.sm_count * info.clock_khz * 1e3 * fp32_lanes * 2
    bandwidth = 2 * info.mem_clock_khz * 1e3 * info.bus_width / 8
    return DeviceModel(
        name,
        "cuda",
        memory_capacity=info.total_mem or None,
        dtypes=GPU_DTYPES,
        flops=flops,
        mem_bandwidth=bandwidth,
        host_link=PCIE_BYTES_PER_S,
        launch_overhead=LAUNCH_S,
    )
