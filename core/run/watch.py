"""Watched kernels: each call of a device's kernel checked for what the executor cannot see.

The executor checks a result's dtype and shape against inference (``checks.py``); a kernel
can be wrong in ways that pass that check and surface later, far from their cause: it writes
into an input (the next reader, or the next run, gets other data), returns a host numpy array
or a handle of another kind (the next node fails on it and is blamed), or computes another
answer than the CPU's kernel on the same inputs. ``watch_program`` replaces each instruction's
function (``Instr.fn``, which the dispatch loop reads on every call) by a ``WatchedKernel``
that copies the inputs to the host before the call and checks, after it:

* every result is a tensor of this device: not a host array where the device's tensors are
  not host arrays, and readable by the backend's ``to_host``;
* every input tensor holds the bytes it held before the call (constants included);
* with ``compare``, the result against the reference kernel run on the same inputs
  (``bring_up.py``: the CPU's).

A failed check raises ``BringUpError`` naming the node, its op and the kernel as registered
(``Kernel.name``), after releasing the results the call made. Watching costs two host copies
per tensor per call: it is for bring-up (``load(..., bring_up=True)``) and the conformance
kit, never a production run.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from anychip.core.run.checks import kernel_name
from anychip.core.run.kernel_call import KernelContext
from anychip.core.run.slots import release_quietly
from anychip.errors import BringUpError

if TYPE_CHECKING:
    from anychip.core.run.kernel_call import Instr
    from anychip.core.run.program import Program

__all__ = ["WatchedKernel", "watch_program", "kernel_name", "host_copy"]

#: ``compare(watched, host_args, kwargs, results)``: raises where the results are wrong;
#: ``host_args`` are the node's inputs as host copies (None where omitted).
Compare = Callable[["WatchedKernel", list[Any], dict[str, Any], list[Any]], None]


def host_copy(backend: Any, t: Any) -> np.ndarray:
    """A host copy of device tensor ``t`` that nothing else holds."""
    return np.array(backend.to_host(t), copy=True)


def _is_tensor(a: Any) -> bool:
    return a is not None and not isinstance(
        a, (KernelContext, list, tuple, dict, str, bytes, int, float, bool)
    )


class WatchedKernel:
    """One instruction's kernel, called with the checks of the module docstring."""

    __slots__ = ("fn", "ins", "backend", "name", "compare", "offset")

    def __init__(self, ins: Instr, backend: Any, compare: Compare | None = None) -> None:
        self.fn = ins.fn
        self.ins = ins
        self.backend = backend
        self.name = kernel_name(ins)
        self.compare = compare
        #: Arguments before the node's inputs (a context kernel's ``KernelContext``).
        self.offset = 1 if ins.ctx is not None else 0

    @property
    def node(self) -> Any:
        return self.ins.node

    def where(self) -> str:
        """``node 'n' (Op) on device, kernel backend:Op since N (module.fn)``."""
        node = self.ins.node
        return (
            f"node {node.name!r} ({node.qualified_op}) on {self.backend.name}, kernel {self.name}"
        )

    def __call__(self, *args: Any, **kw: Any) -> Any:
        backend = self.backend
        before = [(i, a, host_copy(backend, a)) for i, a in enumerate(args) if _is_tensor(a)]
        res = self.fn(*args, **kw)
        results = list(res) if type(res) is tuple or type(res) is list else [res]
        out = kw.get("out")
        # a planned out= view may be a dying input's memory (inplace kernels): not checked
        kept = [b for b in before if out is None or not _shares(b[1], out)]
        try:
            self._check_results(results, [a for _, a, _ in before])
            self._check_inputs(kept)
            if self.compare is not None:
                hosts = {i: h for i, _, h in before}
                host_args = [hosts.get(i, a) for i, a in enumerate(args)][self.offset :]
                self.compare(self, host_args, kw, results)
        except BaseException:
            if not backend.host_memory:
                mine = [r for r in results if _is_tensor(r) and not any(r is a for a in args)]
                release_quietly(backend.release, [r for r in mine if not _is_host(r)])
            raise
        return res

    def output_name(self, i: int) -> str:
        outs = self.ins.node.outputs
        v = outs[i] if i < len(outs) else None
        return v.name if v is not None else "?"

    def input_name(self, i: int) -> str:
        ins = self.ins.node.inputs
        v = ins[i] if i < len(ins) else None
        return v.name if v is not None else "?"

    def _check_results(self, results: Sequence[Any], inputs: Sequence[Any]) -> None:
        backend = self.backend
        if backend.host_memory:
            return
        own = {type(a) for a in inputs}
        for i, r in enumerate(results):
            if not _is_tensor(r) or type(r) in own:
                continue
            if _is_host(r) and np.ndarray not in own:
                raise BringUpError(
                    f"{self.where()} returned a host numpy array {_describe(r)} for output {i} "
                    f"({self.output_name(i)!r}); a {backend.name} kernel returns "
                    f"{backend.name} tensors (what its to_device makes): compute on the "
                    "device, or copy the result in with to_device"
                )
            try:
                backend.to_host(r)
            except Exception as e:
                kinds = ", ".join(sorted(t.__name__ for t in own)) or "?"
                raise BringUpError(
                    f"{self.where()} returned a {type(r).__module__}.{type(r).__qualname__} "
                    f"for output {i} ({self.output_name(i)!r}), which {backend.name}.to_host "
                    f"cannot read ({type(e).__name__}: {e}); its inputs were {kinds}: return "
                    "a tensor of this device"
                ) from e

    def _check_inputs(self, before: Sequence[tuple[int, Any, np.ndarray]]) -> None:
        for i, a, was in before:
            now = np.asarray(self.backend.to_host(a))
            if now.shape == was.shape and now.dtype == was.dtype and _same_bytes(now, was):
                continue
            k = i - self.offset
            changed = _changed(was, now)
            raise BringUpError(
                f"{self.where()} wrote into its input {k} ({self.input_name(k)!r}): {changed}. "
                "A kernel must leave its inputs as they are (another node, or the next run, "
                "reads them): write the result into memory of its own"
            )


