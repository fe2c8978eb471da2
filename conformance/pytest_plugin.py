"""The conformance kit as a pytest plugin (entry point ``pytest11``, installed with anychip).

    pytest --anychip-device=mychip [--anychip-strict] [--anychip-ops=Add,Relu]
           [--anychip-bring-up]

adds one test item per ONNX node case the device claims (named after the case, e.g.
``anychip[mychip]::test_add_bcast``) and one per contract check, next to the project's own
tests. Each item is judged by ``report.verdict``, the rule ``anychip conformance`` applies: a
case passes on the device or refused by a constraint the device declared; a fallback it did
not declare passes with a warning unless strict; FAIL and CRASH fail with the kit's detail;
SKIP skips with the reason (the CPU fails that case too).
Without ``--anychip-device`` the plugin adds nothing and imports nothing of anychip.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_collection_modifyitems", "KitCaseItem"]


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("anychip", "anychip conformance kit")
    group.addoption("--anychip-device", default=None, help="run the kit for this device")
    group.addoption(
        "--anychip-strict", action="store_true", help="a fallback of a claimed op fails"
    )
    group.addoption("--anychip-ops", default=None, help="only these op types (comma list)")
    group.addoption(
        "--anychip-bring-up",
        action="store_true",
        help="each device node also compared with the CPU's kernel (anychip conformance "
        "--bring-up)",
    )


class KitFailure(Exception):
    """A kit item failed; the message is the kit's detail."""


class KitCaseItem(pytest.Item):
    """One ONNX node case on the device under test."""

    def __init__(
        self, *, case: Any, device: str, ops: list[str], strict: bool, bring_up: bool, **kw: Any
    ):
        super().__init__(**kw)
        self.case, self.device, self.ops, self.strict = case, device, ops, strict
        self.bring_up = bring_up

    def runtest(self) -> None:
        from anychip.conformance.kit import _quiet, run_case_on
        from anychip.conformance.report import verdict

        with _quiet():
            result = run_case_on(self.case, self.device, self.ops, bring_up=self.bring_up)
        self.user_properties.append(("anychip_status", result.status))
        judged = verdict(result.status, self.strict)  # the rule KitReport.ok applies
        if judged == "skip":
            pytest.skip(result.detail)
        if judged == "fail":
            err = f" max|err|={result.max_error:.3g}" if result.max_error else ""
            raise KitFailure(f"{result.status}{err}: {result.detail}")
        if judged == "warn":
            warnings.warn(f"{self.case.name}: {result.detail}", stacklevel=1)

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, KitFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int, str]:
        return f"anychip[{self.device}]", 0, f"{self.case.name} ({'+'.join(self.ops)})"


class KitContractItem(pytest.Item):
    """One contract check of the device's hooks (copies, memory, capabilities)."""

    def __init__(self, *, device: str, check: str, **kw: Any):
        super().__init__(**kw)
        self.device, self.check = device, check

    def runtest(self) -> None:
        from anychip.conformance.contract import run_check
        from anychip.conformance.kit import _backend
        from anychip.core.plugin.claims import claims_of

        backend = _backend(self.device)
        result = run_check(backend, claims_of(backend), self.check)
        if not result.ok:
            raise KitFailure(f"contract {self.check}: {result.detail}")

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, KitFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[str, int, str]:
        return f"anychip[{self.device}]", 0, f"contract {self.check}"


def pytest_collection_modifyitems(session: Any, config: Any, items: list[Any]) -> None:
    device = config.getoption("anychip_device")
    if not device:
        return
    from anychip.conformance.contract import contract_checks
    from anychip.conformance.kit import _backend, claimed_cases
    from anychip.core.plugin.claims import claims_of

    strict = bool(config.getoption("anychip_strict"))
    raw = config.getoption("anychip_ops")
    ops = [o.strip() for o in raw.split(",") if o.strip()] if raw else None
    backend = _backend(device)
    claims = claims_of(backend)
    for case in claimed_cases(claims, ops, backend.device.dtypes):
        items.append(
            KitCaseItem.from_parent(
                session,
                name=f"anychip[{device}]::{case.name}",
                case=case,
                device=device,
                ops=list(case.ops),
                strict=strict,
                bring_up=bool(config.getoption("anychip_bring_up")),
            )
        )
    for check in contract_checks(backend, claims):
        items.append(
            KitContractItem.from_parent(
                session, name=f"anychip[{device}]::contract::{check}", device=device, check=check
            )
        )
