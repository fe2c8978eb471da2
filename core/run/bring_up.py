"""Bring-up: a new device's kernels run under every check, and nothing is hidden.

``anychip.load(model, devices, bring_up=True)`` (``anychip run --bring-up``, ``anychip
conformance --bring-up``) is for the first days of a device. Unlike a normal session:

* failover is off: a device that fails raises, instead of the CPU answering in its place;
* kernel outputs are checked against inference (``check_kernels`` forced on);
* every kernel of every kernel-mode device partition is watched (``watch.py``): inputs left
  as they were, results the device's own tensors, and each node's results compared with the
  CPU's kernel on the same inputs (``CpuReference``): the first node that differs raises
  ``BringUpError`` with the node, op, kernel and the largest error;
* every graph-mode partition's outputs are compared, each run, with the CPU's run of the
  same partition graph as placed (``cpu_reference``, made before the device's compile
  rewrites the graph): the first output that differs raises ``BringUpError`` naming the
  partition and the output (``bring_up_graph``);
* at ``close()`` the device's memory must be back where it was when the session was loaded
  (``check_released``; other sessions open on the same device count too).

Tolerances of the comparison, per dtype (``TOLERANCES``): a result ``d`` matches the CPU's
``c`` where ``|d - c| <= atol + rtol * |c|`` (float16: four units in the last place at 1.0;
float32: 1e-4, room for another summation order), NaN where the CPU has NaN. Integers and
booleans must be equal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.plugin.kernels import find_kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.core.run.watch import watch_program
from anychip.errors import BringUpError

if TYPE_CHECKING:
    from anychip.core.plugin.kernels import KernelTable
    from anychip.core.run.program import Program
    from anychip.core.run.watch import WatchedKernel

__all__ = [
    "CpuReference",
    "TOLERANCES",
    "bring_up_graph",
    "cpu_reference",
    "bring_up_program",
    "memory_in_use",
    "check_released",
]

#: numpy dtype name -> (rtol, atol) of the comparison with the CPU's kernel.
TOLERANCES = {
    "float64": (1e-9, 1e-9),
    "float32": (1e-4, 1e-4),
    "float16": (2.0**-8, 2.0**-8),
    "bfloat16": (2.0**-5, 2.0**-5),
}


class CpuReference:
    """Compares a watched kernel's results with the CPU kernel of the same node, run on host
    copies of the same inputs with the same attributes (nodes with nested graphs, and ops the
    CPU has no kernel for, are not compared)."""

    def __init__(self, table: KernelTable | None) -> None:
        self.table = table
        #: Nodes compared, and nodes left out (no CPU kernel, nested graphs), by name.
        self.compared = 0
        self.skipped: dict[str, str] = {}

    def __call__(
        self, w: WatchedKernel, host_args: list[Any], kw: dict[str, Any], results: list[Any]
    ) -> None:
        node = w.node
        if any(True for _ in node.subgraphs()):
            self.skipped[node.name] = "nested graphs"
            return
        kernel, why = find_kernel(self.table, node)
        if kernel is None:
            self.skipped[node.name] = why
            return
        args = list(host_args)
        if kernel.context:
            args.insert(0, KernelContext(node, None))
        ref = kernel.fn(*args, **w.ins.attrs)
        refs = list(ref) if type(ref) is tuple or type(ref) is list else [ref]
        self.compared += 1
        for i, (r, want) in enumerate(zip(results, refs)):
            if i >= len(node.outputs) or node.outputs[i] is None or r is None or want is None:
                continue
            if isinstance(want, list):  # sequences are not compared
                continue
            got = np.asarray(w.backend.to_host(r))
            problem = difference(got, np.asarray(want))
            if problem:
                raise BringUpError(
                    f"bring-up: {w.where()}: output {i} ({w.output_name(i)!r}) differs from "
                    f"the CPU kernel {kernel.name} on the same inputs: {problem}"
                )


def difference(got: np.ndarray, want: np.ndarray) -> str:
    """How ``got`` differs from ``want`` beyond ``TOLERANCES`` ("" when it does not)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} where the CPU gives {want.dtype}{list(want.shape)}"
    if got.size == 0:
        return ""
    if want.dtype == object:
        return "" if got.tolist() == want.tolist() else "the values differ"
    tol = TOLERANCES.get(want.dtype.name)
    if tol is None:  # integers, booleans, strings: exact
        wrong = got != want
        if not wrong.any():
            return ""
        first = tuple(int(i) for i in np.argwhere(wrong)[0])
        return (
            f"{int(wrong.sum())} of {want.size} element(s) differ, the first at {list(first)} "
            f"(device {got[first]!r}, CPU {want[first]!r})"
        )
    rtol, atol = tol
    g, c = got.astype(np.float64), want.astype(np.float64)
    err = np.abs(g - c)
    same = (g == c) | (np.isnan(g) & np.isnan(c))
    bad = ~same & ~(err <= atol + rtol * np.abs(c))
    if not bad.any():
        return ""
    worst = np.where(bad, np.nan_to_num(err, nan=np.inf), -1.0)
    at = np.unravel_index(int(np.argmax(worst)), want.shape)
    at_list = [int(i) for i in at]
    return (
        f"max |error| {float(err[at]):.4g} at {at_list} (device {g[at]:.6g}, CPU {c[at]:.6g}); "
        f"{int(bad.sum())} of {want.size} element(s) beyond rtol={rtol:.3g}, atol={atol:.3g}"
    )


