"""Run the ONNX node cases a device claims and label each: on the device, via fallback, or not.

For every bundled node case with at least one node the device claims (``claims.py``), in
every form the device claims (``variants.py``: int64 shapes fed as constants, single-output
forms, float16/bfloat16), the case runs on ``[device, "cpu"]`` with the cost model off (so
every node the device accepts goes to it), each data set twice, and its outputs are compared
with the expected ones within the case's tolerances. The device's kernels are watched
(``core/run/watch.py``: a kernel writing into an input, returning a host array or a handle
the device cannot read is a FAIL naming the kernel), the caller's inputs and the model's
constants must be unchanged after each run, and the device's memory back where it was once
the case's sessions are closed. The label:

* ``PASS-ON-DEVICE``: right outputs, and every claimed node ran on the device;
* ``REFUSED-AS-DECLARED``: right outputs; the claimed nodes that ran elsewhere are all refused
  by a constraint the device declared (``core/plugin/claims.Constraint``): not a failure,
  in strict mode either;
* ``PASS-VIA-FALLBACK``: right outputs, but a claimed node ran on another device for a reason
  the device did not declare (the reason placement gave is kept); in strict mode this fails
  the kit;
* ``FAIL``: wrong outputs (largest difference, and whether the CPU alone gets them right),
  a second run unlike the first, a changed input or constant, a watched kernel's error, or
  device memory left in use;
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

from anychip.conformance.cases import NodeCase, all_cases, max_error
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
from anychip.conformance.variants import KitCase, build, forms
from anychip.core.plugin.claims import OpClaim, claims_of, declared_refusal
from anychip.core.report.placement import quiet_fallbacks
from anychip.errors import BringUpError, DeviceError
from anychip.ir.dtypes import ALL_TYPES, DType

__all__ = ["run_kit", "run_case_on", "claimed_cases"]

#: Cases whose expected outputs cannot be met by any backend (documented in the test suite).
EXCLUDED = {"test_squeezenet": "the expected output hangs on equal 1e10 logits"}


def _case_nodes(model: Any) -> list[tuple[str, str, int, list[Any]]]:
    """(domain, op, opset version, input dtypes or None where unknown) of each top-level
    node."""
    types = _dtypes(model)
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    out = []
    for n in model.graph.node:
        domain = "" if n.domain == "ai.onnx" else n.domain
        out.append(
            (domain, n.op_type, versions.get(domain, 1), [types.get(i) for i in n.input if i])
        )
    return out


def _dtypes(model: Any) -> dict[str, DType]:
    """The element type of every named tensor of the graph that declares one."""
    g = model.graph
    raw = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        if vi.type.HasField("tensor_type"):
            raw[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        raw[t.name] = t.data_type
    out = {}
    for name, t in raw.items():
        try:
            out[name] = DType(t)
        except ValueError:
            pass
    return out


def _constants_for(
    claims: list[OpClaim], device_dtypes: Any, model: Any, op: str
) -> tuple[tuple[str, DType], ...] | None:
    """Whether ``model`` has a node of ``op`` the device claims (a claim covers its op,
    version and type-constrained input, a dtype the device computes), and which of its graph
    inputs must then be fed as constants: those of dtypes the device does not compute (int64
    shapes, indices). None: no node of ``op`` is claimed, or one reads such a tensor from
    another node."""
    g = model.graph
    types = _dtypes(model)
    versions = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
    constant = {t.name for t in g.initializer}
    constant |= {o for n in g.node if n.op_type == "Constant" for o in n.output}
    graph_inputs = {vi.name for vi in g.input} - constant
    found: list[tuple[str, DType]] | None = None
    for n in g.node:
        if n.op_type != op:
            continue
        domain = "" if n.domain == "ai.onnx" else n.domain
        dtypes = [types.get(i) if i else None for i in n.input]
        claim = None
        for c in claims:
            first = dtypes[c.dtype_input] if c.dtype_input < len(dtypes) else None
            if c.covers(domain, op, versions.get(domain, 1), first):
                claim = c
                break
        if claim is None:
            continue
        frozen = []
        for k, (name, dt) in enumerate(zip(n.input, dtypes)):
            if not name or dt is None or dt in device_dtypes or name in constant:
                continue
            if k == claim.dtype_input or name not in graph_inputs:
                frozen = None
                break
            frozen.append((name, dt))
        if frozen is not None:
            found = (found or []) + frozen
    return None if found is None else tuple(dict.fromkeys(found))


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
) -> Iterator[KitCase]:
    """A ``KitCase`` for each form (``variants.py``: constant inputs, single-output forms,
    float16/bfloat16) of each node case whose op (``primary_op``) the device claims at the
    case's opset and dtype (restricted to ``ops`` when given)."""
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
        yield from forms(
            case, model, op, functools.partial(_constants_for, claims, device_dtypes, op=op)
        )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """No fallback warnings or numpy warnings per case: the report carries the facts."""
    with quiet_fallbacks(), warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        yield


