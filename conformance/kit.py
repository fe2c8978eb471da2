"""Run the ONNX node cases a device claims and label each: on the device, via fallback, or not.

For every bundled node case with at least one node the device claims (``claims.py``), the
case runs on ``[device, "cpu"]`` with the cost model off (so every node the device accepts
goes to it) and its outputs are compared with the case's expected outputs, within the case's
tolerances. The label:

* ``PASS-ON-DEVICE``: right outputs, and every claimed node ran on the device;
* ``REFUSED-AS-DECLARED``: right outputs, and each claimed node that ran on another device was
  refused by a constraint the device declared on its claim (``declared constraint: ...``, the
  reason is kept) or by a dtype its ``DeviceModel`` leaves out; not a failure, in strict mode
  either;
* ``PASS-VIA-FALLBACK``: right outputs, but a claimed node ran on another device for another
  reason (the reason placement gave is kept); in strict mode this fails the kit;
* ``FAIL``: wrong outputs (largest difference, and whether the CPU alone gets them right);
* ``CRASH``: load or run raised (the error is kept);
* ``SKIP``: the CPU alone does not pass the case either, so it says nothing of the device.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from anychip.conformance.cases import NodeCase, all_cases, load_case, max_error
from anychip.conformance.contract import in_use, run_contract
from anychip.conformance.report import (
    CRASH,
    FAIL,
    PASS_ON_DEVICE,
    PASS_VIA_FALLBACK,
    REFUSED_AS_DECLARED,
    SKIP,
    CaseResult,
    KitReport,
)
from anychip.core.plugin.claims import OpClaim, claims_of
from anychip.core.report.placement import quiet_fallbacks
from anychip.errors import DeviceError
from anychip.ir.dtypes import ALL_TYPES

__all__ = ["run_kit", "run_case_on", "claimed_cases"]

#: Cases whose expected outputs cannot be met by any backend (documented in the test suite).
EXCLUDED = {"test_squeezenet": "the expected output hangs on equal 1e10 logits"}


def _case_nodes(model: Any) -> list[tuple[str, str, int, list[Any]]]:
    """(domain, op, opset version, input dtypes or None where unknown) of each top-level
    node."""
    from anychip.ir.dtypes import DType

    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    types = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in model.graph.initializer:
        types[t.name] = t.data_type

    def dtype(name: str) -> Any:
        try:
            return DType(types[name]) if types.get(name) else None
        except ValueError:
            return None

    out = []
    for n in model.graph.node:
        domain = "" if n.domain == "ai.onnx" else n.domain
        out.append((domain, n.op_type, versions.get(domain, 1), [dtype(i) for i in n.input if i]))
    return out


def _claimed(claims: list[OpClaim], device_dtypes: Any, node: tuple) -> bool:
    """A node is claimed when a claim covers its op, version and type-constrained input, and
    the device computes every input dtype the node has."""
    domain, op, version, dtypes = node
    for c in claims:
        first = dtypes[c.dtype_input] if c.dtype_input < len(dtypes) else None
        if c.covers(domain, op, version, first):
            return all(d is None or d in device_dtypes for d in dtypes)
    return False


@functools.lru_cache(maxsize=1)
def _op_names() -> list[tuple[str, str]]:
    """(spelling in case names, op type) for every ONNX op, longest spelling first."""
    import onnx.defs

    out = set()
    for schema in onnx.defs.get_all_schemas_with_history():
        op = schema.name
        out.add((re.sub(r"(?<!^)(?=[A-Z][a-z])", "_", op).lower(), op))
        out.add((op.lower(), op))
    return sorted(out, key=lambda t: -len(t[0]))


def primary_op(name: str, nodes: list[tuple[str, str, int, list[Any]]]) -> str | None:
    """The op a case tests: its only node's op, else the op its name starts with."""
    top = [op for _, op, _, _ in nodes if op != "Constant"]
    if len(set(top)) == 1:
        return top[0]
    rest = name.removeprefix("test_")
    for spelling, op in _op_names():
        if rest == spelling or rest.startswith(spelling + "_"):
            return op
    return None


