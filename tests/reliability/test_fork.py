"""Fork safety (issue 47): a child forked while another thread runs a session, after oneDNN's
OpenMP team ran, or after OpenCL was set up, can load and run on the CPU (and on the
accelerators that survive fork), and gets a clear ``DeviceError`` for what cannot run there,
never a hang. Each case forks in a fresh interpreter (``fork_child.py``) whose parent kills a
child that hangs; the interpreter itself runs under a timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


def _fork_case(case: str) -> dict:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "2",  # a real team: a child of a 1-thread parent never hung
        "ANYCHIP_CALIBRATION": "off",
        "FORK_CHILD_TIMEOUT": "60",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
    }
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "reliability" / "fork_child.py"), case],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not result["hung"], f"the child forked in case {case!r} hung"
    assert result["exit"] == 0 and "error" not in result, result
    return result


@pytest.mark.slow  # starts other processes
def test_a_child_forked_while_a_thread_runs_a_session() -> None:
    got = _fork_case("thread")
    assert got["old"].startswith("DeviceError: this session was running in another thread")
    assert got["cpu"] == "same"


@pytest.mark.slow
def test_a_child_forked_after_onednn_ran_on_its_team() -> None:
    got = _fork_case("onednn")
    assert got["old"] == "ran" and got["cpu"] == "same"


@pytest.mark.slow
def test_a_child_forked_after_opencl_was_set_up_gets_a_clear_error() -> None:
    got = _fork_case("opencl")
    assert "does not survive fork" in got["old"], got
    assert "does not survive fork" in got["opencl,cpu"], got
    assert got["cpu"] == "same"


@pytest.mark.slow
@pytest.mark.parametrize("device", ["xpu", "npu"])
def test_a_child_forked_after_a_simulated_device_ran_uses_it(device: str) -> None:
    got = _fork_case(device)
    assert got["old"] == "ran" and got[f"{device},cpu"] == "same" and got["cpu"] == "same"
