"""``anychip::TreeEnsembleStack`` (``backends/cpu/passes/fuse_tree_stack.py``): the tree
ensembles of ``body`` run on ``X``, their scores reshaped and concatenated as the Reshape and
Concat nodes it replaces do.

Where the C library is there and every ensemble sums its trees (SUM or AVERAGE) into tables
of one width, all of them walk in one C call (``tree_packed_sum_groups``: each ensemble's
nodes and leaf table laid end to end, each summed exactly as its own call sums it), and each
ensemble's kernel finishes its own sums (``finish_regressor``, ``finish_classifier``: the
average, base values, post transform); else the body runs with the ensembles' own kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anychip.backends.cpu import native
from anychip.backends.cpu.kernels import op_ml_tree_ensemble as trees
from anychip.backends.cpu.kernels._ml_common import compiled
from anychip.backends.cpu.table import kernel
from anychip.core.kernel_call import KernelContext
from anychip.ir.graph import Graph
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["tree_ensemble_stack"]


class _Group:
    """The ensembles of one stack laid end to end for ``tree_packed_sum_groups``."""

    def __init__(self, members: list[tuple[Any, dict, bool]], width: int) -> None:
        self.members = members  # (forest, attributes, is a regressor)
        self.width = width
        forests = [f for f, _, _ in members]
        offsets = np.cumsum([0] + [len(f.rule) for f in forests])
        records = []
        all_leq = 1
        for f, off in zip(forests, offsets):
            r, leq = f.records()
            r["true"] += off
            r["false"] += off
            records.append(r)
            all_leq &= leq
        self.nodes = np.concatenate(records)
        self.all_leq = all_leq
        self.roots = np.concatenate([f.roots + off for f, off in zip(forests, offsets)])
        self.counts = np.array([len(f.roots) for f in forests], np.int64)
        self.max_feature = max(f.max_feature for f in forests)
        self._tables: dict[type, np.ndarray] = {}

    def table(self, work: type) -> np.ndarray:
        t = self._tables.get(work)
        if t is None:
            parts = [f.table(self.width, work)[0] for f, _, _ in self.members]
            t = self._tables[work] = np.ascontiguousarray(np.concatenate(parts), dtype=work)
        return t

    def sums(self, lib: Any, x: np.ndarray) -> np.ndarray:
        """``[ensembles, rows, width]``: each ensemble's trees summed in its own order."""
        ffi, work = native.ffi(), x.dtype.type
        table = self.table(work)
        ctype = "float[]" if work is np.float32 else "double[]"
        out = np.empty((len(self.members), x.shape[0], self.width), work)
        x = np.ascontiguousarray(x)
        lib.tree_packed_sum_groups(
            0 if work is np.float32 else 1,
            ffi.from_buffer(ctype, x),
            x.shape[0],
            x.shape[1],
            ffi.cast("packed_node *", ffi.from_buffer(self.nodes)),
            ffi.cast("int64_t *", ffi.from_buffer(self.roots)),
            ffi.cast("int64_t *", ffi.from_buffer(self.counts)),
            len(self.members),
            self.all_leq,
            ffi.from_buffer(ctype, table),
            self.width,
            ffi.from_buffer(ctype, out),
            trees._threads(x.shape[0] * len(self.roots)),
        )
        return out


def _group(ctx: KernelContext, body: Graph) -> _Group | None:
    """The body's ensembles as one ``_Group``, or None when one of them does not sum its
    trees into a table of the common width (the body then runs as it is)."""
    members, widths = [], set()
    for ins in ctx.program(body).instrs:
        if ins.node.op_type == "TreeEnsembleRegressor":
            forest = trees.regressor_forest(ins.ctx, ins.attrs)
            width, agg, _ = forest.settings
            if agg not in ("SUM", "AVERAGE"):
                return None
            members.append((forest, ins.attrs, True))
        else:
            forest = trees.classifier_forest(ins.ctx, ins.attrs)
            width = forest.settings[5]
            members.append((forest, ins.attrs, False))
        widths.add(width)
    if len(widths) != 1 or sum(len(f.rule) for f, _, _ in members) >= 2**31:
        return None
    return _Group(members, widths.pop())


@kernel("TreeEnsembleStack", domain=ANYCHIP_DOMAIN, since=1, context=True)
def tree_ensemble_stack(
    ctx: KernelContext, x: np.ndarray, *, body: Graph, shape: list[int], axis: int = 0
) -> np.ndarray:
    lib = native.library()
    group = compiled(ctx, lambda: _group(ctx, body)) if lib is not None else None
    rows = trees._as_rows(x)
    if group is None or rows.dtype != trees._work(rows) or group.max_feature >= rows.shape[1]:
        scores = ctx.run_graph(body, [x])  # the kernels' own paths and errors
    else:
        sums = group.sums(lib, rows)
        scores = [
            trees.finish_regressor(f, a, s, rows)
            if regressor
            else trees.finish_classifier(f, a, s, labels=False)[1]
            for (f, a, regressor), s in zip(group.members, sums)
        ]
    return np.concatenate([np.reshape(s, shape) for s in scores], axis=axis)
