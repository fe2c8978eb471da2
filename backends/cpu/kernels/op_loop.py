"""Loop: a generic loop over a nested body graph with loop-carried values and scan outputs.

The body takes ``(iteration_num, condition, carried...)`` and returns
``(condition, carried..., scan_elements...)``. The trip count ``M`` and the condition input
are both optional. Without the condition input the body's condition output is ignored (the
spec's "for loop" form). With neither, the spec's pseudo-code never ends, so such a model is
reported as a model error up front instead of hanging. The iteration number and condition
go in as scalars, or as one-element 1-D tensors when the body declares them so (as
onnxruntime makes them: its fp16model_loop.onnx squeezes a ``[1]`` iteration number).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu.table import kernel
from anychip.core.run.program import KernelContext
from anychip.errors import KernelError, ModelError
from anychip.ir.graph import Graph

__all__ = ["loop"]


def _scalar(x: Any, what: str) -> Any:
    a = np.asarray(x)
    if a.size != 1:
        raise KernelError(f"Loop: {what} must be a scalar, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def _empty_scan_output(ctx: KernelContext, body: Graph, k: int, n_carried: int) -> np.ndarray:
    """The stacked scan output of a loop that ran zero times: shape (0, ...) of its dtype."""
    out_value = ctx.node.outputs[n_carried + k]
    body_value = body.outputs[1 + n_carried + k]
    dtype = out_value.dtype if out_value is not None and out_value.dtype else body_value.dtype
    if not dtype:
        raise KernelError(
            "Loop ran zero iterations and the element type of scan output "
            f"{k} is unknown; declare the body output's type in the model"
        )
    inner = body_value.shape or ()
    return np.zeros((0, *(d if isinstance(d, int) else 0 for d in inner)), dtype=dtype.numpy)


def _declared_rank_one(value: Any) -> tuple[int, ...]:
    return (1,) if value.shape is not None and len(value.shape) == 1 else ()


@kernel("Loop", since=1, context=True)
def loop(ctx: KernelContext, m: Any = None, cond: Any = None, *initial: Any, body: Graph) -> tuple:
    n_carried = len(initial)
    n_scan = len(body.outputs) - 1 - n_carried
    if n_scan < 0 or len(body.inputs) != 2 + n_carried:
        raise ModelError(
            f"Loop: the body takes {len(body.inputs)} inputs and returns {len(body.outputs)} "
            f"outputs, but the node passes {n_carried} loop-carried values; the body must "
            "take (iteration_num, cond, carried...) and return (cond, carried..., scans...)"
        )
    if m is None and cond is None:
        raise ModelError(
            "Loop: neither a trip count M nor a condition is given, so the loop never ends; "
            "give M or cond"
        )
    trip = int(_scalar(m, "the trip count M")) if m is not None else None
    keep_going = bool(_scalar(cond, "the condition")) if cond is not None else True
    carried = list(initial)
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    i = 0
    i_shape, cond_shape = (_declared_rank_one(v) for v in body.inputs[:2])
    while (trip is None or i < trip) and keep_going:
        step = np.full(i_shape, i, dtype=np.int64)
        outs = ctx.run_graph(body, [step, np.full(cond_shape, keep_going), *carried])
        if cond is not None:
            keep_going = bool(_scalar(outs[0], "the body's condition output"))
        carried = list(outs[1 : 1 + n_carried])
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        i += 1
    results: list[Any] = list(carried)
    for k in range(n_scan):
        if not scans[k]:
            results.append(_empty_scan_output(ctx, body, k, n_carried))
            continue
        try:
            results.append(np.stack([np.asarray(s) for s in scans[k]]))
        except ValueError as e:
            raise KernelError(
                f"Loop: scan output {k} changes shape across iterations "
                f"({sorted({np.shape(s) for s in scans[k]})}); every iteration must "
                "produce the same shape"
            ) from e
    return tuple(results)
