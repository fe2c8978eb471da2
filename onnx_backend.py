"""anychip as an ``onnx.backend`` backend, so onnx's conformance suite (``BackendTest``) runs.

    import anychip.onnx_backend as backend
    rep = backend.prepare(model, "CPU")        # or "npu,cpu", "XPU,CPU"
    outputs = rep.run([x])                     # positional inputs, in graph input order

Device strings are lower-cased into anychip device lists: onnx's ``"CPU"`` is ``["cpu"]``,
``"CUDA"`` is ``["cuda", "cpu"]`` (cpu is appended as the fallback, as ``anychip.load``
does), and any anychip list such as ``"npu,cpu"`` or ``"XPU,CPU"`` is taken as written.
``supports_device`` answers from ``anychip.devices()``: every named device must be registered
and available.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx.backend.base import Backend, BackendRep, namedtupledict

import anychip
from anychip.errors import DeviceError, InputError

__all__ = [
    "AnychipBackend",
    "AnychipBackendRep",
    "is_compatible",
    "parse_devices",
    "prepare",
    "run_model",
    "run_node",
    "supports_device",
]


def parse_devices(device: str | Sequence[str]) -> list[str]:
    """anychip device names for an onnx device string (``"CPU"``, ``"npu,cpu"``, ``"CUDA:0"``)."""
    parts = device.split(",") if isinstance(device, str) else list(device)
    names: list[str] = []
    for p in parts:
        name = p.strip().lower()
        if not name:
            continue
        if name not in names:
            names.append(name)
    if not names:
        raise DeviceError(f"no device named in {device!r}; use e.g. 'CPU' or 'npu,cpu'")
    if names != ["cpu"] and "cpu" not in names:
        # The onnx API names one device; the host CPU stays the fallback as in anychip.load.
        names.append("cpu")
    return names


class AnychipBackendRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (graph input order) or a dict."""

    def __init__(self, session: anychip.Session) -> None:
        self.session = session
        self._input_names = [i.name for i in session.inputs]
        self._output_names = [o.name for o in session.outputs]
        self._outputs_type = _outputs_type(tuple(self._output_names))

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            inputs = list(inputs)
            if len(inputs) > len(self._input_names):
                raise InputError(
                    f"{len(inputs)} inputs given but the model takes {len(self._input_names)}: "
                    f"{self._input_names}"
                )
            feeds = dict(zip(self._input_names, inputs))
        outputs = self.session.run(None, feeds)
        return self._outputs_type(*outputs)


class AnychipBackend(Backend):
    """The ``onnx.backend.base.Backend`` interface over ``anychip.load``."""

    @classmethod
    def prepare(
        cls, model: onnx.ModelProto | str | bytes, device: str = "CPU", **kwargs: Any
    ) -> AnychipBackendRep:
        """Compile ``model`` for ``device``; ``kwargs`` go to ``anychip.load``."""
        return AnychipBackendRep(anychip.load(model, devices=parse_devices(device), **kwargs))

    @classmethod
    def run_model(
        cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU", **kwargs: Any
    ) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: onnx.NodeProto,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one node on ``inputs`` (a list in the node's input order, or a dict by name)."""
        opset = kwargs.pop("opset_version", None)
        names = [n for n in node.input if n]
        if isinstance(inputs, Mapping):
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
        graph_inputs = []
        for name, value in zip(names, values):
            arr = np.asarray(value)
            graph_inputs.append(
                onnx.helper.make_tensor_value_info(
                    name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)
                )
            )
        graph_outputs = []
        for i, name in enumerate(n for n in node.output if n):
            if outputs_info is not None and i < len(outputs_info):
                dt, shape = outputs_info[i]
                graph_outputs.append(
                    onnx.helper.make_tensor_value_info(
                        name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dt)), list(shape)
                    )
                )
            else:
                graph_outputs.append(onnx.helper.make_empty_tensor_value_info(name))
        graph = onnx.helper.make_graph(
            [node], f"run_node_{node.op_type}", graph_inputs, graph_outputs
        )
        imports = [onnx.helper.make_opsetid(node.domain or "", opset or _latest(node.domain))]
        if node.domain:
            imports.append(onnx.helper.make_opsetid("", onnx.defs.onnx_opset_version()))
        model = onnx.helper.make_model(graph, opset_imports=imports)
        return cls.prepare(model, device, **kwargs).run(values)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        try:
            wanted = parse_devices(device)
        except DeviceError:
            return False
        available = {d.name for d in anychip.devices() if d.available}
        return all(name in available for name in wanted)


@functools.lru_cache(maxsize=256)
def _outputs_type(names: tuple[str, ...]) -> type:
    """onnx's ``namedtupledict`` class for ``names`` (it builds one per call with an eval:
    a tenth of a millisecond), made once per list of output names."""
    return namedtupledict("Outputs", list(names))


def _latest(domain: str) -> int:
    from anychip.opsets.schemas import latest_opset

    return latest_opset(domain or "")


prepare = AnychipBackend.prepare
run_model = AnychipBackend.run_model
run_node = AnychipBackend.run_node
supports_device = AnychipBackend.supports_device
is_compatible = AnychipBackend.is_compatible
