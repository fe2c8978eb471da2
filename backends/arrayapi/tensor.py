"""Device tensors of the array-API family: a namespace's array with anychip's bookkeeping.

``Space`` is one (namespace, device) pair: the namespace made standard by
``array_api_compat.array_namespace`` (CuPy, NumPy, PyTorch, JAX, array-api-strict), the device
object arrays are made on, the dtype table between the namespace and numpy (anychip reads a
device tensor's ``dtype`` as a numpy dtype), how an array comes back to the host, and a byte
counter that is the device's memory statistics.

``XTensor`` wraps one array of a space. It carries ``shape`` and a numpy ``dtype`` (what the
runtime reads) and, for small tensors copied in from the host, a host copy (``host``) so shape
inputs such as Reshape's are read without a device round trip. Kernels never write into an
input; every kernel output is a new ``XTensor`` counted in its space until ``release``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from anychip.core.memory.stats import MemoryStats
from anychip.errors import KernelError

__all__ = ["Space", "XTensor", "DTYPE_NAMES"]

#: dtype names the family maps between a namespace and numpy (each kept when the namespace has it)
DTYPE_NAMES = (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "bfloat16",
)  # fmt: skip

#: tensors at most this many elements keep a host copy when copied in (shapes, axes, scalars)
SMALL = 64


def _numpy_dtype(name: str) -> np.dtype | None:
    if name == "bfloat16":
        from anychip.ir.dtypes import DType

        try:
            return DType.BFLOAT16.numpy
        except Exception:
            return None
    return np.dtype(name)


class Space:
    """One array namespace on one device, with the byte counter of its tensors."""

    def __init__(
        self,
        name: str,
        xp: Any,
        device: Any = None,
        *,
        to_numpy: Callable[[Any], np.ndarray] | None = None,
        from_numpy: Callable[[np.ndarray], Any] | None = None,
        scope: Callable[[], Any] | None = None,
        capacity: int | None = None,
    ) -> None:
        self.name = name
        self.xp = xp
        self.device = device
        self._to_numpy = to_numpy
        self._from_numpy = from_numpy
        #: a context manager factory every kernel and copy runs in (CUDA: the device, CuPy's
        #: allocator); None: nothing to enter
        self.scope = scope
        self.capacity = capacity
        self.to_np: dict[Any, np.dtype] = {}
        self.from_np: dict[np.dtype, Any] = {}
        for n in DTYPE_NAMES:
            xdt, ndt = getattr(xp, n, None), _numpy_dtype(n)
            if xdt is not None and ndt is not None:
                self.to_np[xdt] = ndt
                self.from_np[ndt] = xdt
        self._lock = threading.Lock()
        self.in_use = self.peak = self.allocs = self.frees = 0

    # -- dtypes ----------------------------------------------------------------------------
    def xdtype(self, dtype: Any) -> Any:
        """The namespace dtype of a numpy dtype (``KernelError`` when the namespace lacks it)."""
        found = self.from_np.get(np.dtype(dtype))
        if found is None:
            raise KernelError(f"{self.name}: the array namespace has no {np.dtype(dtype)}")
        return found

    def ndtype(self, xdtype: Any) -> np.dtype:
        """The numpy dtype of a namespace dtype."""
        found = self.to_np.get(xdtype)
        if found is None:  # NumPy's arrays carry np.dtype('float32'), its namespace np.float32
            found = next((v for k, v in list(self.to_np.items()) if k == xdtype), None)
            if found is not None:
                self.to_np[xdtype] = found
        if found is None:
            raise KernelError(f"{self.name}: no numpy dtype for the namespace's {xdtype}")
        return found

    # -- host <-> device ---------------------------------------------------------------------
    def to_numpy(self, array: Any) -> np.ndarray:
        """A fresh host copy of ``array``: the backend's own reader, else DLPack."""
        if self._to_numpy is not None:
            out = self._to_numpy(array)
        elif hasattr(array, "__dlpack__"):
            out = np.from_dlpack(array)
        else:  # NumPy's namespace gives numpy scalars for 0-d results
            out = np.asarray(array)
        return np.array(out, copy=True)

    def from_numpy(self, host: np.ndarray) -> Any:
        """A copy of a host array on this space's device."""
        xdt = self.xdtype(host.dtype)
        if self._from_numpy is not None:
            return self._from_numpy(host)
        return self.xp.asarray(host, dtype=xdt, device=self.device, copy=True)

    # -- tensors and the byte counter ---------------------------------------------------------
    def wrap(self, array: Any, host: np.ndarray | None = None) -> XTensor:
        """A counted device tensor of ``array``."""
        t = XTensor(self, array, host)
        with self._lock:
            self.in_use += t.nbytes
            self.allocs += 1
            self.peak = max(self.peak, self.in_use)
        return t

    def _freed(self, nbytes: int) -> None:
        with self._lock:
            self.in_use -= nbytes
            self.frees += 1

    def stats(self) -> MemoryStats:
        """Live tensor bytes, as anychip's pool statistics (the namespace allocates)."""
        with self._lock:
            return MemoryStats(
                self.name, self.capacity, self.in_use, self.in_use, self.peak, self.in_use,
                self.allocs, self.frees, 0.0, 0,
            )  # fmt: skip


class XTensor:
    """An array of a ``Space`` as an anychip device tensor (see the module docstring)."""

    __slots__ = ("space", "array", "shape", "dtype", "host", "_released")

    def __init__(self, space: Space, array: Any, host: np.ndarray | None = None) -> None:
        self.space = space
        self.array = array
        self.shape = tuple(int(d) for d in array.shape)
        self.dtype = space.ndtype(array.dtype)
        self.host = host
        self._released = False

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """A fresh host copy."""
        if self.host is not None:
            return np.array(self.host, copy=True)
        return self.space.to_numpy(self.array).reshape(self.shape)

    def release(self) -> None:
        """Uncount this tensor (the namespace frees the array when nothing refers to it)."""
        if not self._released:
            self._released = True
            self.space._freed(self.nbytes)
            self.array = None

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> Any:
        return self.array.__dlpack_device__()

    def __repr__(self) -> str:
        return f"XTensor({self.dtype}{list(self.shape)} on {self.space.name})"
