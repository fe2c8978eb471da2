"""TreeEnsembleClassifier and TreeEnsembleRegressor (ai.onnx.ml), vectorised.

The trees are compiled once per node into flat arrays (feature, threshold, rule, true and
false child of every node, as global indices); then all rows walk all trees at once, one
numpy step per tree level: ``idx`` of shape ``[rows, trees]`` moves to a child until every
entry sits on a leaf. Leaves carry a dense ``[leaves, targets]`` weight table, so scores are
one gather and a sum over trees. Where a C compiler is found, the walk and the sum run in C
(``backends/cpu/native/tree_ensemble.c``: a loop per row and tree, as onnxruntime's), else
in numpy. Semantics follow onnx's reference evaluator (and so
onnxruntime): NaN goes the way ``nodes_missing_value_tracks_true`` says, the ``*_as_tensor``
attributes (LightGBM exports, double thresholds) replace their float lists, base values are
added after aggregation, and the binary classifier with one class column is completed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from anychip.backends.cpu import native
from anychip.backends.cpu.kernels._ml_common import ML, compiled, labels_of, post_transform
from anychip.backends.cpu.table import kernel
from anychip.core.run.kernel_call import KernelContext
from anychip.errors import KernelError

__all__ = [
    "tree_ensemble_classifier",
    "tree_ensemble_regressor",
    "regressor_forest",
    "classifier_forest",
    "finish_regressor",
    "finish_classifier",
]

_RULES = {"BRANCH_LEQ": 0, "BRANCH_LT": 1, "BRANCH_GTE": 2, "BRANCH_GT": 3, "BRANCH_EQ": 4}
_RULES["BRANCH_NEQ"] = 5
_LEAF = 6
#: numpy's image of native/tree_ensemble.c's ``packed_node`` (aligned: 24 bytes).
_PACKED = np.dtype(
    [("threshold", "f8"), ("feature", "i4"), ("true", "i4"), ("false", "i4")]
    + [("rule", "i1"), ("missing", "u1")],
    align=True,
)
#: Walks (rows x trees) below which the native walk stays on one thread.
_THREAD_WALKS = 16384
#: Rows walked at once: bounds the ``[rows, trees]`` temporaries.
_CHUNK = 4096


class _Forest:
    """The compiled trees of one node."""

    def __init__(self, a: dict[str, Any], prefix: str) -> None:
        tids = np.asarray(a["nodes_treeids"], np.int64)
        nids = np.asarray(a["nodes_nodeids"], np.int64)
        n = len(tids)
        index = {(int(t), int(i)): k for k, (t, i) in enumerate(zip(tids.tolist(), nids.tolist()))}
        modes = a["nodes_modes"]
        if isinstance(modes, np.ndarray):
            modes = modes.tolist()
        try:
            self.rule = np.array([_LEAF if m == "LEAF" else _RULES[m] for m in modes], np.int8)
        except KeyError as e:
            raise KernelError(f"TreeEnsemble: unsupported node mode {e.args[0]!r}") from None
        values = a.get("nodes_values_as_tensor")
        if values is None:
            values = a.get("nodes_values")
        self.threshold = np.asarray(values if values is not None else np.zeros(n), np.float64)
        self.feature = np.asarray(a["nodes_featureids"], np.int64)
        missing = a.get("nodes_missing_value_tracks_true")
        self.missing = np.asarray(missing if missing else np.zeros(n), bool)
        self.missing_u8 = self.missing.astype(np.uint8)
        leaf = self.rule == _LEAF

        def child(ids: str) -> np.ndarray:
            out = np.arange(n)
            for k in np.nonzero(~leaf)[0]:
                target = (int(tids[k]), int(a[ids][k]))
                if target not in index:
                    raise KernelError(f"TreeEnsemble: node {target} is referenced but not defined")
                out[k] = index[target]
            return out

        self.true, self.false = child("nodes_truenodeids"), child("nodes_falsenodeids")
        self.trees = sorted(set(tids.tolist()))
        first = {}
        for k, t in enumerate(tids.tolist()):
            first.setdefault(t, k)
        self.roots = np.array([first[t] for t in self.trees], np.int64)
        self.depth = _depth(self.true, self.false, leaf, self.roots)
        weights = a.get(f"{prefix}_weights_as_tensor")
        if weights is None:
            weights = a[f"{prefix}_weights"]
        targets = np.asarray(a[f"{prefix}_ids"], np.int64)
        self.targets = targets
        self.n_out = int(targets.max()) + 1 if targets.size else 0
        leaf_of = np.array(
            [
                index[(int(t), int(i))]
                for t, i in zip(a[f"{prefix}_treeids"], a[f"{prefix}_nodeids"])
            ],
            np.int64,
        )
        self.leaf_of = leaf_of
        self.weights = np.asarray(weights, np.float64)
        self._tables: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self._pointers: tuple | None = None
        self._calls: dict[tuple, Any] = {}
        #: The attribute settings a kernel reads on every call, parsed on the first.
        self.settings: tuple | None = None
        self._packed: tuple | None = None
        self.max_feature = int(self.feature.max()) if self.feature.size else -1
        self.base: np.ndarray | None = None  # set by the kernel once

    def check(self, x: np.ndarray, op: str) -> None:
        if self.max_feature >= x.shape[1]:
            raise KernelError(
                f"{op}: the trees read feature {self.max_feature} but the input has "
                f"{x.shape[1]} features"
            )

    def table(self, width: int, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
        """``[nodes, width]`` leaf weights in ``dtype`` and a mask of the entries a leaf
        sets (cached per width and type)."""
        key = (width, dtype)
        if key not in self._tables:
            n = len(self.rule)
            w, has = np.zeros((n, width)), np.zeros((n, width), bool)
            np.add.at(w, (self.leaf_of, self.targets), self.weights)
            has[self.leaf_of, self.targets] = True
            self._tables[key] = (np.ascontiguousarray(w, dtype=dtype), has)
        return self._tables[key]

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """``[rows, trees]`` global indices of the leaf each row reaches in each tree."""
        lib = native.library()
        if lib is not None:
            return self._native_leaves(lib, x)
        rows = np.arange(x.shape[0])[:, None]
        idx = np.broadcast_to(self.roots, (x.shape[0], len(self.roots))).copy()
        for _ in range(self.depth):
            v = x[rows, self.feature[idx]]
            t = self.threshold[idx]
            r = self.rule[idx]
            go = np.select(
                [r == 0, r == 1, r == 2, r == 3, r == 4],
                [v <= t, v < t, v >= t, v > t, v == t],
                default=v != t,
            )
            go = np.where(np.isnan(v), self.missing[idx], go)
            idx = np.where(r == _LEAF, idx, np.where(go, self.true[idx], self.false[idx]))
        return idx

    def pointers(self, ffi: Any) -> tuple:
        """cffi pointers to the node arrays, made once (the arrays live as long as the forest)."""
        if self._pointers is None:
            arrays = (self.feature, self.threshold, self.rule, self.true, self.false)
            arrays += (self.missing_u8, self.roots)
            types = ("int64_t *", "double *", "int8_t *", "int64_t *", "int64_t *")
            types += ("uint8_t *", "int64_t *")
            self._pointers = tuple(_pointer(ffi, a, t) for a, t in zip(arrays, types))
        return self._pointers

    def records(self) -> tuple[np.ndarray, int]:
        """The nodes as ``packed_node`` records (``_PACKED``) and whether every branch is
        BRANCH_LEQ."""
        nodes = np.zeros(len(self.rule), _PACKED)
        nodes["threshold"], nodes["feature"] = self.threshold, self.feature
        nodes["true"], nodes["false"] = self.true, self.false
        nodes["rule"], nodes["missing"] = self.rule, self.missing_u8
        return nodes, int(bool(np.all((self.rule == 0) | (self.rule == _LEAF))))

    def packed(self, ffi: Any) -> tuple[Any, int]:
        """The nodes as one packed record each (``tree_packed_sum_*``'s ``packed_node``) and
        whether every branch is BRANCH_LEQ; made once."""
        if self._packed is None:
            nodes, all_leq = self.records()
            self._packed = (nodes, ffi.cast("packed_node *", ffi.from_buffer(nodes)), all_leq)
        return self._packed[1], self._packed[2]

    def native_sum(self, lib: Any, x: np.ndarray, table: np.ndarray) -> np.ndarray:
        """Walk and sum in one C pass: ``[rows, width]`` in the table's type."""
        key = (table.shape[1], table.dtype.type)
        call = self._calls.get(key)
        if call is None:
            call = self._calls[key] = self._native_call(lib, table)
        return call(x)

    def _native_call(self, lib: Any, table: np.ndarray) -> Any:
        """The C walk-and-sum over ``table`` as a callable of ``x``, everything but ``x`` and
        the output bound once (its pointers, counts and flags cost more than a small walk)."""
        ffi, work = native.ffi(), table.dtype.type
        f32 = work is np.float32
        ctype, width, trees = ("float[]" if f32 else "double[]"), table.shape[1], len(self.roots)
        tp = _pointer(ffi, table, "float *" if f32 else "double *")  # table: in self._tables
        from_buffer, empty = ffi.from_buffer, np.empty
        if len(self.rule) < 2**31 and self.max_feature < 2**31:
            nodes, all_leq = self.packed(ffi)
            roots, packed_sum, f64 = self.pointers(ffi)[-1], lib.tree_packed_sum, 0 if f32 else 1

            def call(x: np.ndarray) -> np.ndarray:
                if type(x) is not np.ndarray or x.dtype != work or not x.flags.c_contiguous:
                    x = np.ascontiguousarray(x, dtype=work)
                rows = x.shape[0]
                out = empty((rows, width), work)
                xp, op = from_buffer(ctype, x), from_buffer(ctype, out)
                threads = _threads(rows * trees)
                packed_sum(
                    f64, xp, rows, x.shape[1], nodes, roots, trees, all_leq, tp, width, op, threads
                )
                return out

            return call
        walk, pointers = (lib.tree_sum_f32 if f32 else lib.tree_sum_f64), self.pointers(ffi)

        def call_flat(x: np.ndarray) -> np.ndarray:
            x = np.ascontiguousarray(x, dtype=work)
            out = empty((x.shape[0], width), work)
            xp, op = from_buffer(ctype, x), from_buffer(ctype, out)
            walk(xp, x.shape[0], x.shape[1], *pointers, trees, tp, width, op)
            return out

        return call_flat

    def _native_leaves(self, lib: Any, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        out = np.empty((x.shape[0], len(self.roots)), np.int64)
        ffi = native.ffi()
        f, th, rule, t, fa, miss, roots = self.pointers(ffi)
        walk = lib.tree_leaves_f64 if x.dtype == np.float64 else lib.tree_leaves_f32
        ctype = "double[]" if x.dtype == np.float64 else "float[]"
        xp, op = ffi.from_buffer(ctype, x), ffi.from_buffer("int64_t[]", out)
        walk(xp, x.shape[0], x.shape[1], f, th, rule, t, fa, miss, roots, len(self.roots), op)
        return out


def _threads(walks: int) -> int:
    """Threads for ``walks`` (row, tree) walks: one below ``_THREAD_WALKS`` (starting a
    thread costs about as much as 2000 walks), else one per usable core up to 8
    (``ANYCHIP_NATIVE_THREADS`` caps it), as onnxruntime's tree kernel splits its rows."""
    if walks < _THREAD_WALKS:
        return 1
    cap = os.environ.get("ANYCHIP_NATIVE_THREADS", "")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, 8, int(cap) if cap.isdigit() else 8))


