"""A partition in, an IREE executable out: ONNX, IREE's importer, the compiler, the module.

Top to bottom:

* ``to_onnx``: the partition as an ONNX model (``anychip.ir.onnx.export_model`` at its nodes'
  opset versions). Symbolic dimensions stay symbolic: IREE compiles them as dynamic
  dimensions, so one executable serves every shape of a dynamic partition. A Reshape whose
  target is computed gets its ``-1`` resolved in the graph (``resolve_reshape_targets``):
  IREE 3.13 reads a runtime ``-1`` as a size (BERT's ``view(B, S, -1, 16)`` failed with
  OUT_OF_RANGE, a length of 2^64 - ...).
* ``to_mlir``: IREE's ONNX importer (``iree.compiler.extras.onnx_importer``, in process)
  after onnx's shape inference, as MLIR text. A model below opset ``IMPORT_OPSET`` is first
  brought up to it by onnx's version converter (``upgraded``), as ``iree-import-onnx
  --opset-version`` does: the importer lowers many ops only from their newer versions (the
  light ResNet-50's MaxPool-8 failed, "torch.operator ... explicitly marked illegal").
* ``compile_vmfb``: ``iree-compile`` for a target (``llvm-cpu``, ``vulkan-spirv``...) with the
  device's flags, the command line ``iree.compiler.compile_str`` builds, run as a child process
  the compile's deadline kills (``core/plugin/budget.run_tool``); the result is a vmfb.
* ``Executable``: the vmfb as a module on the device's shared instance; ``run`` takes and
  returns IREE ``DeviceArray``s (tensors stay on the device between partitions).
* ``to_bytes`` / ``from_bytes``: the vmfb behind a small header (magic, JSON: IREE's version,
  target, flags, the entry function, output dtypes), refused when any of them differ.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.backends.iree import runtime
from anychip.errors import CompileTimeout, DeviceError
from anychip.ir.graph import Model

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = [
    "Executable",
    "compile_vmfb",
    "from_bytes",
    "resolve_reshape_targets",
    "short_error",
    "to_mlir",
    "to_onnx",
    "upgraded",
]

MAGIC = b"ANYCHIP-IREE"
FORMAT = 1
_PROTO_LIMIT = (2 << 30) - (1 << 20)
#: The default-domain opset older partitions are converted to before IREE imports them.
IMPORT_OPSET = 17
#: The importer and the compiler share MLIR contexts that are not documented as thread-safe.
_compile_lock = threading.Lock()


def short_error(e: BaseException, limit: int = 400) -> str:
    """IREE's message on one line: its first ``error:`` lines, without the MLIR dumps."""
    text = str(e)
    lines = [ln.strip() for ln in text.splitlines() if "error:" in ln]
    body = " | ".join(ln.split("error:", 1)[1].strip() for ln in lines[:2]) if lines else text
    return f"{type(e).__name__}: {' '.join(body.split())}"[:limit]


def to_onnx(graph: Graph, name: str = "main") -> Any:
    """``graph`` as an ONNX ``ModelProto`` named ``name`` (its entry function's name).

    Raises:
        DeviceError: the weights are too large for one ONNX protobuf (2 GiB).
    """
    from anychip.ir.onnx import export_model

    opsets: dict[str, int] = {}
    for node in graph.walk():
        opsets[node.domain] = max(opsets.get(node.domain, 1), int(node.version or 1))
    weights = sum(int(v.const.nbytes) for v in graph.initializers.values() if v.const is not None)
    if weights > _PROTO_LIMIT:
        raise DeviceError(
            f"partition {graph.name!r} holds {weights} bytes of weights, more than one ONNX "
            "protobuf carries (2 GiB); IREE gets partitions as ONNX, so it stays on the next device"
        )
    proto = export_model(Model(graph, opsets or {"": 21}))
    proto.graph.name = name
    resolve_reshape_targets(proto)
    return proto


def resolve_reshape_targets(proto: Any) -> int:
    """Each Reshape of ``proto`` whose target shape is computed (not a constant) gets the
    target with its ``-1`` replaced by the size it stands for, computed in the graph:
    ``Where(s == -1, numel(x) / max(prod(Where(s == -1, 1, s)), 1), s)``. In place; returns
    the number rewritten (0 below opset 11, where Equal takes no int64)."""
    from onnx import helper, numpy_helper

    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 11:
        return 0
    g = proto.graph
    consts = {t.name for t in g.initializer}
    consts |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    nodes, done = [], 0
    for k, node in enumerate(g.node):
        if node.op_type == "Reshape" and len(node.input) > 1 and node.input[1] not in consts:
            if not done:
                g.initializer.extend(
                    [
                        numpy_helper.from_array(np.array(-1, np.int64), "_anychip_minus_one"),
                        numpy_helper.from_array(np.array(1, np.int64), "_anychip_one"),
                    ]
                )
            x, target, p = node.input[0], node.input[1], f"_anychip_reshape{k}_"
            steps = [
                ("Equal", [target, "_anychip_minus_one"], "infer"),
                ("Where", [p + "infer", "_anychip_one", target], "known"),
                ("ReduceProd", [p + "known"], "rest"),
                ("Max", [p + "rest", "_anychip_one"], "divisor"),
                ("Shape", [x], "shape"),
                ("ReduceProd", [p + "shape"], "numel"),
                ("Div", [p + "numel", p + "divisor"], "fill"),
                ("Where", [p + "infer", p + "fill", target], "target"),
            ]
            for op, ins, out in steps:
                nodes.append(helper.make_node(op, ins, [p + out], name=p + out))
            node.input[1] = p + "target"
            done += 1
        nodes.append(node)
    if done:
        del g.node[:]
        g.node.extend(nodes)
    return done


