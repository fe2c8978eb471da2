"""The compile caches keep each opset's answer (issue 47): a graph-mode partition compiled in
one process and loaded from disk in the next runs every node at its own opset, for the ops
whose semantics or attribute forms changed between opsets, on every graph-mode device set,
against onnxruntime. (Before the renovation the key ignored the opset and the stored
partition had default opset imports: SqueezeNet's Softmax-11 on the NPU gave 1.0.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.opset_models import cases, feed

DEVICE_SETS = ["npu,cpu", "ort:cpu,cpu", "openvino:cpu,cpu"]

_SCRIPT = r"""
import json, sys, warnings
import numpy as np
warnings.simplefilter("ignore")
import anychip
from anychip.backends.npu_stub import compiler
from tests.reliability.opset_models import cases, feed

available = {d.name for d in anychip.devices() if d.available}
out = {}
for name, model in cases().items():
    for devices in sys.argv[1:]:
        names = devices.split(",")
        if not set(names) <= available:
            continue
        sess = anychip.load(model, devices=names, cost_model=False)
        ys = [sess.run(None, {"x": feed(seed)})[0].tolist() for seed in range(2)]
        out[name + "@" + devices] = {"ys": ys, "placed": sess.placement().by_device()}
print(json.dumps({"runs": out, "npu": dict(compiler.STATS)}))
"""


def _process(cache: Path) -> dict:
    env = {
        **os.environ,
        "ANYCHIP_CACHE_DIR": str(cache),
        "ANYCHIP_COMPILE_CACHE": "1",
        "ANYCHIP_CALIBRATION": "off",
        "ANYCHIP_BACKGROUND_COMPILE": "0",
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), *sys.path]),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, *DEVICE_SETS],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=Path(__file__).parents[2],
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts other processes
def test_a_second_process_runs_each_opset_from_the_cache_as_onnxruntime(tmp_path: Path) -> None:
    ort = pytest.importorskip("onnxruntime")
    first = _process(tmp_path / "cache")
    second = _process(tmp_path / "cache")
    assert first["npu"]["compiles"] > 0
    # (the first process may load an artifact it wrote itself: partitions alike in two models)
    assert second["npu"] == {"compiles": 0, "loads": sum(first["npu"].values())}
    assert set(second["runs"]) == set(first["runs"])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for name, model in cases().items():
        sess = ort.InferenceSession(model.SerializeToString(), options)
        for key in [k for k in second["runs"] if k.startswith(name + "@")]:
            device = key.split("@")[1].split(",")[0]
            assert device in second["runs"][key]["placed"], (key, second["runs"][key])
            for seed, got in enumerate(second["runs"][key]["ys"]):
                (want,) = sess.run(None, {"x": feed(seed)})
                np.testing.assert_allclose(
                    np.asarray(got, np.float32), want, rtol=1e-5, atol=1e-5, err_msg=key
                )
