"""Tensor lifetimes from an ordered list of steps, the planner's input.

A *step* is one kernel launch (or one node) in execution order, listing the tensor ids it reads
and the ids it writes. A tensor lives from the step that writes it to the last step that reads
it (the writing step if nothing reads it: its memory is still written). Tensors the caller owns
are not plannable and left out:

* ``inputs``: graph inputs and initializers, owned by the caller or the session;
* ``outputs``: graph outputs, handed to the caller after the run; placing them inside the
  planned block would let the next run overwrite what the caller holds.

Example:
    >>> steps = [Step(reads=("x",), writes=("a",)), Step(("a",), ("b",)),
    ...          Step(("a", "b"), ("y",))]
    >>> lifetimes(steps, {"a": 64, "b": 64, "y": 64}, inputs={"x"}, outputs={"y"})
    [TensorLifetime(id='a', size_bytes=64, first_use_step=0, last_use_step=2), \
TensorLifetime(id='b', size_bytes=64, first_use_step=1, last_use_step=2)]
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from anychip.core.memory.planner import MemoryPlanError, TensorLifetime

__all__ = ["Step", "lifetimes"]


@dataclass(frozen=True, slots=True)
class Step:
    """One step of a run: the ids it reads and the ids it writes."""

    reads: tuple[Hashable, ...] = ()
    writes: tuple[Hashable, ...] = ()


def lifetimes(
    steps: Sequence[Step | tuple[Iterable[Hashable], Iterable[Hashable]]],
    sizes: Mapping[Hashable, int],
    *,
    inputs: Iterable[Hashable] = (),
    outputs: Iterable[Hashable] = (),
) -> list[TensorLifetime]:
    """The lifetimes of the plannable tensors of ``steps``, in the order they are written.

    Args:
        steps: In execution order; each a ``Step`` or a ``(reads, writes)`` pair.
        sizes: Bytes of every plannable tensor (others may be missing).
        inputs: Ids available before the first step and owned by the caller.
        outputs: Ids handed to the caller at the end (not plannable either).

    Raises:
        MemoryPlanError: a tensor is read before any step writes it (and is not an input), is
            written twice or is an input that a step writes, an output is never produced, or a
            plannable tensor has no size.
    """
    external = set(inputs)
    results = set(outputs)
    first, last = _first_and_last(steps, external)
    missing = [tid for tid in results if tid not in first and tid not in external]
    if missing:
        raise MemoryPlanError(f"graph outputs {missing} are never written by any step")
    out: list[TensorLifetime] = []
    for tid, start in first.items():
        if tid in results:
            continue
        if tid not in sizes:
            raise MemoryPlanError(
                f"tensor {tid!r} (written at step {start}) has no size; "
                f"give its byte size in sizes="
            )
        out.append(TensorLifetime(tid, sizes[tid], start, last[tid]))
    return out


def _first_and_last(
    steps: Sequence[Step | tuple[Iterable[Hashable], Iterable[Hashable]]],
    external: set[Hashable],
) -> tuple[dict[Hashable, int], dict[Hashable, int]]:
    """The step that writes each tensor and the last step that touches it."""
    first: dict[Hashable, int] = {}
    last: dict[Hashable, int] = {}
    for index, step in enumerate(steps):
        reads, writes = (step.reads, step.writes) if isinstance(step, Step) else step
        for tid in reads:
            if tid in external:
                continue
            if tid not in first:
                raise MemoryPlanError(
                    f"step {index} reads {tid!r} before any step writes it; "
                    f"pass it in inputs= if the caller provides it"
                )
            last[tid] = index
        for tid in writes:
            if tid in external:
                raise MemoryPlanError(
                    f"step {index} writes {tid!r}, which is a graph input "
                    f"or initializer owned by the caller"
                )
            if tid in first:
                raise MemoryPlanError(
                    f"step {index} writes {tid!r}, already written at step "
                    f"{first[tid]}; each tensor must be written once"
                )
            first[tid] = index
            last[tid] = index
    return first, last