def _pointer(ffi: Any, a: np.ndarray, ctype: str) -> Any:
    return ffi.cast(ctype, ffi.from_buffer(a))


def _depth(true: np.ndarray, false: np.ndarray, leaf: np.ndarray, roots: np.ndarray) -> int:
    """The number of steps from the roots to the deepest leaf (a cycle is refused)."""
    level, depth = roots, 0
    while True:
        level = level[~leaf[level]]
        if level.size == 0:
            return depth
        depth += 1
        if depth > len(leaf):
            raise KernelError("TreeEnsemble: the trees have a cycle")
        level = np.unique(np.concatenate([true[level], false[level]]))


def _base(forest: _Forest, a: dict[str, Any]) -> np.ndarray | None:
    """The base values as a ``[1, width]`` float64 row (converted once per node), or None."""
    if forest.base is None:
        base = a.get("base_values_as_tensor")
        base = a.get("base_values") if base is None else base
        has = base is not None and len(base)
        forest.base = np.asarray(base, np.float64).reshape(1, -1) if has else np.zeros((0, 0))
    return forest.base if forest.base.size else None


def _work(x: np.ndarray) -> type:
    return np.float64 if x.dtype == _F64 else np.float32


_F32, _F64 = np.dtype(np.float32), np.dtype(np.float64)


