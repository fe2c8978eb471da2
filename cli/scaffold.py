"""``anychip new-backend NAME [--graph-mode] [-o DIR]``: a backend package that installs and
passes the conformance kit as written.

It writes ``anychip-NAME/`` with ``pyproject.toml`` (the ``anychip`` entry point),
``anychip_NAME/__init__.py`` (the device: its own memory taken through ``Backend.allocate``,
byte copies in and out, one Relu kernel, or for ``--graph-mode`` a ``compile`` of partitions
made of Relu nodes), ``README.md`` and ``tests/test_NAME.py`` (the kit in strict mode, and a
Relu model checked against numpy). Replace the numpy "device" by your driver, step by step,
re-running the tests.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from anychip.errors import AnychipError

__all__ = ["new_backend"]

_COMMON = '''"""anychip_{name}: the {name} device for anychip (made by `anychip new-backend`).

Device memory is a numpy byte buffer per allocation (``_alloc``): replace it, the copies and
the kernel with your driver's calls. Test with ``pytest tests`` (the conformance kit runs in
strict mode) and ``anychip conformance --device {name} --strict``.
"""

import numpy as np

from anychip import hookimpl
from anychip.conformance import OpClaim
from anychip.core.plugin.backend import Backend, CompiledGraph, DeviceModel
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

ANYCHIP_API_VERSION = 1
F32 = frozenset({{DType.FLOAT}})


class Tensor:
    """A device tensor: a block of the device's memory, read as ``shape`` and ``dtype``."""

    def __init__(self, device: "{cls}", array: np.ndarray) -> None:
        self.shape, self.dtype = array.shape, array.dtype
        self.block = device.allocate(array.nbytes)
        self.view()[...] = array

    def view(self) -> np.ndarray:
        b = self.block
        return b.buffer[b.offset : b.offset + b.nbytes].view(self.dtype).reshape(self.shape)


class {cls}(Backend):
    name, kind, priority = "{name}", "{name}", 10
    graph_mode = {graph_mode}

    def device_model(self) -> DeviceModel:
        return DeviceModel(
            self.name, self.kind, memory_capacity=64 << 20, dtypes=F32, host_link=1e10
        )

    def _alloc(self, nbytes: int) -> np.ndarray:  # raw device memory: your driver's malloc
        return np.empty(nbytes, np.uint8)

    def _free(self, buffer: np.ndarray) -> None:  # your driver's free
        pass

    def _copy_in(self, array: np.ndarray) -> Tensor:
        return Tensor(self, array)

    def _copy_out(self, tensor: Tensor) -> np.ndarray:
        return tensor.view().copy()

    def release(self, tensor: Tensor) -> None:
        self.deallocate(tensor.block)
'''

_KERNEL = """

DEVICE = {cls}()
KERNELS = KernelTable("{name}")


# Relu-6, -13 and -14 compute the same: one kernel serves every opset from 6 on.
@KERNELS.register("Relu", since=6, dtypes=F32)
def relu(x: Tensor) -> Tensor:
    return Tensor(DEVICE, np.maximum(x.view(), 0))


@hookimpl
def anychip_register_backends(registry) -> None:
    registry.add_backend(DEVICE)


@hookimpl
def anychip_register_kernels(registry) -> None:
    registry.add_kernels(KERNELS)
"""

_GRAPH = '''
    def claims(self) -> list[OpClaim]:
        return [OpClaim("", "Relu", 6, None, F32)]

    def check_node(self, node) -> str | None:
        if node.domain != "" or node.op_type != "Relu":
            return f"{{node.op_type}} is not compiled by {name}"
        return None

    def compile(self, graph) -> CompiledGraph:
        """One executable for the partition: the nodes in order, over device tensors."""
        nodes = [(n.inputs[0].name, n.outputs[0].name) for n in graph.nodes]
        ins = [v.name for v in graph.inputs]
        outs = [v.name for v in graph.outputs]

        def run(tensors: list) -> list:
            env = dict(zip(ins, tensors))
            made = []
            for src, dst in nodes:
                env[dst] = Tensor(self, np.maximum(env[src].view(), 0))
                made.append(env[dst])
            keep = {{id(env[o]) for o in outs}}
            for t in made:
                if id(t) not in keep:
                    self.release(t)
            return [env[o] for o in outs]

        return CompiledGraph(run, info={{"nodes": len(nodes)}})


@hookimpl
def anychip_register_backends(registry) -> None:
    registry.add_backend({cls}())
'''

_PYPROJECT = """[build-system]
requires = ["setuptools>=70.1"]
build-backend = "setuptools.build_meta"

[project]
name = "anychip-{name}"
version = "0.1.0"
description = "The {name} device for anychip"
requires-python = ">=3.10"
dependencies = ["anychip"]

[project.entry-points.anychip]
{name} = "anychip_{name}"

[tool.setuptools]
packages = ["anychip_{name}"]
"""

_TEST = """import numpy as np
from onnx import TensorProto, helper

import anychip
from anychip.conformance import run_kit


def test_the_conformance_kit_passes_in_strict_mode():
    report = run_kit("{name}", strict=True, ops=["Relu"])
    assert report.ok, str(report)


def test_relu_runs_on_{name}():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 5])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = anychip.load(model.SerializeToString(), devices=["{name}", "cpu"], cost_model=False)
    assert sess.placement().by_device() == {{"{name}": 1}}
    xs = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(sess.run(None, {{"x": xs}})[0], np.maximum(xs, 0))
"""

_README = """# anychip-{name}

The `{name}` device for anychip ({style}), made by `anychip new-backend`.

    pip install -e .
    anychip devices                                  # lists {name}
    anychip conformance --device {name} --strict    # the kit
    pytest tests
"""


def new_backend(name: str, graph_mode: bool = False, out_dir: str | Path = ".") -> Path:
    """Write the package ``anychip-NAME`` under ``out_dir``; returns its folder."""
    _check_name(name)
    root = Path(out_dir) / f"anychip-{name}"
    if root.exists():
        raise AnychipError(f"{root} exists already; remove it or choose another -o folder")
    cls = "".join(part.capitalize() for part in name.split("_")) + "Backend"
    values = {"name": name, "cls": cls, "graph_mode": graph_mode}
    body = _COMMON.format(**values) + (_GRAPH if graph_mode else _KERNEL).format(**values)
    style = "graph mode" if graph_mode else "kernel mode"
    files = {
        f"anychip_{name}/__init__.py": body,
        "pyproject.toml": _PYPROJECT.format(**values),
        f"tests/test_{name}.py": _TEST.format(**values),
        "README.md": _README.format(style=style, **values),
    }
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _check_name(name: str) -> None:
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name or "") or keyword.iskeyword(name):
        raise AnychipError(
            f"backend name {name!r} must be a lower-case Python identifier (letters, digits, "
            "underscores; starting with a letter), e.g. 'mychip'"
        )
    from anychip.core.plugin.host import get_registry

    if name in get_registry().backends:
        raise AnychipError(f"a backend named {name!r} is registered already; choose another")