def to_mlir(proto: Any) -> str:
    """IREE's importer on ``proto`` (after onnx's shape inference): MLIR text."""
    import onnx
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context

    inferred = onnx.shape_inference.infer_shapes(upgraded(proto))
    with _compile_lock:
        info = onnx_importer.ModelInfo(inferred)
        module = info.create_module(context=Context()).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        return str(module.get_asm())


def upgraded(proto: Any) -> Any:
    """``proto`` at opset ``IMPORT_OPSET`` when it is older and onnx's version converter takes
    it (every op with an adapter); else ``proto`` as it is, for IREE's importer to judge."""
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 0)
    if not 0 < opset < IMPORT_OPSET:
        return proto
    from onnx import version_converter

    try:
        return version_converter.convert_version(proto, IMPORT_OPSET)
    except Exception:  # an op without an adapter, another domain: imported as it is
        return proto


def compile_vmfb(graph: Any, target: str, flags: Sequence[str], what: str) -> bytes:
    """``graph`` (an anychip ``Graph``, or an ONNX ``ModelProto`` whose graph is named
    ``main``) compiled for ``target`` with ``flags``: the vmfb.

    Raises:
        DeviceError: the importer or the compiler refused it (IREE's first error lines).
    """
    try:
        text = to_mlir(graph if hasattr(graph, "opset_import") else to_onnx(graph))
    except DeviceError:
        raise
    except Exception as e:
        raise DeviceError(f"{what}: IREE's ONNX importer refused it: {short_error(e)}") from e
    try:
        with _compile_lock:
            data = _iree_compile(text, target, flags)
    except CompileTimeout:
        raise
    except Exception as e:
        raise DeviceError(f"{what}: IREE cannot compile it for {target}: {short_error(e)}") from e
    return bytes(data)


def _iree_compile(text: str, target: str, flags: Sequence[str]) -> bytes:
    """``iree.compiler.compile_str(text, ...)``'s command, as a child process that this
    compile's deadline kills (``budget.run_tool``; compile_str's cannot be stopped)."""
    from iree.compiler.tools.binaries import CompilerToolError
    from iree.compiler.tools.core import CompilerOptions, build_compile_command_line
    from iree.compiler.tools.debugging import TempFileSaver

    from anychip.core.plugin.budget import run_tool

    options = CompilerOptions(target_backends=[target], input_type="onnx", extra_args=list(flags))
    with TempFileSaver.implicit() as tfs:  # IREE_SAVE_TEMPS keeps a reproducer, as there
        command = build_compile_command_line("-", tfs, options)
        done = run_tool(command, text.encode("utf-8"))
    if done.returncode != 0:
        raise CompilerToolError(done)
    return bytes(done.stdout)


class Executable:
    """A vmfb loaded on one device: ``run`` maps device arrays in to device arrays out."""

    def __init__(
        self,
        vmfb: bytes,
        driver: str,
        index: int | None,
        output_dtypes: Sequence[str],
        meta: dict[str, Any],
    ) -> None:
        import iree.runtime as rt

        self.vmfb = vmfb
        self.meta = dict(meta)
        self.key = (driver, index)
        self.device = runtime.device(driver, index)
        self.output_dtypes = [np.dtype(d) for d in output_dtypes]
        inst = runtime.instance()
        self._module = rt.VmModule.copy_buffer(inst, vmfb)
        self._context = rt.VmContext(
            inst, modules=[rt.create_hal_module(inst, self.device), self._module]
        )
        fn = self._module.lookup_function("main")
        if fn is None:
            raise DeviceError("an IREE module without its entry function 'main'")
        self._invoke = rt.FunctionInvoker(self._context, self.device, fn)
        runtime.track(self)

    def run(self, inputs: Sequence[Any]) -> list[Any]:
        if self._invoke is None:
            raise DeviceError("this IREE executable was released (its session is closed)")
        got = self._invoke(*inputs)
        outs = list(got) if isinstance(got, (tuple, list)) else [got]
        return [runtime.hold(_with_dtype(o, d), self.key) for o, d in zip(outs, self.output_dtypes)]

    def close(self) -> None:
        """Drop the module, its context and invoker (the device's memory for them goes)."""
        self._invoke = None
        self._context = None
        self._module = None

    def to_bytes(self) -> bytes:
        header = json.dumps({**self.meta, "dtypes": [d.str for d in self.output_dtypes]}).encode()
        return MAGIC + struct.pack("<II", FORMAT, len(header)) + header + self.vmfb


def _with_dtype(a: Any, dtype: np.dtype) -> Any:
    """IREE hands back bool tensors as i8 arrays: view them as anychip's dtype."""
    if np.dtype(a.dtype) != dtype and dtype == np.bool_:
        a._override_dtype = dtype
    return a


def from_bytes(data: bytes, expected: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """The vmfb and header ``Executable.to_bytes`` wrote.

    Raises:
        DeviceError: not this format, or written for another IREE, target or flags.
    """
    head = len(MAGIC) + 8
    if len(data) < head or data[: len(MAGIC)] != MAGIC:
        raise DeviceError("not an anychip IREE executable (its magic does not match)")
    fmt, size = struct.unpack("<II", data[len(MAGIC) : head])
    if fmt != FORMAT:
        raise DeviceError(f"an anychip IREE executable of format {fmt}, this one reads {FORMAT}")
    try:
        meta = json.loads(data[head : head + size])
    except ValueError as e:
        raise DeviceError(f"an anychip IREE executable whose header is corrupt: {e}") from e
    for key, want in expected.items():
        if meta.get(key) != want:
            raise DeviceError(f"an IREE executable for {key} {meta.get(key)!r}, not {want!r}")
    return data[head + size :], meta