def _as_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype != _F32 and x.dtype != _F64:
        x = x.astype(np.float32)
    if x.ndim == 2:
        return x
    return x.reshape(1, -1) if x.ndim == 1 else x.reshape(x.shape[0], -1)


def _sum_scores(forest: _Forest, x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Leaf weights summed over trees in tree order, in float32 for float32 input (as
    onnxruntime: the order and precision decide exact ties between classes)."""
    work = table.dtype.type
    lib = native.library()
    if lib is not None and x.dtype == work:
        return forest.native_sum(lib, x, table)
    out = np.empty((x.shape[0], table.shape[1]), work)
    for start in range(0, x.shape[0], _CHUNK):
        idx = forest.leaves(x[start : start + _CHUNK])
        acc = np.zeros((idx.shape[0], table.shape[1]), work)
        for t in range(idx.shape[1]):
            acc += table[idx[:, t]]
        out[start : start + _CHUNK] = acc
    return out


def regressor_forest(ctx: KernelContext, a: dict[str, Any]) -> _Forest:
    """The node's compiled trees, with ``settings``: (width, aggregate, post transform)."""
    forest: _Forest = compiled(ctx, lambda: _Forest(a, "target"))
    if forest.settings is None:
        forest.settings = (
            int(a.get("n_targets") or forest.n_out),
            a.get("aggregate_function") or "SUM",
            a.get("post_transform") or "NONE",
        )
    return forest


def classifier_forest(ctx: KernelContext, a: dict[str, Any]) -> _Forest:
    """The node's compiled trees, with ``settings``: (int labels, string labels, classes,
    post transform, one class column written, table width)."""
    forest: _Forest = compiled(ctx, lambda: _Forest(a, "class"))
    if forest.settings is None:
        ints, strings = a.get("classlabels_int64s"), a.get("classlabels_strings")
        n_classes = max(len(ints or []), len(strings or []))
        one_column = len(set(forest.targets.tolist())) == 1
        transform = a.get("post_transform") or "NONE"
        forest.settings = (ints, strings, n_classes, transform, one_column)
        forest.settings += (max(n_classes, forest.n_out),)
    return forest


@kernel("TreeEnsembleRegressor", domain=ML, since=1, context=True)
def tree_ensemble_regressor(ctx: KernelContext, x: np.ndarray, **a: Any) -> np.ndarray:
    forest = regressor_forest(ctx, a)
    x = _as_rows(x)
    forest.check(x, "TreeEnsembleRegressor")
    width, agg, _ = forest.settings
    if agg in ("SUM", "AVERAGE"):
        table, _ = forest.table(width, _work(x))
        res = _sum_scores(forest, x, table)
    elif agg in ("MIN", "MAX"):
        table, has = forest.table(width)
        res = np.empty((x.shape[0], width))
        pick = np.min if agg == "MIN" else np.max
        fill = np.finfo(x.dtype).max if agg == "MIN" else np.finfo(x.dtype).min
        for start in range(0, x.shape[0], _CHUNK):
            idx = forest.leaves(x[start : start + _CHUNK])
            vals = np.where(has[idx], table[idx], fill)
            res[start : start + _CHUNK] = pick(vals, axis=1)
    else:
        raise KernelError(f"TreeEnsembleRegressor: aggregate_function {agg!r} is not supported")
    return finish_regressor(forest, a, res, x)


def finish_regressor(forest: _Forest, a: dict, res: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The regressor's scores from ``res``, its trees' aggregate (written in place): float32
    whatever the input's type (the schema's ``Y: tensor(float)``; onnxruntime refuses a double
    output, and sums a double input's scores in double before the cast, as here)."""
    _, agg, transform = forest.settings
    if agg == "AVERAGE":
        res /= len(forest.trees)
    base = _base(forest, a)
    if base is not None:
        res += base
    res = post_transform(res, transform)
    return res if res.dtype == _F32 else res.astype(_F32)


@kernel("TreeEnsembleClassifier", domain=ML, since=1, context=True)
def tree_ensemble_classifier(
    ctx: KernelContext, x: np.ndarray, **a: Any
) -> tuple[np.ndarray, np.ndarray]:
    forest = classifier_forest(ctx, a)
    x = _as_rows(x)
    forest.check(x, "TreeEnsembleClassifier")
    table, _ = forest.table(forest.settings[5], _work(x))
    return finish_classifier(forest, a, _sum_scores(forest, x, table))


def finish_classifier(
    forest: _Forest, a: dict, sums: np.ndarray, labels: bool = True
) -> tuple[np.ndarray | None, np.ndarray]:
    """The classifier's labels (None without ``labels``) and scores from its trees' sums."""
    ints, strings, n_classes, transform, one_column, _ = forest.settings
    res = sums[:, :n_classes]
    base = _base(forest, a)
    if base is not None:
        res += base
    res = res.astype(np.float32)
    if one_column:  # binary: one class column was written
        if res.shape[1] == 1:
            res = np.concatenate([np.zeros_like(res), res], axis=1)
        else:
            res[:, 1] = res[:, 0]
        res[:, 0] = 1 - res[:, 1] if transform in ("NONE", "PROBIT") else -res[:, 1]
    scores = post_transform(res, transform).astype(np.float32, copy=False)
    if not labels:
        return None, scores
    best = np.argmax(scores, axis=1)
    if ints is not None and len(ints) == 1:
        return np.where(best == 1, ints[0], 0).astype(np.int64), scores
    return labels_of(best, ints, strings, "TreeEnsembleClassifier"), scores
