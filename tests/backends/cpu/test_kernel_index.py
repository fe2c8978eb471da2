"""The CPU's index of its kernel modules (``backends/cpu/kernel_index.py``): exactly what
importing every module registers, so a fresh process imports only the modules of the ops its
model uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Looks up every op of the index in the registry's CPU table (no iteration: that would import
# everything), then prints the kernels it holds and the kernel modules imported.
_LOOKUPS = """
import json, sys
from anychip.backends.cpu import kernel_index
from anychip.core.plugin.host import get_registry

table = get_registry(["cpu"]).kernel_table("cpu")
index = kernel_index._read(kernel_index.index_path())
if {lookups}:
    for keys in (index or {{}}).values():
        for domain, op in keys:
            table.lookup(domain, op, 1)
    rows = sorted(
        [k.domain, k.op_type, k.since, k.fn.__module__, k.fn.__qualname__]
        for k in table._loaded()
    )
else:
    rows = sorted([k.domain, k.op_type, k.since, k.fn.__module__, k.fn.__qualname__] for k in table)
mods = [n for n in sys.modules if n.startswith("anychip.backends.cpu.kernels.op_")]
print(json.dumps({{"indexed": index is not None, "rows": rows, "modules": len(mods)}}))
"""

_RUN = """
import json, sys
import numpy as np
import anychip
from onnx import TensorProto, helper

x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
nodes = [helper.make_node("Add", ["x", "x"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
graph = helper.make_graph(nodes, "g", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
feed = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
(out,) = anychip.load(model.SerializeToString(), ["cpu"]).run(None, {"x": feed})
np.testing.assert_array_equal(out, np.maximum(feed + feed, 0))
mods = [n for n in sys.modules if n.startswith("anychip.backends.cpu.kernels.op_")]
print(json.dumps({"modules": len(mods)}))
"""


def _python(code: str, cache: Path, **env: str) -> dict:
    full = {**os.environ, "ANYCHIP_CACHE_DIR": str(cache), **env}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_index_holds_what_importing_every_module_registers(tmp_path: Path) -> None:
    # The first process writes the index (importing everything); the second defers every
    # module and finds, by looking each indexed op up, the same kernels as an eager process
    # (a kernel whose module the index missed would be absent). In other processes: importing
    # every kernel module here changes what later tests of this process compute.
    eager = _python(_LOOKUPS.format(lookups=False), tmp_path, ANYCHIP_LAZY_KERNELS="0")
    first = _python(_LOOKUPS.format(lookups=False), tmp_path)
    lazy = _python(_LOOKUPS.format(lookups=True), tmp_path)
    assert not eager["indexed"] and lazy["indexed"]
    assert first["rows"] == eager["rows"]
    assert lazy["rows"] == eager["rows"]


@pytest.mark.slow
def test_a_small_model_imports_few_kernel_modules(tmp_path: Path) -> None:
    first = _python(_RUN, tmp_path)  # writes the index: every module imported
    second = _python(_RUN, tmp_path)
    assert first["modules"] > 90
    # Add and Relu, plus what oneDNN's kernels and the CPU's passes import for themselves
    assert second["modules"] < 30, second


def test_the_cpu_model_is_read_without_a_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    # platform.processor() runs `uname -p`: the first load asks /proc/cpuinfo first
    import platform

    from anychip.backends.cpu import features

    if not os.path.exists("/proc/cpuinfo"):
        pytest.skip("no /proc/cpuinfo here")

    def no_subprocess() -> str:
        raise AssertionError("platform.processor() called")

    monkeypatch.setattr(platform, "processor", no_subprocess)
    features._cpuinfo.cache_clear()
    try:
        assert features.cpu_model()
    finally:
        features._cpuinfo.cache_clear()
