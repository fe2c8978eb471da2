"""What every emitter prints from: the expression as straight-line SSA steps, and each input's
broadcast class.

**Broadcast classes.** The output (``shape``) is walked as ``outer x inner`` elements, split
after axis ``k``. Against that split each input is one of:

* ``F`` (full): the output's shape; read at ``o * inner + i``;
* ``S`` (scalar): one element; read once;
* ``R`` (row): constant along the inner axes, equal to the output on a trailing block of the
  outer ones (a per-channel ``[C, 1, 1]`` bias of an NCHW tensor); read at ``o % m``;
* ``I`` (inner): the output's inner axes and nothing else (a ``[C]`` bias of ``[N, S, C]``);
  read at ``i``.

``classify`` picks the split that leaves the fewest inputs unclassified (those are broadcast
to the full shape before the call), then the largest inner loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from anychip.codegen.expr import Expr

__all__ = ["Step", "KernelSpec", "linearize", "classify", "Layout"]


@dataclass(frozen=True)
class Step:
    """``t<index> = op(args)``: args are step indices; ``in``/``const`` steps carry ``value``."""

    op: str
    args: tuple[int, ...]
    value: float | int | None = None


@dataclass(frozen=True)
class KernelSpec:
    """One kernel to emit: the expression, the element type (``float32``/``float64``) and one
    broadcast class per input (``F``, ``S``, ``R``, ``I``)."""

    expr: Expr
    dtype: str
    classes: tuple[str, ...]

    @property
    def name(self) -> str:
        return "anychip_fused"


def linearize(expr: Expr) -> list[Step]:
    """The steps computing ``expr``, each shared sub-expression once; the last is the result."""
    steps: list[Step] = []
    index: dict[Expr, int] = {}

    def visit(e: Expr) -> int:
        if e in index:
            return index[e]
        args = tuple(visit(a) for a in e.args)
        steps.append(Step(e.op, args, e.value))
        index[e] = len(steps) - 1
        return index[e]

    visit(expr)
    return steps


@dataclass(frozen=True)
class Layout:
    """A call's iteration space: ``outer x inner``, the class of each input and, for ``R``
    inputs, the modulus ``m`` (``mods``; 1 for the other classes)."""

    outer: int
    inner: int
    classes: tuple[str, ...]
    mods: tuple[int, ...]

    @property
    def built(self) -> tuple[str, ...]:
        """The classes a kernel is built for: an ``X`` input is broadcast by the caller to the
        full shape first, so the kernel reads it as ``F``."""
        return tuple("F" if c == "X" else c for c in self.classes)

    @cached_property
    def r_mods(self) -> tuple[int, ...]:
        """The kernel's modulus arguments: one per ``R`` input, in input order."""
        return tuple(m for m, c in zip(self.mods, self.classes) if c == "R")

    @cached_property
    def broadcasts(self) -> bool:
        """Whether an input is broadcast to the full shape before the call (class ``X``)."""
        return "X" in self.classes


def _padded(shape: tuple[int, ...], rank: int) -> tuple[int, ...]:
    return (1,) * (rank - len(shape)) + tuple(shape)


def _class_at(s: tuple[int, ...], out: tuple[int, ...], k: int) -> tuple[str, int] | None:
    if s == out:
        return "F", 1
    if math.prod(s) == 1:
        return "S", 1
    head, tail = s[:k], s[k:]
    if all(d == 1 for d in tail):
        # R: ones, then a block equal to the output's, up to axis k
        a = next((j for j in range(k) if head[j] != 1), k)
        if head[a:] == out[a:k]:
            return "R", math.prod(out[a:k])
    if all(d == 1 for d in head) and tail == out[k:]:
        return "I", 1
    return None


def classify(shapes: list[tuple[int, ...]], out: tuple[int, ...]) -> Layout:
    """The split of ``out`` and each input's class; ``X`` marks an input to broadcast to the
    full shape first (it then reads as ``F``)."""
    rank = len(out)
    padded = [_padded(tuple(s), rank) for s in shapes]
    best: tuple[int, int, int] | None = None
    for k in range(rank + 1):
        found = [_class_at(s, out, k) for s in padded]
        score = (sum(c is None for c in found), -math.prod(out[k:]), k)
        if best is None or score < best:
            best = score
    k = best[2] if best is not None else 0
    found = [_class_at(s, out, k) for s in padded]
    classes = tuple("X" if c is None else c[0] for c in found)
    mods = tuple(1 if c is None else c[1] for c in found)
    return Layout(math.prod(out[:k]), math.prod(out[k:]), classes, mods)
