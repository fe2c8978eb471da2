"""The whole conformance suite on ``xpu,cpu`` and ``npu,cpu``: every case that passes on the
CPU alone passes there too (issue: heterogeneous execution).

Each configuration runs ``tests/test_onnx_backend.py`` in a subprocess with
``ANYCHIP_CONFORMANCE_DEVICES`` set; the failures of each are compared with the CPU run's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import anychip

SUITE = os.path.join(os.path.dirname(__file__), "test_onnx_backend.py")


def _failures(devices: str) -> tuple[set[str], int]:
    env = dict(os.environ, ANYCHIP_CONFORMANCE_DEVICES=devices)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", SUITE, "-q", "-rf", "-p", "no:cacheprovider"],
        capture_output=True,
        text=True,
        env=env,
        cwd=os.path.dirname(os.path.dirname(SUITE)),
        timeout=1800,
    )
    failed = set(re.findall(r"^FAILED \S+::(\w+)", proc.stdout, re.M))
    m = re.search(r"anychip ONNX conformance on \S+: (\d+) passed", proc.stdout)
    assert m, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"{devices}: {m.group(1)} passed, {len(failed)} failed: {sorted(failed)}")
    return failed, int(m.group(1))


@pytest.fixture(scope="module")
def cpu_failures() -> tuple[set[str], int]:
    return _failures("CPU")


@pytest.mark.parametrize("devices", ["xpu,cpu", "npu,cpu"])
def test_every_cpu_pass_passes_on(devices, cpu_failures):
    name = devices.split(",")[0]
    if not any(d.name == name and d.available for d in anychip.devices()):
        pytest.skip(f"{name} is unavailable here")
    failed, passed = _failures(devices)
    cpu_failed, cpu_passed = cpu_failures
    assert failed <= cpu_failed, f"fail on {devices} but pass on cpu: {sorted(failed - cpu_failed)}"
    assert passed >= cpu_passed
