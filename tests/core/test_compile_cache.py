"""Compiled artifacts on disk: a second process does not compile again; a corrupt or foreign
artifact is detected, removed and rebuilt, never loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.core.test_specialize import _mlp

SCRIPT = r"""
import json, sys
import numpy as np
import anychip
model = open(sys.argv[1], "rb").read()
background = sys.argv[2] == "1"
sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False, background_compile=background)
(sp,) = sess.compiled.specialized.values()
outs = []
for n in (3, 5):
    x = np.random.default_rng(n).standard_normal((n, 16)).astype(np.float32)
    sess.run(None, {"x": x})  # may be served by the host while the signature compiles
    sp.wait(60)
    outs.append(sess.run(None, {"x": x})[0].tolist())  # the executable's own numbers
print(json.dumps({"telemetry": sp.telemetry(), "outs": outs}))
"""


def _process(tmp_path: Path, background: bool = False) -> dict:
    model = tmp_path / "mlp.onnx"
    model.write_bytes(_mlp())
    env = {
        "ANYCHIP_CACHE_DIR": str(tmp_path / "cache"),
        "ANYCHIP_COMPILE_CACHE": "1",
        "ANYCHIP_CALIBRATION": "off",
    }
    import os

    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(model), "1" if background else "0"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_a_second_process_loads_from_disk_without_compiling(tmp_path):
    first = _process(tmp_path)
    assert first["telemetry"]["compiles"] == 2 and first["telemetry"]["disk_hits"] == 0
    assert first["telemetry"]["disk"]["stores"] == 2
    second = _process(tmp_path)
    t = second["telemetry"]
    assert t["compiles"] == 0 and t["disk_hits"] == 2 and t["host_runs"] == 0
    assert second["outs"] == first["outs"]  # the same executable, the same numbers


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_with_the_background_compile_the_host_serves_while_the_disk_is_read(tmp_path):
    """Loading and compiling an artifact costs more than a host run (0.95 s against 60 ms on
    ResNet-50): in the background mode the first run of a signature goes to the host and the
    compile thread finds the artifact on disk."""
    first = _process(tmp_path)
    second = _process(tmp_path, background=True)
    t = second["telemetry"]
    assert t["compiles"] == 0 and t["disk_hits"] == 2 and t["host_runs"] == 2
    np.testing.assert_allclose(second["outs"][0], first["outs"][0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign"])
def test_a_corrupt_or_foreign_artifact_is_rebuilt_never_loaded(tmp_path, damage):
    _process(tmp_path)
    files = sorted((tmp_path / "cache" / "compiled").glob("*.bin"))
    assert len(files) == 2
    blob = bytearray(files[0].read_bytes())
    if damage == "flip":
        blob[-10] ^= 0xFF  # payload changed: the digest no longer matches
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    else:  # another artifact's bytes under this name: the key in the header differs
        blob = bytearray(files[1].read_bytes())
    files[0].write_bytes(bytes(blob))
    again = _process(tmp_path)
    t = again["telemetry"]
    assert t["disk"]["rejected"] == 1 and t["compiles"] == 1 and t["disk_hits"] == 1
    assert files[0].exists()  # rebuilt and stored again
