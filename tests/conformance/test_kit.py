"""The conformance kit: its labels on the simulated XPU and NPU, and a deliberately wrong
plugin (``badchip.py``) caught in each way it can be wrong."""

from __future__ import annotations

import json
import sys

import pytest

from anychip.cli.main import main
from anychip.conformance import (
    CRASH,
    FAIL,
    PASS_ON_DEVICE,
    PASS_VIA_FALLBACK,
    REFUSED_AS_DECLARED,
    run_kit,
)
from anychip.core.plugin.host import register_plugin, unregister_plugin
from tests.conformance import badchip


@pytest.fixture
def chip():
    """badchip registered as a plugin, in mode "ok"; each test switches the mode it needs."""
    badchip.CHIP.mode = "ok"
    badchip.CHIP._pool = None
    register_plugin(badchip, "badchip")
    yield badchip.CHIP
    unregister_plugin("badchip")
    badchip.CHIP.mode = "ok"


def _statuses(report):
    return {r.case: r.status for r in report.results}


def test_a_correct_plugin_passes_strict(chip):
    report = run_kit("badchip", strict=True)
    assert report.ok, str(report)
    counts = report.counts()
    assert counts[PASS_ON_DEVICE] >= 3 and counts[PASS_VIA_FALLBACK] == 0
    assert {r.op for r in report.results} == {"Relu", "Add", "Reshape"}
    assert all(c.ok for c in report.contract), report.contract


@pytest.mark.parametrize(
    "mode,words",
    [
        ("wrong_result", "Mismatched"),
        ("wrong_dtype", "float64"),
        ("wrong_shape", "shape"),
    ],
)
def test_a_wrong_kernel_fails_its_cases(chip, mode, words):
    chip.mode = mode
    report = run_kit("badchip", ops=["Relu"])
    assert not report.ok
    relu = [r for r in report.results if r.op == "Relu"]
    assert relu and all(r.status in (FAIL, CRASH) for r in relu), _statuses(report)
    assert any(words in r.detail for r in relu), [r.detail for r in relu]
    # The runtime releases a rejected kernel output: no device memory is left behind.
    assert {c.name: c for c in report.contract}["memory"].ok, report.contract


def test_a_copy_that_loses_bytes_fails_the_contract(chip):
    chip.mode = "lossy_copy"
    report = run_kit("badchip", ops=["Relu"])
    copies = {c.name: c for c in report.contract}["copies/f32"]
    assert not copies.ok and "changed in transit" in copies.detail
    assert not report.ok


def test_a_capability_claimed_with_no_kernel_fails_the_contract(chip):
    chip.mode = "phantom_claim"
    report = run_kit("badchip", ops=["Relu"])
    caps = {c.name: c for c in report.contract}["capabilities"]
    assert not caps.ok and "Sigmoid" in caps.detail and "no kernel" in caps.detail


def test_a_pool_that_leaks_fails_the_contract(chip):
    chip.mode = "leak"
    report = run_kit("badchip", ops=["Relu"])
    checks = {c.name: c for c in report.contract}
    assert not checks["memory"].ok or not checks["copies/f32"].ok
    assert "release" in checks["copies/f32"].detail
    assert not report.ok


def test_xpu_labels_on_device_and_refused_as_declared():
    report = run_kit("xpu", ops=["Max", "Relu"])
    status = _statuses(report)
    assert status["test_relu"] == PASS_ON_DEVICE
    # The XPU's Max takes two inputs, declared: a three-input Max is refused as declared.
    assert status["test_max_example"] == REFUSED_AS_DECLARED
    assert report.ok
    assert run_kit("xpu", ops=["Max"], strict=True, contract=False).ok


def test_an_undeclared_refusal_falls_back_and_fails_strict(chip):
    chip.mode = "undeclared_refusal"
    report = run_kit("badchip", ops=["Add"], contract=False)
    assert report.ok and PASS_VIA_FALLBACK in set(_statuses(report).values())
    strict = run_kit("badchip", ops=["Add"], strict=True, contract=False)
    assert not strict.ok and all(r.op == "Add" for r in strict.failures)


def test_cli_writes_json_and_sets_the_exit_status(tmp_path, capsys, chip):
    out = tmp_path / "kit.json"
    assert main(["conformance", "--device", "xpu", "--ops", "Relu", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ok"] and data["counts"][PASS_ON_DEVICE] >= 1
    chip.mode = "undeclared_refusal"
    assert main(["conformance", "--device", "badchip", "--ops", "Add", "--strict", "--quiet"]) == 1
    assert "verdict: FAIL" in capsys.readouterr().out
    assert main(["conformance", "--device", "no-such-chip"]) == 2


@pytest.mark.slow  # starts other processes: the slow tier (pyproject.toml, markers)
def test_the_pytest_plugin_runs_the_kit(tmp_path):
    import subprocess
    from pathlib import Path

    # badchip, refusing Add in check_node without declaring it, registered by a conftest
    root = Path(__file__).resolve().parents[2]
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(root.parent)!r})\n"
        f"sys.path.insert(0, {str(root)!r})\n"
        "from anychip.core.plugin.host import register_plugin\n"
        "from tests.conformance import badchip\n"
        "badchip.CHIP.mode = 'undeclared_refusal'\n"
        "register_plugin(badchip, 'badchip')\n"
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            "0",
            "--anychip-device=badchip",
            "--anychip-ops=Add,Relu",
            "--anychip-strict",
            "--rootdir",
            str(tmp_path),
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert "anychip[badchip]::test_add" in proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "failed" in proc.stdout and "passed" in proc.stdout


def test_the_toychip_example_passes_the_kit_in_strict_mode():
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "examples" / "anychip-toychip"
    sys.path.insert(0, str(folder))
    try:
        import anychip_toychip

        register_plugin(anychip_toychip, "toychip")
        report = run_kit("toychip", strict=True)
    finally:
        unregister_plugin("toychip")
        sys.path.remove(str(folder))
    assert report.ok, str(report)
    assert {r.op for r in report.results} == {"Add", "Mul", "Relu", "MatMul", "Softmax"}
    assert report.counts()[PASS_ON_DEVICE] == len(report.results)


def test_a_refusal_by_a_declared_constraint_is_counted_apart_and_passes_strict():
    """The last-axis Softmax chip of tests/core/test_constraints.py: Softmax cases on another
    axis run on the cpu, refused as declared, and strict mode passes; the count says so."""
    from anychip.conformance import REFUSED_AS_DECLARED
    from tests.core.test_constraints import _Plugin

    register_plugin(_Plugin(), "test-lastaxis")
    try:
        report = run_kit("lastaxis", ops=["Softmax"], strict=True, contract=False)
    finally:
        unregister_plugin("test-lastaxis")
    status = _statuses(report)
    assert status["test_softmax_axis_2"] == PASS_ON_DEVICE
    assert status["test_softmax_axis_0"] == REFUSED_AS_DECLARED
    refused = next(r for r in report.results if r.case == "test_softmax_axis_0")
    assert "declared constraint: axis on the last axis only" in refused.detail
    assert report.ok and report.counts()[PASS_VIA_FALLBACK] == 0, str(report)
    assert "refused as declared" in report.table()
