"""Pass infrastructure (the shape of onnx-ir's and torch.fx's).

A pass is a small class whose ``call(graph)`` returns ``PassResult(graph, modified)``.
Calling the pass object (``pass_(graph)``) runs ``call`` and then ``graph.verify()``, so every
transform is checked (a pass that reports no change and left the node count as it was is not
verified again: on a 6,000-node graph the verifier after each of ten passes that found nothing
to do cost more than the passes). A pass that declares ``in_place = True`` must return the
graph it was given; this is checked too. ``PassManager`` repeats its passes until none
modifies the graph (or ``max_iterations``). A pass that repeats a rewrite of its own until
nothing changes does it through ``fixed_point``, whose bound turns a pass that never settles
(a rewrite that undoes or re-makes itself) into a ``PassLoopError`` naming the pass, instead
of a load that never returns. Both call ``checkpoint`` between rounds: a compile whose time
budget is spent (``core/plugin/budget.py`` installs the check in its thread) stops there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from anychip.errors import GraphError, PassLoopError

if TYPE_CHECKING:
    from anychip.ir.graph import Graph

__all__ = [
    "Pass",
    "PassResult",
    "PassManager",
    "checkpoint",
    "fixed_point",
    "install_checkpoint",
    "round_limit",
]

_local = threading.local()


def install_checkpoint(check: Callable[[str], None] | None) -> None:
    """Make ``check(where)`` this thread's checkpoint (None: none); it raises to stop a
    compile (``core/plugin/budget.py``: the compile's deadline; ir imports no core)."""
    _local.check = check


def checkpoint(where: str) -> None:
    """Raise if this thread's compile must stop (its budget spent, its session closed);
    called between passes, fixed-point rounds and a compiler's ops. Free when none is set."""
    check = getattr(_local, "check", None)
    if check is not None:
        check(where)


class PassResult:
    """What a pass returns: the (possibly new) graph and whether anything changed."""

    __slots__ = ("graph", "modified")

    def __init__(self, graph: Graph, modified: bool) -> None:
        self.graph = graph
        self.modified = modified

    def __bool__(self) -> bool:
        return self.modified


class Pass:
    """Base class. Subclasses implement ``call``.

    Calling a pass runs ``call``, checks the in-place claim, verifies the graph, and records
    in ``graph.meta``: ``"nodes_before_passes"`` (the node count before the first pass) and
    ``"passes"`` (the names of the passes that modified it, in order), which compile reports
    show.
    """

    in_place = True
    #: Whether calling the pass records its name in ``graph.meta["passes"]``.
    record = True

    def call(self, graph: Graph) -> PassResult:
        raise NotImplementedError(f"{type(self).__name__} must implement call(graph)")

    def __call__(self, graph: Graph) -> PassResult:
        count = len(graph.nodes)
        graph.meta.setdefault("nodes_before_passes", count)
        result = self.call(graph)
        if not isinstance(result, PassResult):
            raise GraphError(
                f"{self.name}.call returned {type(result).__name__}; a pass returns "
                "PassResult(graph, modified)"
            )
        if self.in_place and result.graph is not graph:
            raise GraphError(
                f"{type(self).__name__} claims to be in place but returned a new graph"
            )
        if result.modified or result.graph is not graph or len(graph.nodes) != count:
            result.graph.verify()
        if result.modified and self.record:
            result.graph.meta.setdefault("passes", []).append(self.name)
        return result

    @property
    def name(self) -> str:
        return type(self).__name__


class PassManager(Pass):
    """Runs ``passes`` in order, repeatedly, until a full round modifies nothing (at most
    ``max_iterations`` rounds); each pass verifies the graph after it runs."""

    record = False

    def __init__(self, passes: Sequence[Pass], max_iterations: int = 8) -> None:
        self.passes = list(passes)
        self.max_iterations = max_iterations

    def call(self, graph: Graph) -> PassResult:
        any_change = False
        for _ in range(self.max_iterations):
            changed = False
            for p in self.passes:
                checkpoint(p.name)
                result = p(graph)
                graph = result.graph
                changed = changed or result.modified
            any_change = any_change or changed
            if not changed:
                break
        return PassResult(graph, any_change)


def round_limit(graph: Graph) -> int:
    """The rounds a fixed-point rewrite of ``graph`` may take: a productive round rewrites
    at least one node, so twice the node count (plus slack) is never reached by a pass that
    settles."""
    return 2 * len(graph.nodes) + 16


def fixed_point(name: str, step: Callable[[], bool], limit: int) -> int:
    """Call ``step`` until it returns False, at most ``limit`` times; returns the rounds that
    changed something. Raises ``PassLoopError`` naming the pass ``name`` past the bound."""
    for rounds in range(limit):
        checkpoint(name)
        if not step():
            return rounds
    raise PassLoopError(
        f"pass {name!r} still changed the graph after {limit} rounds: it does not reach a "
        "fixed point on this graph (a bug in the pass; the partition is placed without it "
        f"where the device allows, or disable the pass, e.g. ANYCHIP_DISABLED_PASSES={name} "
        "for the CPU's, and report the model)"
    )
