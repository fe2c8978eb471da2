"""Checked kernels: every kernel's outputs against the dtype and shape inference declared.

A kernel that returns float64 where the node's output is float32, or a shape other than the
one inference derived, would hand a wrong array to the next node or to the user (or make the
next kernel fail and be blamed). ``expectations(node)`` turns each output's declared type into
``(numpy dtype, shape)`` once, when the program is compiled (dimensions that are symbolic stay
``None`` and are not checked, and so do all dimensions of a graph whose inputs are not all
static); ``check_result`` compares one result at run time and raises a
``KernelError`` naming the device, the kernel, the node, what was expected and what came back.
The check costs a few attribute reads per output; ``anychip.load(..., check_kernels=False)``
turns it off for a backend that has passed the conformance kit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np

from anychip.errors import KernelError

if TYPE_CHECKING:
    from anychip.ir.node import Node

__all__ = ["expectations", "mismatch", "check_result"]

#: (dtype, shape with None for unknown dims, the whole shape when every dim is known, rank).
Expectation = tuple[np.dtype, tuple[int | None, ...] | None, tuple[int, ...] | None, int | None]


def expectations(node: Node, dims: bool = True) -> tuple[Expectation | None, ...] | None:
    """Per output of ``node``: its declared numpy dtype and shape, or None when unknown.

    ``dims=False`` keeps only the rank: where the graph's inputs have symbolic dimensions, a
    model's stored intermediate shapes may still carry the numbers of one export (batch 1).
    """
    out: list[Expectation | None] = []
    for v in node.outputs:
        if v is None or not v.is_tensor or not v.dtype:
            out.append(None)
            continue
        try:
            dtype = np.dtype(v.dtype.numpy)
        except Exception:
            out.append(None)
            continue
        shape = full = rank = None
        if v.shape is not None:
            shape = tuple(d if dims and isinstance(d, int) and d >= 0 else None for d in v.shape)
            full = cast("tuple[int, ...]", shape) if None not in shape else None
            rank = len(shape)
        out.append((dtype, shape, full, rank))
    return tuple(out) if any(e is not None for e in out) else None


def mismatch(r: Any, want: Expectation) -> bool:
    """The fast test the executor runs on every result: could ``r`` differ from ``want``?"""
    dtype, _, full, rank = want
    if getattr(r, "dtype", dtype) != dtype:
        return True
    if full is not None:
        return getattr(r, "shape", full) != full
    return rank is not None and len(getattr(r, "shape", ())) != rank


def check_result(device: str, node: Node, fn: Any, index: int, r: Any, want: Expectation) -> None:
    """Raise ``KernelError`` when result ``r`` of output ``index`` differs from ``want``."""
    dtype, shape = want[0], want[1]
    got_dtype = getattr(r, "dtype", None)
    got_shape = getattr(r, "shape", None)
    if got_dtype is None or got_shape is None:
        return  # not a tensor (a sequence, an optional): nothing declared to compare
    problem = ""
    if dtype is not None and got_dtype != dtype and not _same_strings(dtype, got_dtype):
        problem = f"dtype {got_dtype}, expected {dtype}"
    elif shape is not None and (
        len(got_shape) != len(shape)
        or any(w is not None and w != g for w, g in zip(shape, got_shape))
    ):
        want_text = "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"
        problem = f"shape {list(got_shape)}, expected {want_text}"
    if problem:
        kernel = f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
        out = node.outputs[index] if index < len(node.outputs) else None
        name = out.name if out is not None else "?"
        raise KernelError(
            f"{device}: kernel {kernel} returned output {index} of node {node.name!r} "
            f"({node.qualified_op}) with {problem}, as the graph declares {name!r} (the "
            "model's own value_info or outputs, or shape inference). Either the kernel or the "
            "model's declaration is wrong: fix the kernel, or the declaration in the model; "
            "anychip never broadcasts a result into a declared shape. The check is off with "
            "anychip.load(..., check_kernels=False)"
        )


def _same_strings(want: np.dtype, got: np.dtype) -> bool:
    return want.kind in "OUS" and got.kind in "OUS"