def claimed_cases(
    claims: list[OpClaim], ops: Sequence[str] | None = None, device_dtypes: Any = ALL_TYPES
) -> Iterator[tuple[NodeCase, Any, list[str]]]:
    """``(case, model, [op])`` for each node case whose op (``primary_op``) the device claims
    at the case's opset and dtype (restricted to ``ops`` when given)."""
    import onnx

    wanted = set(ops) if ops else None
    claimed_ops = {c.op for c in claims}
    for case in all_cases("node"):
        if case.name in EXCLUDED:
            continue
        if case.model is not None and case.model_dir is None:
            model = case.model
        else:
            model = onnx.load(f"{case.model_dir}/model.onnx", load_external_data=False)
        nodes = _case_nodes(model)
        op = primary_op(case.name, nodes)
        if op is None or op not in claimed_ops or (wanted is not None and op not in wanted):
            continue
        # An ``_expanded`` case has no node of its op (its function body stands in): it
        # tests the body's ops, which have cases of their own.
        if any(_claimed(claims, device_dtypes, n) for n in nodes if n[1] == op):
            yield case, model, [op]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No fallback warnings or numpy warnings per case: the report carries the facts."""
    with quiet_fallbacks(), warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


def _run(case: NodeCase, devices: list[str]) -> tuple[bool, float, str, Any]:
    """Run every data set of ``case``; ``(ok, max error, why, placement report)``."""
    import anychip

    model, sets = load_case(case)
    sess = anychip.load(
        model,
        devices=devices,
        cost_model=False,
        optimize=False,
        failover=False,
        background_compile=False,  # the device compiles now: every case runs on it
    )
    names = [i.name for i in sess.inputs]
    ok, worst, why = True, 0.0, ""
    for ins, outs in sets:
        got = sess.run(None, dict(zip(names, ins)))
        good, err, msg = max_error(got, outs, case.rtol, case.atol)
        worst = max(worst, err)
        if not good and ok:
            ok, why = False, msg
    return ok, worst, why, sess.placement()


def _cpu_passes(case: NodeCase) -> tuple[bool, str]:
    try:
        ok, _, why, _ = _run(case, ["cpu"])
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return ok, why


def run_case_on(case: NodeCase, device: str, claimed: list[str]) -> CaseResult:
    """Run one case on ``[device, "cpu"]`` and label it."""
    t0 = time.perf_counter()
    op = claimed[0] if len(claimed) == 1 else "+".join(claimed)
    devices = [device] if device == "cpu" else [device, "cpu"]
    try:
        ok, err, why, report = _run(case, devices)
    except Exception as e:
        cpu_ok, cpu_why = _cpu_passes(case) if device != "cpu" else (False, "")
        if not cpu_ok:
            return CaseResult(case.name, op, SKIP, detail=f"the CPU fails too: {cpu_why}"[:300])
        detail = f"{type(e).__name__}: {' '.join(str(e).split())}"[:400]
        return CaseResult(case.name, op, CRASH, detail=detail, seconds=time.perf_counter() - t0)
    if not ok:
        cpu_ok, cpu_why = _cpu_passes(case) if device != "cpu" else (False, why)
        if not cpu_ok:
            return CaseResult(case.name, op, SKIP, detail=f"the CPU fails too: {cpu_why}"[:300])
        detail = f"{why} (the CPU alone passes)"
        return CaseResult(case.name, op, FAIL, max_error=err, detail=detail)
    fell = [
        f"{n.op_type} on {n.device}: {n.reason}"
        for n in report.nodes
        if n.op_type in claimed and n.device != device
    ]
    on = sum(1 for n in report.nodes if n.device == device)
    refused = [n for n in report.nodes if n.op_type in claimed and n.device != device]
    if not fell:
        status = PASS_ON_DEVICE
    elif all(_declared(n.reason, device) for n in refused):
        status = REFUSED_AS_DECLARED
    else:
        status = PASS_VIA_FALLBACK
    return CaseResult(
        case.name,
        op,
        status,
        max_error=err,
        detail="; ".join(fell)[:400],
        nodes_on_device=on,
        nodes=len(report.nodes),
        seconds=time.perf_counter() - t0,
    )


def _declared(reason: str, device: str) -> bool:
    """Whether placement's reason is a refusal ``device`` declared as data: a constraint of
    its claim (``<device>: declared constraint: ...``) or a dtype its ``DeviceModel`` leaves
    out (``<device>: dtype f64 not supported by <device>``: a Cast to float64 claimed for its
    float32 input)."""
    return f"{device}: declared constraint:" in reason or (
        f"not supported by {device}" in reason and f"{device}: dtype " in reason
    )


def _backend(device: str) -> Any:
    import anychip
    from anychip.core.plugin.host import get_registry

    registry = get_registry([device])
    backend = registry.backends.get(device)
    if backend is None:
        names = ", ".join(sorted(registry.backends))
        raise DeviceError(
            f"no device {device!r} is registered (have: {names}); install its plugin, and see "
            "`anychip devices` for plugins that failed to load"
        )
    ok, why = backend.available()
    if not ok:
        raise DeviceError(f"device {device!r} is not available here: {why}")
    anychip.devices()  # loads every plugin once, outside the timed cases
    return backend


def run_kit(
    device: str,
    *,
    strict: bool = False,
    ops: Sequence[str] | None = None,
    contract: bool = True,
    progress: Callable[[int, int, CaseResult], None] | None = None,
) -> KitReport:
    """Run the conformance kit for ``device``; see the module docstring for the labels.

    Args:
        device: a registered, available device name (``xpu``, ``npu``, ``toychip``).
        strict: a fallback of a claimed op fails the kit (``KitReport.ok`` is False).
        ops: only the cases of these op types.
        contract: also run the contract tests of the backend's hooks (``contract.py``).
        progress: called after each case with ``(done, total, result)``.
    """
    device = device.strip().lower()  # device names are case-insensitive (openvino:CPU)
    backend = _backend(device)
    claims = claims_of(backend)
    report = KitReport(device, strict=strict, claims=claims)
    stats_before = in_use(backend)
    with _quiet():
        selected = list(claimed_cases(claims, ops, backend.device.dtypes))
        for i, (case, _model, claimed) in enumerate(selected, 1):
            result = run_case_on(case, device, claimed)
            report.results.append(result)
            if progress is not None:
                progress(i, len(selected), result)
        gc.collect()
        if contract:
            report.contract.extend(run_contract(backend, claims, in_use_before=stats_before))
    return report
