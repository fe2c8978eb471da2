"""A process that exits while a device is calibrated in the background exits cleanly: the
calibration stops after its probe call in flight and is joined at exit (before, OpenVINO's
CPU plugin still compiling a probe at interpreter shutdown aborted the process)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from anychip.core.plan import calibration, calibration_background

ROOT = Path(__file__).resolve().parents[2]

_CHILD = """
import sys, threading
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import anychip
w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 64), np.float32), "w")
g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], [w])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
anychip.load(m, ["cpu"])
anychip.load(m, [sys.argv[1]])
names = [t.name for t in threading.enumerate()]
print("calibrating" if any(n.startswith("anychip-calibrate") for n in names) else "idle")
"""


@pytest.mark.skipif(importlib.util.find_spec("openvino") is None, reason="OpenVINO not installed")
def test_exit_during_a_background_calibration_of_openvino_is_clean(tmp_path: Path) -> None:
    env = dict(
        os.environ, ANYCHIP_CACHE_DIR=str(tmp_path), ANYCHIP_CALIBRATION="auto",
        ANYCHIP_COMPILE_CACHE="1",
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, "openvino:cpu"], env=env, capture_output=True,
        text=True, timeout=300, cwd=str(ROOT.parent),
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert "terminate called" not in done.stderr
    assert done.stdout.strip() == "calibrating"  # the case this test is about happened


def test_stop_ends_a_calibration_between_probe_calls(monkeypatch) -> None:
    calls = []

    def probe() -> None:
        calls.append(1)
        if len(calls) == 3:
            calibration.STOP.set()

    monkeypatch.setattr(calibration, "STOP", threading.Event())
    with pytest.raises(calibration.CalibrationStopped):
        calibration.best_of(probe, repeat=10)
    assert len(calls) == 3  # the call in flight finished, no other began


def test_the_exit_handler_stops_and_joins_running_threads(monkeypatch) -> None:
    stop = threading.Event()
    monkeypatch.setattr(calibration_background, "STOP", stop)
    started = threading.Event()

    def work() -> None:
        started.set()
        stop.wait(30)

    t = threading.Thread(target=work, daemon=True)
    monkeypatch.setattr(calibration_background, "_running", {"x": t})
    t.start()
    started.wait(5)
    calibration_background._stop_at_exit()
    assert stop.is_set() and not t.is_alive()


def test_an_interrupted_calibration_is_resumed_by_the_next_process(tmp_path, monkeypatch):
    """A short process ends its background calibration midway: the probes it measured are kept
    beside the calibration file, and the next one measures only the rest (a short script's
    device is calibrated after a few processes, not never); placement reads the complete file
    only."""
    from anychip.core.plugin.host import get_registry

    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    cpu = get_registry().backends["cpu"]
    measured: list[str] = []
    stop_after = [3]

    def measure(backend, cls, repeat):
        if len(measured) == stop_after[0]:
            raise calibration.CalibrationStopped  # the process exits here
        measured.append(cls)
        return [(1e3, 1e-6 * len(measured))] if cls in ("matmul", "conv", "linear") else []

    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_class", measure)
    monkeypatch.setattr("anychip.core.plan.calibration_probes.measure_link", lambda b, r: None)
    calibration_background._measure_and_merge(cpu, None)
    assert calibration.load_calibration(cpu) is None  # not complete: placement reads nothing
    partial = calibration_background.PartialFile(cpu)
    assert partial.resumed == 3
    first = list(measured)
    stop_after[0] = 10**6
    calibration_background._measure_and_merge(cpu, None)
    total = calibration.SWEEPS * len(calibration.keys())
    assert len(measured) == total  # the 3 kept, the rest measured, none twice
    assert measured[:3] == first
    cal = calibration.load_calibration(cpu)
    assert cal is not None and set(cal.points) >= {"matmul", "conv", "linear"}
    assert not partial.path.exists()  # complete: the partial file is gone


def test_a_partial_file_of_another_key_or_corrupt_is_ignored(tmp_path, monkeypatch):
    from anychip.core.plugin.host import get_registry

    monkeypatch.setenv("ANYCHIP_CACHE_DIR", str(tmp_path))
    cpu = get_registry().backends["cpu"]
    p = calibration_background.PartialFile(cpu)
    p.put(0, "matmul", [(1.0, 2.0)])
    assert calibration_background.PartialFile(cpu).get(0, "matmul") == [(1.0, 2.0)]
    p.path.write_text(p.path.read_text().replace(p.key, "another"))
    assert calibration_background.PartialFile(cpu).resumed == 0
    p.path.write_text("{not json")
    assert calibration_background.PartialFile(cpu).resumed == 0 and not p.path.exists()
    calibration_background.PartialFile(cpu).put(1, "conv", [(1.0, 2.0)])
    assert calibration.clear_calibrations() == 0 and not p.path.exists()