class _Wrong(Exception):
    """What the kit found wrong beyond the outputs (an input or a constant changed)."""


def _run(
    kc: KitCase, devices: list[str], bring_up: bool = False
) -> tuple[bool, float, str, list[Any]]:
    """Run every data set of ``kc`` twice; ``(ok, max error, why, placed)``: ``placed`` lists
    ``(node, device, reason)`` for each top-level node of the compiled models. The device's
    kernels are watched (``core/run/watch.py``: inputs unchanged, results its own tensors),
    the caller's inputs and the model's constants are checked unchanged after each run."""
    import anychip

    rtol, atol = kc.tolerances
    ok, worst, why, placed = True, 0.0, "", []
    for model, sets in build(kc):
        sess = anychip.load(
            model,
            devices=devices,
            cost_model=False,
            optimize=False,
            failover=False,
            background_compile=False,  # the device compiles now: every case runs on it
            calibration="off",
            bring_up=bring_up,
        )
        try:
            _watch(sess, devices[0])
            names = [i.name for i in sess.inputs]
            consts = {v.name: np.array(v.const) for v in sess.model.graph.initializers.values()}
            for ins, outs in sets:
                for attempt in (1, 2):
                    kept = [np.array(x) if isinstance(x, np.ndarray) else x for x in ins]
                    got = sess.run(None, dict(zip(names, ins)))
                    _unchanged("input", dict(zip(names, kept)), dict(zip(names, ins)), attempt)
                    good, err, msg = max_error(got, outs, rtol, atol)
                    worst = max(worst, err)
                    if not good and ok:
                        ok, why = False, msg
                        if attempt == 2:
                            why = (
                                "the second run of the same inputs went wrong where the first "
                                "was right (a kernel keeps state, or writes into an input or a "
                                f"constant): {msg}"
                            )
            now = {v.name: v.const for v in sess.model.graph.initializers.values()}
            _unchanged("constant", consts, now, 2)
            placed += [
                (n, n.meta["device"], n.meta["placement_reason"]) for n in sess.model.graph.nodes
            ]
        except _Wrong as e:
            return False, float("inf"), str(e), placed
        finally:
            sess.close()
    return ok, worst, why, placed


def _watch(sess: Any, device: str) -> None:
    """Watch the kernels of ``device``'s partitions (``core/run/watch.py``)."""
    from anychip.core.run.watch import watch_program

    if device == "cpu":
        return
    for pm in sess.compiled.part_memory.values():
        if pm.program.backend.name == device:
            watch_program(pm.program)


def _unchanged(what: str, before: dict[str, Any], after: dict[str, Any], attempt: int) -> None:
    for name, was in before.items():
        now = after.get(name)
        if isinstance(was, np.ndarray) and not (
            isinstance(now, np.ndarray) and now.shape == was.shape and _same(now, was)
        ):
            raise _Wrong(
                f"run {attempt} changed the {what} {name!r}: a kernel wrote into it (a kernel "
                "must leave its inputs as they are)"
            )


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return a.tolist() == b.tolist()
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _cpu_passes(kc: KitCase) -> tuple[bool, str]:
    try:
        ok, _, why, _ = _run(kc, ["cpu"])
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"
    return ok, why