def bring_up_program(program: Program, cpu_table: KernelTable | None) -> CpuReference:
    """Watch ``program``'s kernels and compare each with the CPU's; returns the comparer."""
    ref = CpuReference(cpu_table)
    watch_program(program, compare=ref)
    return ref


def cpu_reference(
    partition: Any, cpu: Any, table: KernelTable | None, schemas: Any
) -> Program | str:
    """The CPU's program of ``partition``'s graph as placed (made before a graph-mode device
    compiles, and rewrites, it), or why the CPU cannot run it."""
    from anychip.core.run.program import Program

    try:
        return Program(partition.graph, cpu, table, schemas)
    except Exception as e:
        return f"outputs not compared: the CPU cannot run it ({e})"


def bring_up_graph(
    run: Callable[[list[Any]], list[Any]],
    partition: Any,
    backend: Any,
    reference: Program | str,
) -> Callable[[list[Any]], list[Any]]:
    """A graph-mode partition's ``run`` with each run's outputs compared with ``reference``
    (``cpu_reference``: the CPU's run of the same partition graph) on host copies of the same
    inputs. A compiled partition is one executable: the first output that differs is named,
    not a node. Where the CPU has no program for it, the partition runs unchecked and its
    ``info["bring-up"]`` says why."""
    if isinstance(reference, str):
        partition.info["bring-up"] = reference
        return run
    partition.info["bring-up"] = "each run's outputs compared with the CPU's run of it"
    names = [v.name if v is not None else "" for v in reference.graph.outputs]
    count = len(reference.graph.nodes)

    def checked(inputs: list[Any]) -> list[Any]:
        outs = run(inputs)
        host = [None if x is None else np.asarray(backend.to_host(x)) for x in inputs]
        want = reference.run(host)
        for i, (got, ref) in enumerate(zip(outs, want)):
            if got is None or ref is None or isinstance(ref, list):
                continue
            problem = difference(np.asarray(backend.to_host(got)), np.asarray(ref))
            if problem:
                raise BringUpError(
                    f"bring-up: partition {partition.index} on {backend.name} (compiled as "
                    f"one graph of {count} node(s)): output {i} ({names[i]!r}) differs from "
                    f"the CPU's run of the same partition on the same inputs: {problem}"
                )
        return outs

    checked.wrapped = run  # type: ignore[attr-defined]
    return checked


def memory_in_use(backends: Sequence[Any]) -> list[tuple[Any, int]]:
    """``(backend, bytes in use)`` of each device with memory of its own that reports it."""
    out = []
    for b in backends:
        if b.host_memory:
            continue
        stats = b.memory_stats()
        out.append((b, stats.in_use if stats is not None else 0))
    return out


def check_released(before: Sequence[tuple[Any, int]]) -> None:
    """Raise ``BringUpError`` where a device has more memory in use than ``before`` (taken
    when the session was loaded): called by ``close()`` in bring-up, after collecting."""
    problems = []
    for b, was in before:
        stats = b.memory_stats()
        now = stats.in_use if stats is not None else 0
        if now > was:
            problems.append(
                f"{b.name} has {now - was} B more in use than when the session was loaded "
                f"({was} B then, {now} B now)"
            )
    if problems:
        raise BringUpError(
            "bring-up: after close(), " + "; ".join(problems) + ": a kernel, a constant's "
            "copy or release() keeps device memory the session no longer holds (other "
            "sessions open on the device count too)"
        )