def _shares(a: Any, out: Any) -> bool:
    return isinstance(a, np.ndarray) and isinstance(out, np.ndarray) and np.shares_memory(a, out)


def _is_host(r: Any) -> bool:
    return isinstance(r, (np.ndarray, np.generic))


def _describe(r: Any) -> str:
    return f"{np.asarray(r).dtype}{list(np.shape(r))}"


def _same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype == object:
        return a.tolist() == b.tolist()
    return np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes()


def _changed(was: np.ndarray, now: np.ndarray) -> str:
    if now.shape != was.shape or now.dtype != was.dtype:
        return f"{_describe(was)} became {_describe(now)}"
    if was.dtype == object:
        return "its values changed"
    a, b = np.ascontiguousarray(was), np.ascontiguousarray(now)
    flat_a = a.reshape(-1).view(np.uint8).reshape(a.size, -1) if a.size else a.reshape(0, 1)
    flat_b = b.reshape(-1).view(np.uint8).reshape(b.size, -1) if b.size else b.reshape(0, 1)
    n = int(np.count_nonzero((flat_a != flat_b).any(axis=1)))
    return f"{n} of {a.size} element(s) changed"


def watch_program(program: Program, compare: Compare | None = None) -> int:
    """Watch every kernel of ``program`` and of the programs of its nested graphs; returns
    how many instructions are watched. Watching twice does nothing more."""
    count = 0
    for ins in program.instrs:
        if not isinstance(ins.fn, WatchedKernel):
            ins.fn = WatchedKernel(ins, program.backend, compare)
            count += 1
        if ins.ctx is not None:
            for sub in ins.ctx._subprograms.values():
                count += watch_program(sub, compare)
    return count
