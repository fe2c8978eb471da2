"""The conformance summary in tests/conftest.py fails a run whose accelerator set passed by
placing almost nothing on its accelerator (the guarantee that passes are not CPU fallbacks)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import _ConformanceSummary


def _report(devices: str, placed: dict[str, int], passed: bool = True) -> SimpleNamespace:
    return SimpleNamespace(
        user_properties=[("anychip_devices", devices), ("anychip_placed", placed)],
        when="call",
        passed=passed,
        skipped=False,
    )


def test_a_set_that_falls_back_almost_entirely_is_a_problem() -> None:
    summary = _ConformanceSummary()
    for _ in range(600):
        summary.pytest_runtest_logreport(_report("xpu,cpu", {"xpu": 1, "cpu": 1}))
        summary.pytest_runtest_logreport(_report("npu,cpu", {"npu": 0, "cpu": 2}))
    assert summary.outcomes["xpu,cpu"]["passed"] == 600
    assert summary.problems() == ["npu,cpu: only 0% of the cases' nodes ran on npu"]


def test_a_subset_run_is_not_judged() -> None:
    summary = _ConformanceSummary()
    summary.pytest_runtest_logreport(_report("npu,cpu", {"cpu": 5}))
    assert summary.problems() == []
