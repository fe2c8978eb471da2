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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from anychip.ir.dtypes import DType

if TYPE_CHECKING:
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


class KernelTable:
    """The kernels of one backend, keyed by (domain, op type)."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._by_op: dict[tuple[str, str], list[Kernel]] = {}

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
                    )
                )
            return fn

        return deco

    def add(self, k: Kernel) -> None:
        k.backend = self.backend
        lst = self._by_op.setdefault((k.domain, k.op_type), [])
        lst.append(k)
        lst.sort(key=lambda x: x.since)

    def merge(self, other: KernelTable) -> None:
        """Add every kernel of ``other`` (a plugin adding kernels to an existing backend)."""
        for k in other:
            self.add(k)

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

    def ops(self) -> set[tuple[str, str]]:
        return set(self._by_op)

    def snapshot(self) -> dict[tuple[str, str], list[Kernel]]:
        """The kernels as they are now; ``restore`` goes back to them."""
        return {key: list(ks) for key, ks in self._by_op.items()}

    def restore(self, snapshot: dict[tuple[str, str], list[Kernel]]) -> None:
        """Back to ``snapshot``, in this same table: kernels added since are dropped."""
        self._by_op = {key: list(ks) for key, ks in snapshot.items()}

    def __iter__(self) -> Iterator[Kernel]:
        for lst in self._by_op.values():
            yield from lst

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_op.values())


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
