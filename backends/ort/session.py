"""One partition as one onnxruntime ``InferenceSession``, and how it runs.

``open_session`` exports the partition (``anychip.ir.onnx.export_model``, at the opsets its
nodes were imported at), and loads it on the device's provider alone: with CPU fallback
disabled (``providers.SessionSettings``), a partition with a node the provider cannot take
fails to load, and ``PartitionRefused`` carries onnxruntime's words; the compile pipeline then
places that partition's nodes elsewhere (``core/compile/pipeline.py``). A session that comes up
on another provider than the one asked for (onnxruntime drops an unusable provider with a
warning) is refused the same way.

Two ways to run it:

* ``HostRun``: providers that read host memory take numpy arrays (``InferenceSession.run``);
* ``BoundRun``: providers with memory of their own (``Provider.memory``) take and give
  ``OrtTensor``s through IO binding, so a tensor made by one partition stays on the device
  for the next; only anychip's copies (``OrtBackend._copy_in`` / ``_copy_out``) cross the bus.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.errors import DeviceError

if TYPE_CHECKING:
    from anychip.backends.ort.providers import Provider, SessionSettings
    from anychip.core.memory.pool import Block
    from anychip.ir.graph import Graph

__all__ = [
    "PartitionRefused",
    "OrtTensor",
    "export_partition",
    "open_session",
    "HostRun",
    "BoundRun",
]


class PartitionRefused(DeviceError):
    """onnxruntime's provider would not take a partition whole (the message says why)."""


class OrtTensor:
    """A tensor in an ``ort:`` device's memory: an ``OrtValue`` and the pool block that counts
    its bytes (onnxruntime allocates; the block makes it part of ``memory_stats``).

    Owned by whoever received it from the backend; ``OrtBackend.release`` frees it once.
    """

    __slots__ = ("value", "block", "shape", "dtype")

    def __init__(self, value: Any, block: Block | None) -> None:
        self.value = value
        self.block = block
        self.shape = tuple(int(d) for d in value.shape())
        self.dtype = _numpy_dtype(value)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def __repr__(self) -> str:
        return f"OrtTensor({self.dtype}{list(self.shape)} on {self.value.device_name()})"


def _numpy_dtype(value: Any) -> np.dtype:
    from anychip.ir.dtypes import DType

    return np.dtype(DType(value.element_type()).numpy)


def export_partition(graph: Graph) -> bytes:
    """The partition as a standalone ONNX model (its opsets as its nodes were imported at).

    Shapes of intermediate values are left to onnxruntime's own inference; the partition's
    inputs and outputs keep the types and shapes anychip inferred.
    """
    from anychip.ir.graph import Model
    from anychip.ir.onnx import export_model

    opsets: dict[str, int] = {}
    for node in graph.nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opsets[domain] = max(opsets.get(domain, 1), int(node.version or 1))
    if "" not in opsets:
        opsets[""] = 21  # a partition of com.microsoft ops alone still imports ai.onnx
    proto = export_model(Model(graph, opsets))
    del proto.graph.value_info[:]
    return proto.SerializeToString()


def open_session(model: bytes, provider: Provider, settings: SessionSettings, what: str) -> Any:
    """An ``InferenceSession`` of ``model`` on ``provider`` alone.

    Raises:
        PartitionRefused: the provider cannot take the model whole, or onnxruntime cannot
            load it; the message names ``what`` and gives onnxruntime's reason.
    """
    import onnxruntime

    options = settings.session_options(provider.ep)
    providers: list[Any] = [(provider.ep, dict(settings.provider_options))]
    try:
        session = onnxruntime.InferenceSession(model, options, providers=providers)
    except Exception as e:
        words = " ".join(str(e).split())
        raise PartitionRefused(
            f"{provider.device}: onnxruntime {onnxruntime.__version__} does not take {what} "
            f"whole on {provider.ep}: {type(e).__name__}: {words}"
        ) from e
    used = session.get_providers()
    if not used or used[0] != provider.ep:
        raise PartitionRefused(
            f"{provider.device}: onnxruntime {onnxruntime.__version__} loaded {what} on {used} "
            f"instead of {provider.ep} (is the provider's runtime installed? see `anychip "
            "devices`)"
        )
    return session


class HostRun:
    """Runs a session on numpy arrays (providers that read host memory).

    A partition with a value of a type onnxruntime's numpy conversion lacks (bfloat16, the
    float8s, 4- and 2-bit types: ``values.EXOTIC``) runs on ``OrtValue``s converted by
    ``values.py``; the others through ``InferenceSession.run``.
    """

    __slots__ = ("session", "inputs", "outputs", "exotic")

    def __init__(
        self, session: Any, inputs: Sequence[str], outputs: Sequence[str], exotic: bool
    ) -> None:
        self.session = session
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.exotic = exotic

    def __call__(self, arrays: Sequence[Any]) -> list[Any]:
        if not self.exotic:
            return self.session.run(self.outputs, dict(zip(self.inputs, arrays)))
        from anychip.backends.ort.values import to_numpy, to_ort_value

        feeds = {name: to_ort_value(np.asarray(a)) for name, a in zip(self.inputs, arrays)}
        got = self.session.run_with_ort_values(self.outputs, feeds)
        return [to_numpy(v) for v in got]


class BoundRun:
    """Runs a session through IO binding: ``OrtTensor``s in, ``OrtTensor``s out, all in the
    provider's memory (``memory`` device type, ``device_id``). A binding per call: runs of
    one compiled partition from several sessions' threads never share one.

    ``adopt(ort_value) -> OrtTensor`` counts an output's bytes in the device's pool.
    """

    __slots__ = ("session", "inputs", "outputs", "memory", "device_id", "adopt")

    def __init__(
        self,
        session: Any,
        inputs: Sequence[str],
        outputs: Sequence[str],
        memory: str,
        device_id: int,
        adopt: Callable[[Any], OrtTensor],
    ) -> None:
        self.session = session
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.memory = memory
        self.device_id = device_id
        self.adopt = adopt

    def __call__(self, tensors: Sequence[Any]) -> list[OrtTensor]:
        binding = self.session.io_binding()
        for name, t in zip(self.inputs, tensors):
            if not isinstance(t, OrtTensor):
                raise DeviceError(
                    f"input {name!r} is a {type(t).__name__}, not a tensor of this device: "
                    "the runtime copies every input to the device before its partition runs"
                )
            binding.bind_ortvalue_input(name, t.value)
        for name in self.outputs:
            binding.bind_output(name, self.memory, self.device_id)
        self.session.run_with_iobinding(binding)
        return [self.adopt(v) for v in binding.get_outputs()]
