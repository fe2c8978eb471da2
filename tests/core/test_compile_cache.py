"""Compiled artifacts on disk: a second process does not compile again; a corrupt or foreign
artifact is detected, removed and rebuilt, never loaded."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto

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
    """Loading an executable costs more than a host run (0.4-0.6 s against 60 ms on the light
    ResNet-50): in the background mode the first run of a signature goes to the host and the
    compile thread finds the executable on disk."""
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


# -- graph-mode executables as bytes: the NPU loads them, never compiles (disk cache on) ----------
HETERO = r"""
import json, sys
import numpy as np
import anychip
from anychip.backends.npu_stub import compiler
model = open(sys.argv[1], "rb").read()
sess = anychip.load(model, devices=["npu", "cpu"], cost_model=False)
outs = []
for seed in (0, 1):
    x = np.random.default_rng(seed).standard_normal((2, 3, 16, 16)).astype(np.float32)
    sess.run(None, {"x": x})  # a new signature's first run may be the host's (its trace)
    outs.append(sess.run(None, {"x": x})[0].tolist())
print(json.dumps({"stats": compiler.STATS, "placed": sess.placement().by_device(), "outs": outs}))
"""


def _hetero_model(batch: int | str) -> bytes:
    from onnx import helper as h

    from tests.backends.npu_stub.conftest import convnet

    # Sin is not an NPU op: NPU, CPU, NPU partitions.
    return convnet([h.make_node("Sin", ["p1"], ["m"], name="sin")], batch).SerializeToString()


def _ort(model: bytes, feeds: dict) -> list[np.ndarray]:
    import onnxruntime as ort

    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feeds)


def _hetero_process(tmp_path: Path, model: Path) -> dict:
    import os

    env = {
        **os.environ,
        "ANYCHIP_CACHE_DIR": str(tmp_path / "cache"),
        "ANYCHIP_COMPILE_CACHE": "1",
        "ANYCHIP_CALIBRATION": "off",
        "ANYCHIP_BACKGROUND_COMPILE": "0",
    }
    proc = subprocess.run(
        [sys.executable, "-c", HETERO, str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
@pytest.mark.parametrize("batch", [2, "N"], ids=["static", "specialized"])
def test_a_second_process_on_npu_cpu_loads_every_npu_partition_and_compiles_none(tmp_path, batch):
    model = tmp_path / "convnet.onnx"
    model.write_bytes(_hetero_model(batch))
    first = _hetero_process(tmp_path, model)
    assert first["placed"]["npu"] > 0 and first["placed"]["cpu"] == 1
    compiled = first["stats"]["compiles"]
    assert compiled == 2 and first["stats"]["loads"] == 0  # the two NPU partitions
    second = _hetero_process(tmp_path, model)
    assert second["stats"] == {"compiles": 0, "loads": compiled}
    for seed, got in enumerate(second["outs"]):
        x = np.random.default_rng(seed).standard_normal((2, 3, 16, 16)).astype(np.float32)
        (want,) = _ort(model.read_bytes(), {"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert second["outs"] == first["outs"]  # the same executables, the same bits


def _softmax_model(opset: int) -> bytes:
    """MatMul then Softmax on axis 1 of a 3-D tensor: before opset 13 Softmax normalizes over
    the flattened dimensions from the axis on, from 13 over that axis alone."""
    from onnx import helper as h
    from onnx import numpy_helper

    w = np.random.default_rng(7).standard_normal((4, 6)).astype(np.float32)
    nodes = [
        h.make_node("MatMul", ["x", "w"], ["m"]),
        h.make_node("Softmax", ["m"], ["y"], axis=1),
    ]
    graph = h.make_graph(
        nodes,
        "softmax",
        [h.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 6])],
        [numpy_helper.from_array(w, "w")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
    model.ir_version = 7
    return model.SerializeToString()


@pytest.fixture
def disk_cache(tmp_path, monkeypatch) -> Path:
    """The compile cache on, in a folder of this test's own."""
    monkeypatch.setenv("ANYCHIP_COMPILE_CACHE", "1")
    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "compiled"


def _npu_run(model: bytes, x: np.ndarray) -> tuple[np.ndarray, dict]:
    import anychip
    from anychip.backends.npu_stub import compiler

    before = dict(compiler.STATS)
    sess = anychip.load(model, devices=["npu"], cost_model=False, background_compile=False)
    assert sess.placement().by_device() == {"npu": 2}
    y = sess.run(None, {"x": x})[0]
    return y, {k: compiler.STATS[k] - before[k] for k in before}


def test_an_opset_11_softmax_from_a_warm_cache_keeps_its_opset(disk_cache):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    old = _softmax_model(11)
    (want,) = _ort(old, {"x": x})
    cold, counts = _npu_run(old, x)
    assert counts == {"compiles": 1, "loads": 0}
    warm, counts = _npu_run(old, x)
    assert counts == {"compiles": 0, "loads": 1}
    np.testing.assert_allclose(cold, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(warm, want, rtol=1e-5, atol=1e-6)
    # The same graph at opset 13 (Softmax over axis 1 alone) is another artifact.
    new = _softmax_model(13)
    (want13,) = _ort(new, {"x": x})
    got, counts = _npu_run(new, x)
    assert counts == {"compiles": 1, "loads": 0}
    np.testing.assert_allclose(got, want13, rtol=1e-5, atol=1e-6)
    assert not np.allclose(want13, want)  # the two opsets really differ here
    assert len(list(disk_cache.glob("*.bin"))) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "foreign", "refused", "empty"])
def test_a_corrupt_artifact_is_compiled_again_with_the_right_answer(disk_cache, damage, caplog):
    from anychip.core.compile.cache import DiskCache

    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    model = _softmax_model(11)
    (want,) = _ort(model, {"x": x})
    _npu_run(model, x)
    (path,) = disk_cache.glob("*.bin")
    _npu_run(_softmax_model(13), x)  # another artifact, for "foreign"
    (other,) = set(disk_cache.glob("*.bin")) - {path}
    blob = bytearray(path.read_bytes())
    if damage == "flip":
        blob[-7] ^= 0x10  # one bit of the weights
    elif damage == "truncate":
        del blob[len(blob) // 2 :]
    elif damage == "foreign":
        blob = bytearray(other.read_bytes())  # the header names another key
    elif damage == "empty":
        blob = bytearray()
    if damage == "refused":  # the cache's header and digest are right; the NPU refuses it
        DiskCache(disk_cache).store(path.stem, b"not an NPU program")
    else:
        path.write_bytes(bytes(blob))
    with caplog.at_level("WARNING", logger="anychip"):
        got, counts = _npu_run(model, x)
    assert counts == {"compiles": 1, "loads": 0}
    assert "corrupt or foreign" in caplog.text
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    again, counts = _npu_run(model, x)  # stored again, whole
    assert counts == {"compiles": 0, "loads": 1}
    np.testing.assert_array_equal(again, got)
