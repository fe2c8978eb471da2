"""Scan: iterate a body graph over slices of the scan inputs, carrying state.

Opset 8 has a leading batch axis on every state and scan input (scan axis 1) and an optional
``sequence_lens``; opset 9 and later drop the batch axis and add per-input and per-output
axes and directions. Both share ``_scan_one``, which runs one (unbatched) scan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from anychip.backends.cpu.kernels._scan_vector import run_batched
from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError, ModelError
from anychip.ir.graph import Graph

__all__ = ["scan_8", "scan_9"]


def _norm_axis(axis: int, rank: int, what: str) -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"Scan: {what} axis {axis} is out of range for rank {rank}")
    return axis % rank


def _scan_one(
    ctx: KernelContext,
    body: Graph,
    states: list[Any],
    scan_inputs: list[np.ndarray],
    in_axes: Sequence[int],
    in_dirs: Sequence[int],
    out_axes: Sequence[int],
    out_dirs: Sequence[int],
    length: int | None = None,
) -> list[Any]:
    """Run one scan; returns final states then stacked scan outputs."""
    n_state = len(states)
    n_out = len(body.outputs) - n_state
    if n_out < 0 or len(body.inputs) != n_state + len(scan_inputs):
        raise ModelError(
            f"Scan: the body takes {len(body.inputs)} inputs and returns {len(body.outputs)} "
            f"outputs for {n_state} states and {len(scan_inputs)} scan inputs"
        )
    axes = [_norm_axis(a, x.ndim, "scan input") for a, x in zip(in_axes, scan_inputs)]
    lengths = {x.shape[a] for a, x in zip(axes, scan_inputs)}
    if len(lengths) > 1:
        raise KernelError(f"Scan: scan inputs have different sequence lengths {sorted(lengths)}")
    seq_len = lengths.pop() if lengths else 0
    if length is not None:
        seq_len = min(seq_len, length)
    elif seq_len > 1:
        done = run_batched(ctx, body, states, scan_inputs, axes, in_dirs, out_axes, out_dirs)
        if done is not None:
            return done
    collected: list[list[Any]] = [[] for _ in range(n_out)]
    for t in range(seq_len):
        slices = []
        for x, a, d in zip(scan_inputs, axes, in_dirs):
            slices.append(np.take(x, seq_len - 1 - t if d else t, axis=a))
        outs = ctx.run_graph(body, [*states, *slices])
        states = list(outs[:n_state])
        for k in range(n_out):
            collected[k].append(np.asarray(outs[n_state + k]))
    results = list(states)
    for k in range(n_out):
        elems = collected[k]
        if out_dirs[k]:
            elems = elems[::-1]
        if not elems:
            bv = body.outputs[n_state + k]
            inner = tuple(d if isinstance(d, int) else 0 for d in (bv.shape or ()))
            elems_arr = np.zeros((0, *inner), dtype=bv.dtype.numpy if bv.dtype else np.float32)
            results.append(elems_arr)
            continue
        ax = _norm_axis(out_axes[k], elems[0].ndim + 1, "scan output")
        results.append(np.stack(elems, axis=ax))
    return results


def _per_input(values: Sequence[int] | None, n: int, name: str) -> list[int]:
    if values is None:
        return [0] * n
    values = list(values)
    if len(values) != n:
        raise ModelError(f"Scan: attribute {name} has {len(values)} entries, expected {n}")
    return values


@kernel("Scan", since=8, context=True)
def scan_8(
    ctx: KernelContext,
    sequence_lens: Any,
    *inputs: Any,
    body: Graph,
    num_scan_inputs: int,
    directions: Sequence[int] | None = None,
) -> tuple:
    n_state = len(inputs) - num_scan_inputs
    states, scans = list(inputs[:n_state]), [np.asarray(x) for x in inputs[n_state:]]
    n_out = len(body.outputs) - n_state
    in_dirs = _per_input(directions, num_scan_inputs, "directions")
    batch = (states[0] if states else scans[0]).shape[0]
    lens = (
        np.asarray(sequence_lens).reshape(-1)
        if sequence_lens is not None
        else np.full(batch, scans[0].shape[1] if scans else 0)
    )
    per_batch = []
    for b in range(batch):
        per_batch.append(
            _scan_one(
                ctx,
                body,
                [s[b] for s in states],
                [x[b] for x in scans],
                [0] * num_scan_inputs,
                in_dirs,
                [0] * n_out,
                [0] * n_out,
                length=int(lens[b]),
            )
        )
    results = []
    for k in range(n_state):
        results.append(np.stack([r[k] for r in per_batch]))
    for k in range(n_out):
        outs = [r[n_state + k] for r in per_batch]
        longest = max(o.shape[0] for o in outs)
        # Shorter sequences leave their tail positions zero.
        padded = []
        for o in outs:
            if o.shape[0] < longest:
                pad = np.zeros((longest - o.shape[0], *o.shape[1:]), dtype=o.dtype)
                o = np.concatenate([o, pad])
            padded.append(o)
        results.append(np.stack(padded))
    return tuple(results)


@kernel("Scan", since=9, context=True)
def scan_9(
    ctx: KernelContext,
    *inputs: Any,
    body: Graph,
    num_scan_inputs: int,
    scan_input_axes: Sequence[int] | None = None,
    scan_input_directions: Sequence[int] | None = None,
    scan_output_axes: Sequence[int] | None = None,
    scan_output_directions: Sequence[int] | None = None,
) -> tuple:
    n_state = len(inputs) - num_scan_inputs
    if n_state < 0:
        raise ModelError(
            f"Scan: num_scan_inputs={num_scan_inputs} exceeds the {len(inputs)} inputs"
        )
    n_out = len(body.outputs) - n_state
    return tuple(
        _scan_one(
            ctx,
            body,
            list(inputs[:n_state]),
            [np.asarray(x) for x in inputs[n_state:]],
            _per_input(scan_input_axes, num_scan_inputs, "scan_input_axes"),
            _per_input(scan_input_directions, num_scan_inputs, "scan_input_directions"),
            _per_input(scan_output_axes, n_out, "scan_output_axes"),
            _per_input(scan_output_directions, n_out, "scan_output_directions"),
        )
    )
