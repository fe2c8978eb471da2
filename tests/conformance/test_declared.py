"""Declared constraints in the kit: a case a device refuses by a constraint it declared is
REFUSED-AS-DECLARED (a pass, in strict mode too), an undeclared refusal of a claimed op fails
strict mode, and ``anychip conformance`` and ``pytest --anychip-device`` agree case by case."""

from __future__ import annotations

import json

import numpy as np
import pytest

from anychip.cli.main import main
from anychip.conformance import (
    PASS_ON_DEVICE,
    PASS_VIA_FALLBACK,
    REFUSED_AS_DECLARED,
    run_kit,
    verdict,
)
from anychip.core.plugin.backend import Backend, DeviceModel
from anychip.core.plugin.claims import Constraint, claims_of
from anychip.core.plugin.hookspecs import hookimpl
from anychip.core.plugin.host import get_registry, register_plugin, unregister_plugin
from anychip.core.plugin.kernels import KernelTable
from anychip.ir.dtypes import DType

F32 = {DType.FLOAT}


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    assert axis in (-1, x.ndim - 1), "placement gave this device an axis it refuses"
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class _Plugin:
    """A host-memory device whose Softmax runs on the last axis only: declared on its kernel
    (``declared=True``), or refused in ``check_node`` without a word in its claims."""

    def __init__(self, name: str, declared: bool) -> None:
        self.name, self.declared = name, declared

    @hookimpl
    def anychip_register_backends(self, registry):
        declared = self.declared

        class Chip(Backend):
            name = kind = self.name
            priority, host_memory = 5, True

            def device_model(self) -> DeviceModel:
                return DeviceModel(self.name, self.kind, dtypes=frozenset(F32))

            def check_node(self, node):
                if not declared and Constraint.last_axis().holds(node) is False:
                    return "Softmax on the last axis only"
                return None

        registry.add_backend(Chip())

    @hookimpl
    def anychip_register_kernels(self, registry):
        table = KernelTable(self.name)
        constraints = (Constraint.last_axis(),) if self.declared else ()
        table.register("Softmax", since=13, dtypes=F32, constraints=constraints)(_softmax)
        registry.add_kernels(table)


@pytest.fixture
def devices():
    get_registry()
    register_plugin(_Plugin("lastaxisk", declared=True), "test-lastaxisk")
    register_plugin(_Plugin("undeclared", declared=False), "test-undeclared")
    yield "lastaxisk", "undeclared"
    unregister_plugin("test-lastaxisk")
    unregister_plugin("test-undeclared")


def test_the_kernel_tables_constraint_is_in_its_claims_and_devices_ops(devices, capsys):
    from anychip.core.plugin.host import get_registry

    (claim,) = claims_of(get_registry().backends["lastaxisk"])
    assert [c.reason for c in claim.constraints] == ["axis on the last axis only"]
    assert main(["devices", "--ops", "lastaxisk"]) == 0
    assert "only where: axis on the last axis only" in capsys.readouterr().out
    assert main(["devices", "--ops", "lastaxisk", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["constraints"] == ["axis on the last axis only"]


def test_a_declared_refusal_passes_strict_an_undeclared_one_fails(devices):
    declared = run_kit("lastaxisk", strict=True, ops=["Softmax"], contract=False)
    labels = {r.case: r.status for r in declared.results}
    assert labels["test_softmax_axis_2"] == PASS_ON_DEVICE
    assert labels["test_softmax_axis_0"] == REFUSED_AS_DECLARED
    assert labels["test_softmax_axis_1"] == REFUSED_AS_DECLARED
    refused = [r for r in declared.results if r.status == REFUSED_AS_DECLARED]
    assert all("declared constraint: axis on the last axis only" in r.detail for r in refused)
    assert declared.ok, str(declared)
    assert "refused as declared" in str(declared) and "verdict: PASS" in str(declared)

    undeclared = run_kit("undeclared", strict=True, ops=["Softmax"], contract=False)
    labels = {r.case: r.status for r in undeclared.results}
    assert labels["test_softmax_axis_1"] == PASS_VIA_FALLBACK
    assert not undeclared.ok and "verdict: FAIL" in str(undeclared)
    # without --strict the same fallback is allowed (a warning in pytest)
    assert run_kit("undeclared", ops=["Softmax"], contract=False).ok


def test_the_verdict_rule():
    assert verdict(REFUSED_AS_DECLARED, strict=True) == "pass"
    assert verdict(PASS_VIA_FALLBACK, strict=True) == "fail"
    assert verdict(PASS_VIA_FALLBACK, strict=False) == "warn"


class _Outcomes:
    """A pytest plugin recording each kit item's outcome and the kit's label."""

    def __init__(self) -> None:
        self.items: dict[str, tuple[str, str]] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome == "skipped":
            case = report.nodeid.split("::")[-1]
            status = dict(report.user_properties).get("anychip_status", "")
            self.items[case] = (report.outcome, status)


def pytest_kit(device: str, ops: str, strict: bool, folder) -> tuple[int, dict]:
    """Run the pytest plugin in this process on ``device`` (already registered)."""
    outcomes = _Outcomes()
    args = ["-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--rootdir", str(folder)]
    args += [f"--anychip-device={device}", f"--anychip-ops={ops}", "-W", "ignore", str(folder)]
    if strict:
        args.append("--anychip-strict")
    rc = pytest.main(args, plugins=[outcomes])
    return int(rc), outcomes.items


@pytest.mark.parametrize("device", ["lastaxisk", "undeclared"])
def test_the_cli_and_the_pytest_plugin_give_the_same_verdict(devices, device, tmp_path, capsys):
    out = tmp_path / "kit.json"
    cli = main(["conformance", "--device", device, "--ops", "Softmax", "--strict", "--quiet"]
               + ["--json", str(out)])  # fmt: skip
    data = json.loads(out.read_text())
    cases = {c["case"]: c["status"] for c in data["cases"]}
    rc, items = pytest_kit(device, "Softmax", True, tmp_path)
    capsys.readouterr()
    assert (cli == 0) == (rc == 0), (cli, rc, items)
    assert cli == (0 if device == "lastaxisk" else 1)
    contract = {c["name"]: c["ok"] for c in data["contract"]}
    assert {c: o == "passed" for c, (o, s) in items.items() if not s} == contract
    assert {c: s for c, (_, s) in items.items() if s} == cases
    for case, (outcome, status) in items.items():
        if not status:
            continue
        want = {"pass": "passed", "warn": "passed", "fail": "failed", "skip": "skipped"}
        assert outcome == want[verdict(status, strict=True)], (case, outcome, status)
