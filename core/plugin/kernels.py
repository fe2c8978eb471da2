"""Kernel registration: a ``KernelTable`` per backend, filled by decorators where kernels live.

A kernel is a plain function. Inputs come positionally (``None`` for an omitted optional
input), attributes as keyword arguments under their ONNX names, with the schema's defaults
already filled in by the runtime. It returns one array or a tuple of arrays (one per output)::

    from anychip.backends.cpu.table import kernel

    @kernel("Relu", since=14, dtypes=FLOAT_TYPES)
    def relu(x):
        return np.maximum(x, 0, dtype=x.dtype)

Versioning follows ONNX: a kernel registered ``since=N`` serves nodes whose resolved schema
version is ``>= N``, up to the next registration of the same op (or ``until``). ``dtypes`` is
checked against the element type of input ``dtype_input`` (None: any type).

Kernels that need the node or must run nested graphs (If, Loop, Scan, Split's output count)
are registered with ``context=True`` and receive a ``KernelContext`` as first argument (see
``core/run/kernel_call.py``). ``reference=True`` marks a kernel that wraps onnx's reference
evaluator; the placement report names such nodes. ``inplace=True`` and ``alias=True`` declare
what the memory planner may assume about the output (see ``KernelTable.register``).

A table may hold kernels it has not imported yet: ``defer_import(module, keys)`` says that
importing ``module`` registers the kernels of ``keys``, and the first ``lookup`` of one of them
imports it (the CPU's index of its ``op_*.py`` modules, ``backends/cpu/kernel_index.py``).
Iterating a table, its length and ``ops()`` import everything deferred first.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from anychip.ir.dtypes import DType

if TYPE_CHECKING:
    from types import FrameType

    from anychip.ir.node import Node

__all__ = ["Kernel", "KernelTable", "KernelMatch", "find_kernel", "input_dtypes"]

F = TypeVar("F", bound=Callable[..., Any])


class Kernel:
    """One registered implementation of one operator version range on one backend."""

    __slots__ = (
        "op_type",
        "domain",
        "since",
        "until",
        "dtypes",
        "dtype_input",
        "context",
        "reference",
        "fn",
        "backend",
        "inplace",
        "alias",
        "constraints",
        "module",
    )

    def __init__(
        self,
        op_type: str,
        domain: str,
        since: int,
        until: int | None,
        dtypes: frozenset[DType] | None,
        dtype_input: int,
        context: bool,
        reference: bool,
        fn: Callable[..., Any],
        backend: str,
        *,
        inplace: bool = False,
        alias: bool = False,
        constraints: tuple[Any, ...] = (),
        module: str | None = None,
    ) -> None:
        self.op_type = op_type
        self.domain = domain
        self.since = since
        self.until = until
        self.dtypes = dtypes
        self.dtype_input = dtype_input
        self.context = context
        self.reference = reference
        self.fn = fn
        self.backend = backend
        #: Output ``i`` reads only input element ``i``: the memory planner may give the output
        #: the memory of its first input when that input dies at this node.
        self.inplace = inplace
        #: The output is a view of the first input (Reshape, Identity...): the planner keeps the
        #: viewed tensor alive as long as the view.
        self.alias = alias
        #: Conditions the device needs beyond op, version and dtype (``claims.Constraint``:
        #: "Softmax on the last axis only"), carried into the claims derived from the table.
        self.constraints = tuple(constraints)
        #: The module whose top-level code registered the kernel (None when added directly):
        #: importing it registers the kernel again in a fresh process (the CPU's index).
        self.module = module

    @property
    def name(self) -> str:
        """The kernel as registered: ``backend:domain::Op since N (module.function)``, what
        errors name (a closure's own ``__qualname__`` says little)."""
        op = f"{self.domain}::{self.op_type}" if self.domain else self.op_type
        fn = f"{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', self.fn)}"
        return f"{self.backend}:{op} since {self.since} ({fn})"

    def serves(self, version: int) -> bool:
        return self.since <= version and (self.until is None or version <= self.until)

    def __repr__(self) -> str:
        return (
            f"Kernel({self.backend}:{self.domain + '::' if self.domain else ''}"
            f"{self.op_type} since {self.since}, {self.fn.__module__}.{self.fn.__name__})"
        )


class KernelMatch:
    """The answer of a lookup: the kernel, or None with the reason it is missing."""

    __slots__ = ("kernel", "reason")

    def __init__(self, kernel: Kernel | None, reason: str = "") -> None:
        self.kernel = kernel
        self.reason = reason

    def __bool__(self) -> bool:
        return self.kernel is not None


Key = tuple[str, str]


class _Deferred:
    """Kernels of one key that are not in the table yet: a module to import (whose kernels
    arrive through ``add``), or another table's deferred kernels merged into this one (taken
    from it, in that table's order, at ``rank``)."""

    __slots__ = ("rank", "module", "source")

    def __init__(self, rank: int, module: str | None, source: KernelTable | None) -> None:
        self.rank = rank
        self.module = module
        self.source = source


class KernelTable:
    """The kernels of one backend, keyed by (domain, op type).

    Invariants: each key's list is sorted by ``since``, then by registration order (a
    kernel merged from another table keeps its place among that table's kernels, even when it
    arrives later from a deferred import); a list is replaced, never changed in place, so a
    lookup in another thread reads a whole one.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._by_op: dict[Key, list[Kernel]] = {}
        self._deferred: dict[Key, list[_Deferred]] = {}
        self._deferred_modules: set[str] = set()
        #: Registration order per kernel (by id): (batch, place in the batch's source table).
        self._rank: dict[int, tuple[Any, ...]] = {}
        self._next = 0
        self._lock = threading.RLock()

    def register(
        self,
        op_type: str | Iterable[str],
        *,
        domain: str = "",
        since: int = 1,
        until: int | None = None,
        dtypes: Iterable[DType] | None = None,
        dtype_input: int = 0,
        context: bool = False,
        reference: bool = False,
        inplace: bool = False,
        alias: bool = False,
        constraints: Iterable[Any] = (),
    ) -> Callable[[F], F]:
        """Decorator: register the function as the kernel of ``op_type`` (or several ops).

        ``inplace=True``: output element ``i`` reads only input element ``i`` (element-wise),
        so the output may take the first input's memory. ``alias=True``: the output is a view
        of the first input. Both are facts the memory planner reads from the kernel.
        ``constraints``: ``core/plugin/claims.Constraint`` objects the node must meet
        (``Constraint.last_axis()``); placement refuses a node that does not, naming the
        constraint, and the conformance kit counts such a case as refused-as-declared.
        """
        names = [op_type] if isinstance(op_type, str) else list(op_type)
        dts = frozenset(dtypes) if dtypes is not None else None
        module = _registering_module()

        def deco(fn: F) -> F:
            for name in names:
                self.add(
                    Kernel(
                        name,
                        domain,
                        since,
                        until,
                        dts,
                        dtype_input,
                        context,
                        reference,
                        fn,
                        self.backend,
                        inplace=inplace,
                        alias=alias,
                        constraints=tuple(constraints),
                        module=module,
                    )
                )
            return fn

        return deco

    def add(self, k: Kernel) -> None:
        with self._lock:
            self._insert(k, (self._next, 0))
            self._next += 1

    def _insert(self, k: Kernel, rank: tuple[Any, ...]) -> None:
        k.backend = self.backend
        self._rank[id(k)] = rank
        key = (k.domain, k.op_type)
        rank_of = self._rank
        self._by_op[key] = sorted(
            [*self._by_op.get(key, ()), k], key=lambda x: (x.since, rank_of[id(x)])
        )

    def merge(self, other: KernelTable) -> None:
        """Add every kernel of ``other`` (a plugin adding kernels to an existing backend);
        what ``other`` defers stays deferred here, and comes from ``other`` when looked up."""
        with self._lock:
            batch = self._next
            self._next += 1
            for k in other._loaded():
                self._insert(k, (batch, other._rank_of(k)))
            for key in other._deferred_keys():
                self._deferred.setdefault(key, []).append(_Deferred(batch, None, other))

    def defer_import(self, module: str, keys: Iterable[Key]) -> None:
        """Importing ``module`` registers (through ``add``) the kernels of ``keys``: import it
        the first time one of them is looked up, not now. A module already imported, or
        already deferred, is left as it is."""
        with self._lock:
            if module in sys.modules or module in self._deferred_modules:
                return
            self._deferred_modules.add(module)
            for key in keys:
                self._deferred.setdefault(key, []).append(_Deferred(self._next, module, None))

    def load_deferred(self) -> None:
        """Import every deferred kernel now (what iterating the table does)."""
        for key in list(self._deferred):
            self._resolve(key)

    def _resolve(self, key: Key) -> None:
        # Imports run outside the lock (a module's import takes the import lock and calls add);
        # a key stays deferred until its kernels are in, so another thread looking it up
        # meanwhile waits for the same import instead of finding nothing.
        pending = list(self._deferred.get(key, ()))
        for d in pending:
            if d.module is not None:
                importlib.import_module(d.module)
            elif d.source is not None:
                d.source._resolve(key)
                self._adopt(key, d)
        with self._lock:
            left = [d for d in self._deferred.get(key, ()) if d not in pending]
            if left:
                self._deferred[key] = left
            else:
                self._deferred.pop(key, None)

    def _adopt(self, key: Key, d: _Deferred) -> None:
        assert d.source is not None
        with d.source._lock:
            theirs = [(k, d.source._rank_of(k)) for k in d.source._by_op.get(key, ())]
        with self._lock:  # two threads adopting the same key: the second finds the kernels in
            have = {id(k) for k in self._by_op.get(key, ())}
            for k, rank in theirs:
                if id(k) not in have:
                    self._insert(k, (d.rank, rank))

    def _rank_of(self, k: Kernel) -> tuple[Any, ...]:
        return self._rank.get(id(k), (self._next, 0))

    def _loaded(self) -> list[Kernel]:
        with self._lock:
            return [k for lst in self._by_op.values() for k in lst]

    def _deferred_keys(self) -> list[Key]:
        with self._lock:
            return list(self._deferred)

    def lookup(
        self,
        domain: str,
        op_type: str,
        version: int,
        dtype: DType | Sequence[DType | None] | None = None,
    ) -> KernelMatch:
        """The kernel for a node, or a reason naming what is missing.

        ``dtype`` is the element type of the kernel's type-constrained input, or the list of
        every input's element type (each kernel then checks its own ``dtype_input``).
        """
        domain = "" if domain == "ai.onnx" else domain
        if self._deferred and (domain, op_type) in self._deferred:
            self._resolve((domain, op_type))
        cands = self._by_op.get((domain, op_type))
        opname = f"{domain}::{op_type}" if domain else op_type
        if not cands:
            return KernelMatch(None, f"no kernel for {opname}")
        by_version = [k for k in cands if k.serves(version)]
        if not by_version:
            have = sorted({k.since for k in cands})
            return KernelMatch(
                None, f"no kernel for {opname} version {version} (kernels since {have})"
            )
        # Newest registration first; among equals, the last registered wins (plugins override).
        by_version.sort(key=lambda k: k.since, reverse=True)
        newest = by_version[0].since
        for k in reversed([k for k in by_version if k.since == newest]):
            dt = _dtype_for(k, dtype)
            if k.dtypes is None or dt is None or dt in k.dtypes:
                return KernelMatch(k)
        dtype = _dtype_for(by_version[0], dtype)
        types = sorted({t.short for k in by_version if k.since == newest for t in k.dtypes or ()})
        return KernelMatch(
            None,
            f"no kernel for {opname} with dtype "
            f"{dtype.short if dtype is not None else '?'} "
            f"(supports {', '.join(types)})",
        )

    def ops(self) -> set[Key]:
        self.load_deferred()
        return set(self._by_op)

    def snapshot(self) -> tuple[dict[Key, list[Kernel]], dict[Key, list[_Deferred]]]:
        """The kernels as they are now (deferred ones still deferred); ``restore`` goes back
        to them."""
        with self._lock:
            return dict(self._by_op), {key: list(ds) for key, ds in self._deferred.items()}

    def restore(self, snapshot: tuple[dict[Key, list[Kernel]], dict[Key, list[_Deferred]]]) -> None:
        """Back to ``snapshot``, in this same table: kernels added since are dropped."""
        by_op, deferred = snapshot
        with self._lock:
            self._by_op = dict(by_op)
            self._deferred = {key: list(ds) for key, ds in deferred.items()}

    def __iter__(self) -> Iterator[Kernel]:
        self.load_deferred()
        yield from self._loaded()

    def __len__(self) -> int:
        self.load_deferred()
        return sum(len(v) for v in self._by_op.values())


def _registering_module() -> str | None:
    """The module whose top-level code is registering a kernel (through helpers or not)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "<module>":
            return frame.f_globals.get("__name__")
        frame = frame.f_back
    return None


def _dtype_for(k: Kernel, dtype: DType | Sequence[DType | None] | None) -> DType | None:
    if dtype is None or isinstance(dtype, DType):
        return dtype
    return dtype[k.dtype_input] if k.dtype_input < len(dtype) else None


def input_dtypes(node: Node) -> list:
    """Each input's element type (None for omitted inputs and unknown types)."""
    return [None if v is None else v.dtype or None for v in node.inputs]


def find_kernel(table: KernelTable | None, node: Node) -> tuple[Kernel | None, str]:
    """The kernel of ``table`` for ``node`` (whose schema is resolved), or the reason."""
    if table is None:
        return None, "backend has no kernels"
    since = node.meta.get("since", node.version or 1)
    match = table.lookup(node.domain, node.op_type, since, input_dtypes(node))
    return match.kernel, match.reason