def run_case_on(
    case: KitCase | NodeCase, device: str, claimed: Sequence[str] = (), *, bring_up: bool = False
) -> CaseResult:
    """Run one case on ``[device, "cpu"]`` and label it (a bare ``NodeCase`` runs as is,
    testing the ops ``claimed``); ``bring_up`` loads it so (``core/run/bring_up.py``: each
    device node compared with the CPU's kernel, the first that differs a FAIL)."""
    kc = case if isinstance(case, KitCase) else KitCase(case, tuple(claimed))
    t0 = time.perf_counter()
    op = "+".join(kc.ops)
    note = kc.note(device)
    devices = [device] if device == "cpu" else [device, "cpu"]

    def result(status: str, detail: str = "", err: float = 0.0, placed: Any = ()) -> CaseResult:
        on = sum(1 for _, d, _ in placed if d == device)
        return CaseResult(kc.name, op, status, err, detail, on, len(placed),
                          time.perf_counter() - t0, note)  # fmt: skip

    backend = _backend(device)
    gc.collect()
    before = in_use(backend)
    try:
        ok, err, why, placed = _run(kc, devices, bring_up)
    except Exception as e:
        detail = f"{type(e).__name__}: {' '.join(str(e).split())}"
        cpu_ok, cpu_why = _cpu_passes(kc) if device != "cpu" else (False, detail)
        if not cpu_ok:
            return result(SKIP, f"the CPU fails too: {cpu_why}")
        return result(FAIL if isinstance(e, BringUpError) else CRASH, detail)
    gc.collect()
    after = in_use(backend)
    if after is not None and after != (before or 0):  # None before: the pool was not made yet
        return result(
            FAIL,
            f"{after - (before or 0)} B of {device} memory still in use after the case's sessions "
            "were closed: a kernel or release() keeps device memory it no longer uses",
            err,
            placed,
        )
    if not ok:
        cpu_ok, cpu_why = _cpu_passes(kc) if device != "cpu" else (False, why)
        if not cpu_ok:
            return result(SKIP, f"the CPU fails too: {cpu_why}")
        return result(FAIL, f"{why} (the CPU alone passes)", err, placed)
    status, detail = _label(placed, device, list(kc.ops))
    return result(status, detail, err, placed)


def _label(placed: list[tuple[Any, str, str]], device: str, claimed: list[str]) -> tuple[str, str]:
    """The label of a case that gave right outputs, and its detail: on the device; refused as
    declared (every claimed node elsewhere is one a constraint the device declared refuses:
    ``core/plugin/claims.declared_refusal``); or via fallback (the rest)."""
    if device == "cpu":
        return PASS_ON_DEVICE, ""
    claims = claims_of(_backend(device))
    declared, undeclared = [], []
    for node, where, reason in placed:
        if node.op_type not in claimed or where == device:
            continue
        refusal = declared_refusal(claims, node)
        if refusal is None and _dtype_refusal(reason, device):
            refusal = reason  # a dtype its DeviceModel leaves out: declared as data too
        if refusal is not None:
            declared.append(f"{node.op_type} {node.name!r} on {where}: {refusal}")
        else:
            undeclared.append(f"{node.op_type} {node.name!r} on {where}: {reason}")
    if undeclared:
        return PASS_VIA_FALLBACK, "; ".join(undeclared + declared)
    if declared:
        return REFUSED_AS_DECLARED, "; ".join(declared)
    return PASS_ON_DEVICE, ""


def _dtype_refusal(reason: str, device: str) -> bool:
    """Whether placement's reason is a dtype ``device``'s ``DeviceModel`` leaves out
    (``<device>: dtype f64 not supported by <device>``: a Cast to float64 claimed for its
    float32 input), a refusal declared as data like a constraint."""
    return f"not supported by {device}" in reason and f"{device}: dtype " in reason


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
    bring_up: bool = False,
) -> KitReport:
    """Run the conformance kit for ``device``; see the module docstring for the labels.

    Args:
        device: a registered, available device name (``xpu``, ``npu``, ``toychip``).
        strict: a fallback of a claimed op fails the kit (``KitReport.ok`` is False).
        ops: only the cases of these op types.
        contract: also run the contract tests of the backend's hooks (``contract.py``).
        progress: called after each case with ``(done, total, result)``.
        bring_up: run each case in bring-up (``load(..., bring_up=True)``): each device node
            compared with the CPU's kernel on the same inputs, the first difference a FAIL
            naming the node, op, kernel and largest error.
    """
    device = device.strip().lower()  # device names are case-insensitive (openvino:CPU)
    backend = _backend(device)
    claims = claims_of(backend)
    report = KitReport(device, strict=strict, claims=claims)
    stats_before = in_use(backend)
    with _quiet():
        selected = list(claimed_cases(claims, ops, backend.device.dtypes))
        for i, case in enumerate(selected, 1):
            result = run_case_on(case, device, bring_up=bring_up)
            report.results.append(result)
            if progress is not None:
                progress(i, len(selected), result)
        gc.collect()
        if contract:
            report.contract.extend(run_contract(backend, claims, in_use_before=stats_before))
    return report
