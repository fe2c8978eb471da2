"""A partition in, an OpenVINO compiled model out: export, read, compile, run, bytes.

Top to bottom:

* ``to_onnx``: the partition as ONNX bytes (``anychip.ir.onnx.export_model`` with the opset
  versions its nodes were imported at), which OpenVINO's ONNX frontend reads
  (``Core.read_model``). Symbolic or unknown dimensions stay dynamic in OpenVINO's partial
  shapes, so one compiled model serves every shape of a dynamic partition.
* ``compile_partition``: ``Core.compile_model`` with ``config`` (the inference precision hint
  first: f32 unless the session opted into less) into an ``Executable``.
* ``Executable``: the compiled model, the mapping of anychip's inputs and outputs to its ports,
  and one infer request per thread (runs may come from several threads; a request is not
  re-entrant). ``run`` copies the outputs out of the request (the next run reuses its memory).
* ``to_bytes`` / ``from_bytes``: ``CompiledModel.export_model()`` behind a small header
  (magic, JSON: OpenVINO's version, device, precision, port names and dtypes), and its
  inverse through ``Core.import_model``; bytes of another OpenVINO, device or precision, or
  corrupt ones, are refused with ``DeviceError`` (the compile cache then compiles again).
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.openvino.driver import core, ov_version, short_error
from anychip.backends.openvino.memory import activation_lower_bound, weights_bytes
from anychip.core.plugin.backend import CompiledGraph
from anychip.errors import DeviceError
from anychip.ir.graph import Model

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = ["Executable", "compile_partition", "from_bytes", "to_onnx"]

MAGIC = b"ANYCHIP-OPENVINO"
FORMAT = 2
_PROTO_LIMIT = (2 << 30) - (1 << 20)  # protobuf's 2 GiB, less room for the structure


def to_onnx(graph: Graph) -> bytes:
    """``graph`` as ONNX bytes, with its nodes' opset versions.

    Raises:
        DeviceError: the weights are too large for one ONNX protobuf (2 GiB).
    """
    from anychip.ir.onnx import export_model

    opsets: dict[str, int] = {}
    for node in graph.walk():
        version = int(node.version or 1)
        opsets[node.domain] = max(opsets.get(node.domain, 1), version)
    weights = sum(int(v.const.nbytes) for v in graph.initializers.values() if v.const is not None)
    if weights > _PROTO_LIMIT:
        raise DeviceError(
            f"partition {graph.name!r} holds {weights} bytes of weights, more than one ONNX "
            "protobuf carries (2 GiB); OpenVINO gets partitions as ONNX, so this one stays "
            "with the next device"
        )
    return export_model(Model(graph, opsets or {"": 21})).SerializeToString()


class Executable:
    """A compiled model and how anychip's tensors map onto its ports.

    ``inputs``: for each port of the compiled model, the position of the anychip input it
    takes; ``outputs``: for each anychip output, the port it comes from, and its dtype.
    Infer requests are made per thread on first use and kept for the thread's life.
    """

    def __init__(
        self,
        compiled: Any,
        input_names: Sequence[str],
        output_names: Sequence[str],
        output_dtypes: Sequence[str],
        *,
        device: str,
        precision: str,
        weights: int = 0,
        lower_bound: int | None = None,
        nodes: int = 0,
    ) -> None:
        self.compiled = compiled
        #: Bytes of the partition's constants OpenVINO holds, and its activations' lower bound
        #: (``memory.py``), kept in the compiled bytes' header.
        self.weights = weights
        self.lower_bound = lower_bound
        self.nodes = nodes
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self.output_dtypes = [np.dtype(d) for d in output_dtypes]
        self.device = device
        self.precision = precision
        ins = [set(port.get_names()) for port in compiled.inputs]
        outs = [set(port.get_names()) for port in compiled.outputs]
        # OpenVINO's ports keep the ONNX graph's order; a tensor's names can change where an
        # op it became was removed (Dropout's output is its input), so names decide first.
        self.ports = [
            _match(names, i, self.input_names, "input", device) for i, names in enumerate(ins)
        ]
        by_port = [sorted(names) for names in outs]
        self.sources = [
            _match({name}, i, by_port, "output", device) for i, name in enumerate(self.output_names)
        ]
        self._local = threading.local()

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self.compiled.create_infer_request()
        return request

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Infer once on this thread's request; outputs are fresh arrays of anychip's dtypes."""
        feeds = {port: _contiguous(arrays[i]) for port, i in enumerate(self.ports)}
        # share_inputs: no copy of the feeds (OpenVINO reads them, it does not write them:
        # tests/backends/openvino checks that feeds are unchanged); share_outputs=False: the
        # outputs are copies, the request's own buffers are reused by the next run.
        got = self._request().infer(feeds, share_inputs=True, share_outputs=False).to_tuple()
        out, seen = [], set()
        for src, dtype in zip(self.sources, self.output_dtypes):
            a = got[src]
            # two outputs of one port get arrays of their own (a consumer may write in place)
            a = a.astype(dtype, copy=src in seen)
            seen.add(src)
            out.append(a)
        return out

    @property
    def actual_precision(self) -> str:
        """The inference precision the compiled model reports (``f32``, ``bf16``, ``f16``)."""
        try:
            hint = self.compiled.get_property("INFERENCE_PRECISION_HINT")
        except Exception:  # a plugin without the property: what was asked
            return self.precision
        return str(hint.get_type_name()) if hasattr(hint, "get_type_name") else str(hint)

    def to_bytes(self) -> bytes:
        """The header and OpenVINO's exported blob (``from_bytes`` reads them back)."""
        blob = self.compiled.export_model()
        blob = blob.getvalue() if hasattr(blob, "getvalue") else bytes(blob)
        header = json.dumps(
            {
                "openvino": ov_version(),
                "device": self.device,
                "precision": self.precision,
                "inputs": self.input_names,
                "outputs": self.output_names,
                "dtypes": [d.str for d in self.output_dtypes],
                "weights": self.weights,
                "lower_bound": self.lower_bound,
                "nodes": self.nodes,
            }
        ).encode()
        return MAGIC + struct.pack("<II", FORMAT, len(header)) + header + blob


