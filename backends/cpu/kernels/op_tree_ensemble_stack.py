"""``anychip::TreeEnsembleStack`` (``backends/cpu/passes/fuse_tree_stack.py``): the tree
ensembles of ``body`` run on ``X``, their scores reshaped and concatenated as the Reshape and
Concat nodes it replaces do; ``anychip::TreeEnsembleGroup`` (``passes/fuse_tree_group.py``):
the body's outputs (the ensembles' read outputs) as they are.

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
from anychip.core.run.kernel_call import KernelContext
from anychip.ir.graph import Graph
from anychip.opsets.schemas import ANYCHIP_DOMAIN

__all__ = ["tree_ensemble_stack", "tree_ensemble_group"]


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
        self._most_trees = int(self.counts.max())
        self._pointers: tuple | None = None
        self._tables: dict[type, tuple[np.ndarray, Any]] = {}

    def _constants(self, ffi: Any, work: type) -> tuple:
        """The pointers to the nodes, roots, tree counts and ``work``'s leaf table, made once
        (the arrays are held here, so the pointers stay valid)."""
        if self._pointers is None:
            self._pointers = (
                trees._pointer(ffi, self.nodes, "packed_node *"),
                trees._pointer(ffi, self.roots, "int64_t *"),
                trees._pointer(ffi, self.counts, "int64_t *"),
            )
        hit = self._tables.get(work)
        if hit is None:
            parts = [f.table(self.width, work)[0] for f, _, _ in self.members]
            t = np.ascontiguousarray(np.concatenate(parts), dtype=work)
            ctype = "float *" if work is np.float32 else "double *"
            hit = self._tables[work] = (t, trees._pointer(ffi, t, ctype))
        return self._pointers + (hit[1],)

    def sums(self, lib: Any, x: np.ndarray) -> np.ndarray:
        """``[ensembles, rows, width]``: each ensemble's trees summed in its own order (threads
        by one ensemble's walks, as its own kernel would take them)."""
        ffi, work = native.ffi(), x.dtype.type
        nodes, roots, counts, table = self._constants(ffi, work)
        ctype = "float[]" if work is np.float32 else "double[]"
        out = np.empty((len(self.members), x.shape[0], self.width), work)
        x = np.ascontiguousarray(x)
        lib.tree_packed_sum_groups(
            0 if work is np.float32 else 1,
            ffi.from_buffer(ctype, x),
            x.shape[0],
            x.shape[1],
            nodes,
            roots,
            counts,
            len(self.members),
            self.all_leq,
            table,
            self.width,
            ffi.from_buffer(ctype, out),
            trees._threads(x.shape[0] * self._most_trees),
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


def _finished(
    ctx: KernelContext, body: Graph, x: Any, labels: frozenset[int] = frozenset()
) -> list[Any] | None:
    """Per ensemble of ``body``, its outputs (a classifier's labels only for the ensembles
    in ``labels``) through the one C call; None when it does not apply (see the module
    docstring), the caller then runs the body."""
    lib = native.library()
    group = compiled(ctx, lambda: _group(ctx, body)) if lib is not None else None
    if group is None:
        return None
    rows = trees._as_rows(x)
    if rows.dtype != trees._work(rows) or group.max_feature >= rows.shape[1]:
        return None  # the kernels' own paths and errors
    sums = group.sums(lib, rows)
    return [
        (trees.finish_regressor(f, a, s, rows),)
        if regressor
        else trees.finish_classifier(f, a, s, labels=e in labels)
        for e, ((f, a, regressor), s) in enumerate(zip(group.members, sums))
    ]


@kernel("TreeEnsembleStack", domain=ANYCHIP_DOMAIN, since=1, context=True)
def tree_ensemble_stack(
    ctx: KernelContext, x: np.ndarray, *, body: Graph, shape: list[int], axis: int = 0
) -> np.ndarray:
    done = _finished(ctx, body, x)
    scores = ctx.run_graph(body, [x]) if done is None else [out[-1] for out in done]
    return np.concatenate([np.reshape(s, shape) for s in scores], axis=axis)


@kernel("TreeEnsembleGroup", domain=ANYCHIP_DOMAIN, since=1, context=True)
def tree_ensemble_group(ctx: KernelContext, x: np.ndarray, *, body: Graph) -> tuple:
    wanted = _wanted(ctx.node, body)
    done = _finished(ctx, body, x, wanted[1])
    if done is None:
        return tuple(ctx.run_graph(body, [x]))
    return tuple(done[e][i] for e, i in wanted[0])


def _wanted(node: Any, body: Graph) -> tuple[list[tuple[int, int]], frozenset[int]]:
    """Per body output, (its ensemble's position, its output index); and the ensembles whose
    labels are read (kept on the node)."""
    hit = node.meta.get("tree_group_outputs")
    if hit is None:
        where = [(body.nodes.index(w.producer), w.index) for w in body.outputs]
        classifier = "TreeEnsembleClassifier"
        labels = frozenset(e for e, i in where if i == 0 and body.nodes[e].op_type == classifier)
        hit = node.meta["tree_group_outputs"] = (where, labels)
    return hit
