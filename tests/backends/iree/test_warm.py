"""A warm second load, in a second process, compiles nothing: the vmfb comes from anychip's
compile cache and the node probes from their file."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.backends.iree.conftest import backend_or_skip

#: A process's model (MatMul, Tanh; a symbolic batch) with IREE's compiles counted.
MODEL = r"""
import json, sys
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import anychip
from anychip.backends.iree import compiler
calls = []
real = compiler.compile_vmfb
def counted(*a, **k):
    calls.append(1)
    return real(*a, **k)
compiler.compile_vmfb = counted
import anychip.backends.iree.probe as probe
probe.compile_vmfb = counted
rng = np.random.default_rng(0)
w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
g = helper.make_graph(
    [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])],
    "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
"""

SCRIPT = (
    MODEL
    + r"""
s = anychip.load(m, devices=[sys.argv[1]], strict=True)
x = rng.standard_normal((3, 8)).astype(np.float32)
y = s.run(None, {"x": x})[0]
ok = bool(np.allclose(y, np.tanh(x @ numpy_helper.to_array(w)), atol=1e-5))
print(json.dumps({"compiles": len(calls), "ok": ok, "info": s.placement().partitions[0].info}))
"""
)


def _two_processes(script: str, device: str, cache: object) -> list[dict]:
    """``script`` run twice, one process after the other, on one cache folder."""
    env = dict(os.environ, ANYCHIP_CACHE_DIR=str(cache), ANYCHIP_COMPILE_CACHE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    runs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", script, device],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["iree-cpu", "vulkan"])
def test_second_process_compiles_nothing(name, tmp_path):
    backend_or_skip(name)
    runs = _two_processes(SCRIPT, name, tmp_path)
    assert runs[0]["compiles"] >= 1 and runs[0]["ok"]
    assert runs[1]["compiles"] == 0 and runs[1]["ok"], runs[1]
    assert "load_ms" in runs[1]["info"]


BACKGROUND = (
    MODEL
    + r"""
s = anychip.load(m, devices=[sys.argv[1], "cpu"], cost_model=False, background_compile=True)
(sp,) = s.compiled.specialized.values()
ok = True
for n in (3, 3, 5):  # the first on the host; the device's first run is checked, then kept
    x = rng.standard_normal((n, 8)).astype(np.float32)
    y = s.run(None, {"x": x})[0]
    ok = ok and bool(np.allclose(y, np.tanh(x @ numpy_helper.to_array(w)), atol=1e-5))
    sp.wait(300)
print(json.dumps({"compiles": len(calls), "ok": ok, "stats": sp.stats,
                  "stores": sp.disk.stats["stores"] if sp.disk else None}))
"""
)


@pytest.mark.slow
def test_a_background_compile_is_kept_once_its_first_run_is_checked(tmp_path):
    """Decision 046 left a background compile off the disk (nothing had checked it yet): it
    is stored once its first run on the device matched the CPU, and a second process loads
    it instead of compiling."""
    backend_or_skip("iree-cpu")
    runs = _two_processes(BACKGROUND, "iree-cpu", tmp_path)
    assert runs[0]["ok"] and runs[0]["compiles"] >= 1 and runs[0]["stores"] == 1, runs[0]
    assert runs[1]["ok"] and runs[1]["compiles"] == 0, runs[1]
    assert runs[1]["stats"]["disk_hits"] == 1 and runs[1]["stores"] == 0, runs[1]