def _contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` in C order, its rank kept (``np.ascontiguousarray`` makes a 0-d array 1-d)."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous else np.array(a, order="C")


def _match(names: set[str], index: int, among: list[Any], what: str, device: str) -> int:
    """Where the tensor named ``names`` is among ``among`` (names, or lists of names per
    port); the one at ``index`` where no name matches."""
    for i, entry in enumerate(among):
        if (entry in names) if isinstance(entry, str) else bool(names & set(entry)):
            return i
    if index < len(among):
        return index
    raise DeviceError(
        f"openvino:{device.lower()}: OpenVINO's compiled model has no {what} matching "
        f"{sorted(names)} (it has {among})"
    )


def compile_partition(
    graph: Graph, device: str, config: dict[str, Any], precision: str
) -> Executable:
    """Read ``graph`` into OpenVINO and compile it for ``device`` with ``config``.

    Raises:
        DeviceError: OpenVINO could not read or compile it (its message, shortened); the
            runtime then places the partition's nodes elsewhere.
    """
    data = to_onnx(graph)
    c = core()
    ops = sorted({n.op_type for n in graph.nodes})
    what = f"partition {graph.name!r} ({len(graph.nodes)} nodes: {', '.join(ops[:12])})"
    try:
        model = c.read_model(data)
    except Exception as e:
        raise DeviceError(
            f"openvino:{device.lower()}: OpenVINO's ONNX frontend cannot read {what}: "
            f"{short_error(e)}; these nodes go to the next device"
        ) from e
    try:
        compiled = c.compile_model(model, device, config)
    except Exception as e:
        raise DeviceError(
            f"openvino:{device.lower()}: OpenVINO cannot compile {what}: {short_error(e)}; these "
            "nodes go to the next device"
        ) from e
    return Executable(
        compiled,
        [v.name for v in graph.inputs],
        [v.name for v in graph.outputs],
        [v.dtype.numpy.str for v in graph.outputs],
        device=device,
        precision=precision,
        weights=weights_bytes(graph),
        lower_bound=activation_lower_bound(graph),
        nodes=len(graph.nodes),
    )


def from_bytes(data: bytes, device: str, config: dict[str, Any], precision: str) -> Executable:
    """The ``Executable`` that ``Executable.to_bytes`` wrote, imported without compiling.

    Raises:
        DeviceError: not this format, or written by another OpenVINO, device or precision.
    """
    head = len(MAGIC) + 8
    if len(data) < head or data[: len(MAGIC)] != MAGIC:
        raise DeviceError("not an anychip OpenVINO blob (its magic does not match)")
    fmt, size = struct.unpack("<II", data[len(MAGIC) : head])
    if fmt != FORMAT:
        raise DeviceError(f"an anychip OpenVINO blob of format {fmt}, this one reads {FORMAT}")
    try:
        meta = json.loads(data[head : head + size])
    except ValueError as e:
        raise DeviceError(f"an anychip OpenVINO blob whose header is corrupt: {e}") from e
    expected = {"openvino": ov_version(), "device": device, "precision": precision}
    for key, want in expected.items():
        if meta.get(key) != want:
            raise DeviceError(
                f"an OpenVINO blob for {key} {meta.get(key)!r}, this session has {want!r}"
            )
    blob = data[head + size :]
    try:
        compiled = core().import_model(blob, device, config)
    except Exception as e:
        raise DeviceError(f"OpenVINO could not import the blob: {short_error(e)}") from e
    return Executable(
        compiled,
        meta["inputs"],
        meta["outputs"],
        meta["dtypes"],
        device=device,
        precision=precision,
        weights=int(meta.get("weights", 0)),
        lower_bound=meta.get("lower_bound"),
        nodes=int(meta.get("nodes", 0)),
    )


def as_compiled_graph(exe: Executable, seconds: float, loaded: bool) -> CompiledGraph:
    """``exe`` as the runtime's ``CompiledGraph``: its run, report lines and bytes."""
    info = {
        "openvino": ov_version().split("-")[0],
        "device": exe.device,
        "precision": exe.actual_precision,
        "nodes": exe.nodes,
        ("load_ms" if loaded else "compile_ms"): round(seconds * 1e3, 1),
    }
    if exe.lower_bound is not None:
        # OpenVINO plans its buffers out of sight: the bound on any plan, in the partition's
        # line of the placement report (not the memory table's "planned" columns)
        info["activations_at_least"] = exe.lower_bound
    return CompiledGraph(exe.run, info=info, serialize=exe.to_bytes)
